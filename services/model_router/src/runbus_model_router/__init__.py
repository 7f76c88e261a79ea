"""runbus model router: the one service that talks to model backends."""
