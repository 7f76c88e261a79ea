"""What HTTP clients send: the body of `POST /v1/runs` and the bearer credential."""

import uuid
from typing import Annotated

import msgspec

from runbus.decoding import decode_untrusted
from runbus.errors import BadRequest, Unauthenticated
from runbus.messages import ChatMessage, Identifier


class StartRun(msgspec.Struct, frozen=True, kw_only=True):
    """Body of `POST /v1/runs`; becomes a `run.request` on `runbus.runs.<agent>`."""

    agent: Identifier
    """Name of the agent definition to run."""
    text: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    """What the user says (one user message); give this or `input`."""
    input: list[ChatMessage] | None = None
    """The new messages, as in `run.request`; give this or `text`."""
    session_id: Identifier | None = None
    """Conversation to continue; a new one when absent (`run.started` names it)."""
    run_id: Identifier | None = None
    """Caller-chosen run id: posting it again does not start a second run."""

    def message(self) -> str | list[ChatMessage]:
        if (self.text is None) == (self.input is None):
            raise BadRequest("give exactly one of `text` and `input`")
        return self.text if self.text is not None else self.input or []

    def session(self) -> str:
        return self.session_id or f"s-{uuid.uuid4().hex[:16]}"


_START_RUN_DECODER = msgspec.json.Decoder(StartRun)


def decode_start_run(body: bytes) -> StartRun:
    start = decode_untrusted(_START_RUN_DECODER, body, "run body")
    start.message()  # checks `text` xor `input` before anything is published
    return start


def bearer_token(authorization: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header: visible ASCII only, as a NATS
    connection can present it (anything else is refused before the bus is asked)."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or not all("!" <= c <= "~" for c in token):
        raise Unauthenticated("send `Authorization: Bearer <token>` (visible ASCII)")
    return token
