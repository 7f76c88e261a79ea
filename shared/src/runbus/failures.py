"""What a boundary does with a failure: turn it into the typed error it answers with, record
it on the span (ERROR status, `error.type`) and log it once."""

from typing import Any, Final, Literal

import msgspec
import nats.errors
import nats.js.errors
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from .errors import BadRequest, DeadlineExceeded, InternalError, RunbusError, Unavailable

Level = Literal["info", "warning"]

NATS_OUTAGES: Final = (
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.FlushTimeoutError,
    nats.errors.UnexpectedEOF,
    nats.errors.NoServersError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.ServerError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.FetchTimeoutError,
)
"""What NATS or JetStream raise while they are briefly out of reach (a restart, a leader
election, a replica draining): `unavailable`, worth another try. Any other unexpected failure
is `internal`, a bug that trying again repeats."""


def as_runbus_error(exc: BaseException) -> RunbusError:
    """The typed error a failure becomes at a handler boundary."""
    match exc:
        case RunbusError():
            return exc
        case msgspec.ValidationError():
            return BadRequest(f"invalid request body: {exc}")
        case msgspec.DecodeError():
            return BadRequest(f"request body is not valid JSON: {exc}")
        case nats.errors.TimeoutError():
            # NATS or JetStream did not answer in time (e.g. during a leader election): worth
            # another try, unlike the run's own deadline passing.
            return Unavailable("NATS did not answer in time")
        case TimeoutError():
            return DeadlineExceeded("the run's deadline passed while handling the request")
        case _ if isinstance(exc, NATS_OUTAGES):
            return Unavailable(f"NATS is out of reach ({type(exc).__name__})")
        case _:
            return InternalError(f"internal error ({type(exc).__name__}); see the service log")


def handle_failure(
    exc: BaseException,
    log: Any,
    event: str,
    *,
    span: Span | None = None,
    level: Level = "info",
    **fields: Any,
) -> RunbusError:
    """The typed error `exc` becomes, recorded on `span` (else the current one) and logged
    once as `event` with `fields`: an internal error with its traceback at error level (it is
    a bug or an outage), any other at `level` with its code and reason (the caller's doing).

    `log` is a structlog logger (bound or not)."""
    error = as_runbus_error(exc)
    info = error.to_info()  # a forwarded error's code is the remote one
    span = span if span is not None else trace.get_current_span()
    if span.is_recording():
        span.set_status(Status(StatusCode.ERROR, error.message))
        span.set_attribute("error.type", info.code)
    if isinstance(error, InternalError):
        log.error(event, exc_info=exc, **fields)
    else:
        getattr(log, level)(event, code=info.code, reason=error.message, **fields)
    return error
