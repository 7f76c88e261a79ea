"""runbus compaction service: decides how much of the history the model still sees."""
