"""Triggers and targets evaluated on the metrics of the groups a compaction still includes
(the rules are shared with the gateway: `runbus.compaction_triggers`)."""

from runbus.compaction_triggers import holds

__all__ = ["holds"]
