"""Who is calling: the shared token verifier (the auth callout uses the same one)."""

from runbus.tokens import Principal, TokenVerifier

__all__ = ["Principal", "TokenVerifier"]
