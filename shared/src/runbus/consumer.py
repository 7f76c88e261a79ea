"""One durable JetStream pull consumer for every work queue a service replica shares with its
siblings (the gateway's run queue, memory's writes).

It pulls one message per free slot (a busy replica leaves work to the others), tells JetStream
the message is in progress while its handler works, retries a failed handler with backoff (a
handler settles itself what must not be retried), opens a span per message, and outlives what
a cluster does to a pull for a moment (a consumer leader election answers 503 or has no
responders): it logs that and pulls again.
"""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Final

import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, ConsumerInfo
from opentelemetry.trace import SpanKind, Tracer

from .failures import handle_failure
from .telemetry import extract

PULL_WAIT: Final = 5.0
PULL_RETRY: Final = 0.5
"""Seconds before pulling again after the server could not answer a pull."""

log = structlog.get_logger()


def backoff(attempt: int) -> float:
    """Delay before delivery `attempt + 1`: 0.5 s, 1 s, 2 s, … capped at 30 s."""
    return float(min(30.0, 0.5 * 2 ** (attempt - 1)))


class Delivery:
    """One delivery of a message to a handler, settled at most once.

    A handler that returns without settling it has succeeded: the consumer acks.
    """

    def __init__(self, msg: Msg) -> None:
        self.msg = msg
        self.attempt = (msg.metadata.num_delivered or 1) if msg.metadata else 1
        self.settled = False

    @property
    def headers(self) -> dict[str, str]:
        return dict(self.msg.headers or {})

    async def ack(self) -> None:
        if not self.settled:
            self.settled = True
            await self.msg.ack()

    async def retry(self, delay: float) -> None:
        """Deliver it again (to any replica) after `delay` seconds."""
        if not self.settled:
            self.settled = True
            await self.msg.nak(delay=delay)

    async def term(self) -> None:
        """Never deliver it again: it can never succeed."""
        if not self.settled:
            self.settled = True
            await self.msg.term()

    def leave(self) -> None:
        """Neither ack nor nak: a later delivery of the same message holds it now (the server
        gave up on this one), and only that one may settle it."""
        self.settled = True

    async def in_progress(self) -> None:
        if not self.settled:
            await self.msg.in_progress()


Handler = Callable[[Delivery], Awaitable[None]]


@dataclass(frozen=True, kw_only=True)
class ConsumerSpec:
    """Where to pull from and how the server redelivers."""

    stream: str
    durable: str
    subject: str
    config: ConsumerConfig
    span_name: str
    """The span of each message, e.g. `process runbus.runs.{agent}`."""


class DurableConsumer:
    def __init__(
        self,
        nc: NATS,
        spec: ConsumerSpec,
        handler: Handler,
        *,
        tracer: Tracer,
        slots: asyncio.Semaphore,
    ) -> None:
        """`slots` bounds the messages in hand (a handler may lend its slot out meanwhile)."""
        self.nc = nc
        self.spec = spec
        self.handler = handler
        self.tracer = tracer
        self.slots = slots
        heartbeat = spec.config.ack_wait
        self.heartbeat = (heartbeat or 30.0) / 3
        self.pull_failures = 0
        """Pulls the server could not answer (elections, 503, no responders), for probes."""
        self._subscription: JetStreamContext.PullSubscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._handling: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        js = self.nc.jetstream()
        config = replace(
            self.spec.config, durable_name=self.spec.durable, filter_subject=self.spec.subject
        )
        try:
            # Create the consumer, or bring an existing one's settings (its ack wait) to this
            # replica's: `pull_subscribe` alone keeps an existing consumer as it was made.
            await js.add_consumer(self.spec.stream, config)
        except nats.js.errors.APIError as exc:
            log.warning("consumer_config_not_updated", consumer=self.spec.durable, error=str(exc))
        self._subscription = await js.pull_subscribe(
            self.spec.subject,
            durable=self.spec.durable,
            stream=self.spec.stream,
            config=self.spec.config,
        )
        self._task = asyncio.create_task(self._pull())

    @property
    def pending_msgs(self) -> int:
        """Messages delivered to this connection and not yet taken by a pull."""
        return self._subscription.pending_msgs if self._subscription is not None else 0

    async def consumer_info(self) -> ConsumerInfo:
        assert self._subscription is not None, "start() subscribes"
        return await self._subscription.consumer_info()

    async def stop_pulling(self) -> None:
        """Pull no more; what is in hand goes on (`cut_off` ends it)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._subscription is not None:
            # nats-py's pull subscription can keep one unfinished queue item (a late 408); a
            # connection drain would then wait out its whole timeout on it. The durable
            # consumer is server-side: unsubscribing loses nothing.
            with contextlib.suppress(Exception):
                await self._subscription.unsubscribe()

    async def cut_off(self) -> None:
        """Cut off the messages in hand (never acked, they are delivered again elsewhere) and
        wait until their handlers have unwound."""
        handling = list(self._handling)
        for task in handling:
            task.cancel()
        await asyncio.gather(*handling, return_exceptions=True)

    async def _pull(self) -> None:
        """One-message fetches return as soon as a message is there; a larger batch would
        make nats-py linger for the rest of the batch before handing over the first."""
        assert self._subscription is not None
        while True:
            await self.slots.acquire()
            try:
                messages = await self._subscription.fetch(1, timeout=PULL_WAIT)
            except nats.errors.TimeoutError:
                messages = []
            except (nats.errors.ConnectionClosedError, nats.errors.DrainTimeoutError):
                self.slots.release()
                return
            except nats.errors.Error as exc:
                # 503 or no responders during an election, a reconnect in progress, a consumer
                # being re-placed: the server could not answer this pull; the next one may.
                self.slots.release()
                self.pull_failures += 1
                log.warning("consumer_pull_failed", consumer=self.spec.durable, error=repr(exc))
                await asyncio.sleep(PULL_RETRY)
                continue
            except BaseException:
                self.slots.release()
                raise
            if not messages:
                self.slots.release()
                continue
            task = asyncio.create_task(self._handle(messages[0]))
            self._handling.add(task)
            task.add_done_callback(self._handling.discard)

    async def _handle(self, msg: Msg) -> None:
        delivery = Delivery(msg)
        try:
            with self.tracer.start_as_current_span(
                self.spec.span_name,
                context=extract(msg.headers),
                kind=SpanKind.CONSUMER,
                attributes={
                    "messaging.system": "nats",
                    "messaging.destination.name": msg.subject,
                    "messaging.operation.type": "process",
                    "messaging.consumer.group.name": self.spec.durable,
                    "runbus.attempt": delivery.attempt,
                },
            ) as span:
                heartbeat = asyncio.create_task(self._beat(delivery))
                try:
                    await self.handler(delivery)
                except Exception as exc:
                    handle_failure(
                        exc,
                        log,
                        "consumer_handler_failed",
                        span=span,
                        level="warning",
                        consumer=self.spec.durable,
                        attempt=delivery.attempt,
                    )
                    # Unsettled by its handler, a failure is worth another try.
                    await delivery.retry(backoff(delivery.attempt))
                finally:
                    heartbeat.cancel()
                await delivery.ack()
        except Exception:
            # Settling failed (the connection is going): unacked, it is delivered again.
            log.warning("consumer_settle_failed", consumer=self.spec.durable, exc_info=True)
        finally:
            self.slots.release()

    async def _beat(self, delivery: Delivery) -> None:
        """Tell JetStream the message is alive, so a long handler is not redelivered."""
        while True:
            await asyncio.sleep(self.heartbeat)
            with contextlib.suppress(Exception):
                await delivery.in_progress()
