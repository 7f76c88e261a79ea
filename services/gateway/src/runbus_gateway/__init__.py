"""runbus gateway: owns the run — authentication, the tool loop, events, checkpoints."""
