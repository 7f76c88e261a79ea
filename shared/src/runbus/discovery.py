"""`$SRV` discovery: who answers `$SRV.PING|INFO|STATS`, each replica's ping, info and stats
joined into one `Instance`; used by `runbus status`, its probes and the supervisor."""

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Any, Final, TypeVar

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from .instance import HOST_METADATA, PID_METADATA

SRV: Final = "$SRV"
GROUP_METADATA: Final = "group"
"""Endpoint metadata key naming its micro group (`$SRV.INFO` does not carry groups)."""
ANSWERED_DATA: Final = "answered"
"""Key of an endpoint's stats `data`: requests answered so far (`num_requests` counts them on
arrival, so it includes those in flight)."""

T = TypeVar("T")


def ping_subject(service: str | None = None) -> str:
    """`$SRV.PING` (every service) or `$SRV.PING.<service>` (its replicas)."""
    return f"{SRV}.PING" if service is None else f"{SRV}.PING.{service}"


# What nats.micro replicas answer (io.nats.micro.v1.*_response); unknown fields are ignored.


class _Identity(msgspec.Struct, frozen=True):
    id: str
    name: str
    version: str = ""
    metadata: dict[str, str] | None = None


class Ping(_Identity, frozen=True):
    """A replica's answer to `$SRV.PING`."""

    @property
    def host(self) -> str:
        return (self.metadata or {}).get(HOST_METADATA, "")

    @property
    def pid(self) -> str:
        return (self.metadata or {}).get(PID_METADATA, "")


class _EndpointInfo(msgspec.Struct, frozen=True):
    name: str
    subject: str
    queue_group: str = ""
    metadata: dict[str, str] | None = None


class _Info(_Identity, frozen=True):
    description: str | None = None
    endpoints: list[_EndpointInfo] | None = None


class _EndpointStats(msgspec.Struct, frozen=True):
    name: str
    subject: str
    queue_group: str = ""
    num_requests: int = 0
    num_errors: int = 0
    processing_time: int = 0
    last_error: str = ""
    data: dict[str, Any] | None = None

    @property
    def answered(self) -> int:
        """Requests answered; without a runbus count, all (as nats.micro counts)."""
        value = (self.data or {}).get(ANSWERED_DATA)
        return value if isinstance(value, int) else self.num_requests


class _Stats(_Identity, frozen=True):
    started: str = ""
    endpoints: list[_EndpointStats] | None = None


_PING: Final = msgspec.json.Decoder(Ping)
_INFO: Final = msgspec.json.Decoder(_Info)
_STATS: Final = msgspec.json.Decoder(_Stats)


class EndpointSeen(msgspec.Struct, frozen=True, kw_only=True):
    """One endpoint of one replica, with the numbers its `$SRV.STATS` reported (zeros when
    only its info arrived in time)."""

    name: str
    subject: str
    queue_group: str
    group: str
    """Its micro group (`runbus.api`), or "" outside any."""
    requests: int = 0
    """Requests received, including any in flight."""
    answered: int = 0
    """Requests answered (the ones `processing_ns` measures)."""
    errors: int = 0
    processing_ns: int = 0
    """Time from each answered request's arrival to its reply, summed."""
    last_error: str = ""


class Instance(msgspec.Struct, frozen=True, kw_only=True):
    """One replica as discovery saw it."""

    id: str
    """nats.micro instance id (new at every start)."""
    name: str
    """Service name."""
    version: str
    ready: bool
    """Answered `$SRV.PING`."""
    started: str
    """When it started (UTC, ISO 8601), if it reported stats."""
    host: str
    pid: str
    description: str
    endpoints: list[EndpointSeen]


async def collect(nc: NATS, subject: str, wait: float) -> list[bytes]:
    """Every reply to one request on `subject` that arrives within `wait` seconds."""
    replies: list[bytes] = []

    async def on_reply(msg: Msg) -> None:
        # A no-responders status (503, empty body) just means nobody is there.
        if msg.data:
            replies.append(msg.data)

    inbox = nc.new_inbox()
    subscription = await nc.subscribe(inbox, cb=on_reply)
    try:
        await nc.publish(subject, b"", reply=inbox)
        await asyncio.sleep(wait)
    finally:
        await subscription.unsubscribe()
    return replies


def _decode_all(replies: Iterable[bytes], decoder: msgspec.json.Decoder[T]) -> list[T]:
    decoded = []
    for data in replies:
        try:
            decoded.append(decoder.decode(data))
        except msgspec.DecodeError:
            continue  # not a micro reply; another client shares the subject
    return decoded


async def pings(nc: NATS, service: str | None = None, *, wait: float) -> list[Ping]:
    """Every replica (of `service`) that answers `$SRV.PING` within `wait` seconds."""
    return _decode_all(await collect(nc, ping_subject(service), wait), _PING)


async def discover(nc: NATS, *, wait: float) -> list[Instance]:
    """Ask every replica of every service for its ping, info and stats, all at once, and join
    the replies by instance id (sorted by service, then id)."""
    ping_data, info_data, stats_data = await asyncio.gather(
        collect(nc, f"{SRV}.PING", wait),
        collect(nc, f"{SRV}.INFO", wait),
        collect(nc, f"{SRV}.STATS", wait),
    )
    return from_replies(ping_data, info_data, stats_data)


def from_replies(
    ping_data: Iterable[bytes], info_data: Iterable[bytes], stats_data: Iterable[bytes]
) -> list[Instance]:
    """The replicas these `$SRV.PING`, `INFO` and `STATS` reply bodies speak of (a body that
    is not a micro reply is skipped)."""
    return join(
        _decode_all(ping_data, _PING),
        _decode_all(info_data, _INFO),
        _decode_all(stats_data, _STATS),
    )


def join(ping_replies: list[Ping], infos: list[_Info], stats: list[_Stats]) -> list[Instance]:
    """The replicas the three kinds of reply speak of, each with what they said."""
    identities: dict[str, _Identity] = {}
    for reply in (*ping_replies, *infos, *stats):
        identities.setdefault(reply.id, reply)
    ready = {p.id for p in ping_replies}
    info_of = {i.id: i for i in infos}
    stats_of = {s.id: s for s in stats}
    instances = []
    for instance_id, identity in identities.items():
        info, own = info_of.get(instance_id), stats_of.get(instance_id)
        metadata = next(
            (r.metadata for r in (identity, info, own) if r is not None and r.metadata), {}
        )
        version = next(
            (r.version for r in (identity, info, own) if r is not None and r.version), ""
        )
        instances.append(
            Instance(
                id=instance_id,
                name=identity.name,
                version=version,
                ready=instance_id in ready,
                started=own.started if own else "",
                host=metadata.get(HOST_METADATA, ""),
                pid=metadata.get(PID_METADATA, ""),
                description=(info.description or "") if info else "",
                endpoints=_endpoints(info, own),
            )
        )
    return sorted(instances, key=lambda i: (i.name, i.id))


def _endpoints(info: _Info | None, stats: _Stats | None) -> list[EndpointSeen]:
    group_of = {
        e.subject: (e.metadata or {}).get(GROUP_METADATA, "")
        for e in (info.endpoints or [] if info else [])
    }
    if stats is not None:
        return [
            EndpointSeen(
                name=e.name,
                subject=e.subject,
                queue_group=e.queue_group,
                group=group_of.get(e.subject, ""),
                requests=e.num_requests,
                answered=e.answered,
                errors=e.num_errors,
                processing_ns=e.processing_time,
                last_error=e.last_error,
            )
            for e in stats.endpoints or []
        ]
    # Answered the ping or info in time, not the stats: endpoints without numbers.
    return [
        EndpointSeen(
            name=e.name, subject=e.subject, queue_group=e.queue_group, group=group_of[e.subject]
        )
        for e in (info.endpoints or [] if info else [])
    ]


async def count_ready(nc: NATS, service: str, *, enough: int, wait: float) -> int:
    """How many replicas of `service` answer `$SRV.PING` within `wait` seconds (stops
    counting at `enough`)."""
    answered = 0
    done = asyncio.Event()

    def on_ping(_: Ping) -> bool:
        nonlocal answered
        answered += 1
        return answered >= enough

    await _first(nc, ping_subject(service), wait, on_ping, done)
    return answered


async def answers(nc: NATS, service: str, *, wait: float, matches: Callable[[Ping], bool]) -> bool:
    """Whether a replica of `service` whose ping `matches` answers within `wait` seconds
    (returns at the first)."""
    return await _first(nc, ping_subject(service), wait, matches, asyncio.Event())


async def _first(
    nc: NATS, subject: str, wait: float, enough: Callable[[Ping], bool], done: asyncio.Event
) -> bool:
    """Ping `subject`, handing each reply to `enough` until it says so or `wait` passes."""

    async def on_reply(msg: Msg) -> None:
        for reply in _decode_all([msg.data] if msg.data else [], _PING):
            if not done.is_set() and enough(reply):
                done.set()

    inbox = nc.new_inbox()
    subscription = await nc.subscribe(inbox, cb=on_reply)
    try:
        await nc.publish(subject, b"", reply=inbox)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), wait)
    finally:
        await subscription.unsubscribe()
    return done.is_set()
