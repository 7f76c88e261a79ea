"""The run, without a bus, in the order a reader meets it: `execute` (the whole run in a page),
`admit`, `start`, `step`, `tools`, `settle`; what they share is `state` (`RunState`), saved by
`checkpoints`, told by `events`, with every hop through `ports` (`RunPorts`). Where tools come
from is `toolsets`, what context the model gets is `context`, and the compaction of each
step's prompt copy is `compaction`."""

from .execute import execute_run
from .ports import RunPorts
from .toolsets import OnWaiting

__all__ = ["OnWaiting", "RunPorts", "execute_run"]
