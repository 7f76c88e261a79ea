"""A client's consumer creation on the events stream, checked before JetStream sees it.

JetStream delivers a push consumer's messages onto whatever `deliver_subject` its creator
names, in the services' account: a cancel, a run request, a KV subject. The clients' account
therefore reaches consumer creation only through the auth service, which forwards a request
to JetStream when the consumer delivers into an inbox of the very user whose events it filters
(the client's permissions pin the filter to its own events), and refuses it otherwise.
"""

from collections.abc import Callable
from typing import Final

import msgspec

from runbus import subjects
from runbus.decoding import decode_untrusted
from runbus.errors import BadRequest
from runbus.tokens import Principal

_CHECK_API: Final = subjects.CONSUMER_CHECKS.split(".CONSUMER.")[0]
_EVENTS: Final = subjects.EVENTS_ALL.removesuffix(">").split(".")[:-1]
_RESPONSE_TYPE: Final = "io.nats.jetstream.api.v1.consumer_create_response"


class _Config(msgspec.Struct):
    deliver_subject: str | None = None


class _Create(msgspec.Struct):
    config: _Config | None = None


_DECODER: Final = msgspec.json.Decoder(_Create)


def forwarded(subject: str) -> str:
    """The JetStream API subject (under the auth account's import of it) of a checked one."""
    return subjects.CLIENT_JS_API + subject.removeprefix(_CHECK_API)


def refusal(subject: str, body: bytes, holder: Callable[[str], Principal | None]) -> str | None:
    """Why this creation may not reach JetStream (None: it may). `holder` names the user
    whose token an inbox prefix's digest is (`TokenVerifier.holder`)."""
    # CONSUMER.CREATE.<stream>.<name>.runbus.events.<tenant>.<user_id>...
    parts = subject.removeprefix(f"{_CHECK_API}.").split(".")
    head, filtered = parts[:3], parts[4:]
    if head != ["CONSUMER", "CREATE", subjects.EVENTS_STREAM] or (
        len(filtered) < len(_EVENTS) + 2 or filtered[: len(_EVENTS)] != _EVENTS
    ):
        return "only a consumer of one user's events, created with its filter, is forwarded"
    tenant, user_id = filtered[len(_EVENTS)], filtered[len(_EVENTS) + 1]
    try:
        request = decode_untrusted(_DECODER, body, "consumer creation")
    except BadRequest as exc:
        return exc.message
    deliver = request.config.deliver_subject if request.config else None
    if not deliver:
        return "a client's consumer delivers into the client's own inbox: set deliver_subject"
    tokens = deliver.split(".")
    inbox = len(tokens) > 2 and tokens[0] == subjects.CLIENT_INBOX_ROOT
    owner = holder(tokens[1]) if inbox and not {"", "*", ">"} & set(tokens) else None
    if owner is None or (owner.tenant, owner.user_id) != (tenant, user_id):
        return (
            f"deliver_subject {deliver[:200]!r} is not in an inbox of {tenant}/{user_id}, "
            "whose events the consumer reads"
        )
    return None


def refused(description: str) -> bytes:
    """JetStream's own shape of a refused creation (clients' JetStream libraries raise it)."""
    error = {"code": 403, "err_code": 10000, "description": description}
    return msgspec.json.encode({"type": _RESPONSE_TYPE, "error": error})


def unavailable(description: str) -> bytes:
    """JetStream's shape of a creation nobody could answer (a 503: try again later)."""
    error = {"code": 503, "err_code": 10039, "description": description}
    return msgspec.json.encode({"type": _RESPONSE_TYPE, "error": error})
