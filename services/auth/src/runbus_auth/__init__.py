"""runbus auth callout: a client's bearer token becomes a NATS user with that user's permissions."""
