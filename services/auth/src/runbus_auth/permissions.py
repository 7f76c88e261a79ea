"""What a client connection may do on the bus, by owner: NATS allow-lists, pure data.

A client publishes run requests and API calls (the gateway checks the token in each) and asks
who it is; it subscribes only to its own inbox prefix (secret: derived from its token); and it
may create JetStream consumers on the events stream only with a filter inside its own events
(the create subject names the filter, and the server refuses a body that disagrees with it) and
delivering into its own inbox (the auth service checks that before JetStream sees it). Nothing
else: no other inbox, no events subject, no internal subject, no KV bucket, stream or object
store.
"""

from runbus import subjects
from runbus.tokens import Principal

from .jwt import Permission, UserPermissions


def client_permissions(principal: Principal, token_digest: str) -> UserPermissions:
    inbox = subjects.client_inbox_prefix(token_digest)
    own_events = subjects.owner_events(principal.tenant, principal.user_id)
    return UserPermissions(
        pub=Permission(
            allow=[
                subjects.RUNS_ALL,
                subjects.API_ALL,
                subjects.AUTH_WHOAMI,
                subjects.consumer_create(
                    subjects.EVENTS_STREAM, own_events, subjects.CLIENT_JS_API
                ),
                # Flow-control replies of the ordered consumer reading those events.
                f"$JS.FC.{subjects.EVENTS_STREAM}.>",
            ]
        ),
        # Only the secret inbox: a reply another client steers somewhere (NATS cannot refuse a
        # reply subject) lands where nobody else can subscribe. Live events come through a
        # consumer delivering into it.
        sub=Permission(allow=[f"{inbox}.>"]),
    )
