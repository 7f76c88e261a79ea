"""Who a client connection is: the auth service's answer to `runbus.auth.whoami`."""

from ._base import Identifier, Message


class WhoAmI(Message, frozen=True, tag="auth.whoami"):
    """Asks which owner the `rb-auth` token of the request stands for."""


class Identity(Message, frozen=True, tag="auth.identity"):
    """The owner a token stands for, and the subjects its connection may use."""

    tenant: Identifier
    """Tenant of the token's user."""
    user_id: Identifier
    """The token's user."""
    inbox_prefix: str
    """Inbox prefix the connection must use (replies and consumer deliveries land there)."""
