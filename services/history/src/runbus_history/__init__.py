"""runbus history service: chat history per session, stored on JetStream."""
