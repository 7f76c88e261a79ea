"""`runbus status`: every service's replicas, versions and per-endpoint stats from nats.micro
discovery (`$SRV.PING|INFO|STATS`), with what the processes not ready yet wait on and what the
degraded ones do without (their progress reports); `--ping <service>` is the health check of
one service, and with `--local` (and `--pid`) of the replica in this pod (or this process)
only."""

import argparse
import asyncio
import contextlib
import socket
import sys
from collections import Counter, defaultdict
from typing import Final

import msgspec
import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from .. import busauth, discovery, subjects
from ..discovery import EndpointSeen, Instance
from ..instance import HOST_METADATA, PID_METADATA
from ..messages.progress import SERVICE_PROGRESS_DECODER, ServiceProgress
from ..runner import process_credentials, redact_url
from ..settings import Settings
from ..supervisor import SERVICES as ALL_SERVICES
from ._common import Subparsers, stack_url

PROGRESS_WAIT: Final = 1.2
"""Seconds to hear the progress of processes not ready yet or degraded (they report every
second); heard while discovery collects its replies."""
DISCOVERY_WAIT: Final = 0.3
"""Seconds to collect replies: every replica answers, and nothing says how many there are."""
PING_WAIT: Final = 2.0
"""Seconds `--ping --local` waits at most for the replica it checks (it returns at that
replica's reply): longer than discovery, so a busy but live replica is not taken for hung."""


# What `runbus status --json` prints.


class EndpointStatus(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    """Endpoint name as the service registered it (`load`, `invoke-get_weather`)."""
    subject: str
    """Subject it answers on."""
    queue_group: str
    """Queue group the replicas share (the service name)."""
    requests: int
    """Requests received, summed over the replicas that answered discovery."""
    errors: int
    """Requests that ended in an error, summed over the replicas."""
    total_ms: float
    """Processing time of all those requests in milliseconds."""
    average_ms: float
    """Average processing time per answered request in milliseconds (0 with none), each
    measured from the request's arrival to its reply."""
    answered: int = 0
    """Requests answered, summed over the replicas (`requests` also counts those in flight)."""
    last_error: str = ""
    """The last error a replica answered with (`code: reason`), if any."""
    group: str = ""
    """The micro group the endpoint belongs to (`runbus.api`), or "" outside any."""


class Replica(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    """nats.micro instance id (new at every start)."""
    version: str
    """runbus version the replica runs."""
    ready: bool
    """Answered `$SRV.PING`: connected to NATS and subscribed."""
    started: str
    """When the replica started (UTC, ISO 8601), if it reported stats."""
    host: str
    """Host the replica runs on, if it reports one in its metadata."""
    pid: str = ""
    """Process id of the replica on its host, if it reports one in its metadata."""
    endpoints: list[EndpointStatus]
    """This replica's own endpoint stats."""


class ServiceStatus(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    """Service name (= its queue group)."""
    replicas: int
    """Replicas that answered discovery."""
    ready: int
    """Replicas that answered `$SRV.PING`."""
    versions: list[str]
    """Distinct versions the replicas run (two during a rolling update)."""
    description: str
    """What the service owns, as it describes itself."""
    endpoints: list[EndpointStatus]
    """Per-endpoint stats summed over the replicas."""
    instances: list[Replica]
    """Each replica on its own."""


class Status(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    """The NATS server(s) asked."""
    services: list[ServiceStatus]
    """Every runbus service (missing ones with 0 replicas), then any other micro service."""
    starting: list[ServiceProgress] = []
    """Processes not ready yet, each with its step and, while it waits, what is down."""
    degraded: list[ServiceProgress] = []
    """Ready processes that serve with a dependency down, each with the reason (naming the
    URL and the setting): a model server of one route, while the others still answer."""


def register(subparsers: Subparsers) -> None:
    status = subparsers.add_parser(
        "status", help="services, replicas, versions and endpoint stats ($SRV discovery)"
    )
    status.add_argument("--json", action="store_true", help="one JSON document")
    status.add_argument(
        "--ping",
        metavar="SERVICE",
        help="health check: exit 0 if a replica of SERVICE answers $SRV.PING, else 1",
    )
    status.add_argument(
        "--local",
        action="store_true",
        help="with --ping: only the replica on this host (pod, container) counts: the probe of "
        f"one replica (metadata {HOST_METADATA!r})",
    )
    status.add_argument(
        "--pid",
        type=int,
        help="with --ping --local: only the replica with this process id counts, for hosts "
        f"that run several (metadata {PID_METADATA!r})",
    )
    status.add_argument(
        "--wait",
        type=float,
        help=f"seconds to collect replies (default {DISCOVERY_WAIT}; with --ping --local, the "
        f"most it waits for this replica's reply, default {PING_WAIT})",
    )
    status.set_defaults(handler=handle)


SERVICES: Final = ALL_SERVICES
"""What discovery sees: every service, auth too (its account exports `$SRV` to the services')."""


async def handle(settings: Settings, args: argparse.Namespace) -> int:
    url = stack_url(settings)
    try:
        nc = await _connect_once(url, process_credentials(settings, busauth.MONITOR_USER))
    except (OSError, nats.errors.Error, TimeoutError) as exc:
        print(
            f"runbus status: cannot reach NATS at {redact_url(url)}: {exc}; is the stack "
            "running? (`runbus up`)",
            file=sys.stderr,
        )
        return 1
    try:
        if args.ping:
            local = args.local or args.pid is not None
            wait = args.wait if args.wait is not None else PING_WAIT if local else DISCOVERY_WAIT
            return await ping(nc, args.ping, wait=wait, local=local, pid=args.pid)
        wait = DISCOVERY_WAIT if args.wait is None else args.wait
        status, reports = await asyncio.gather(
            discover(nc, redact_url(url), wait=wait), progress_reports(nc, PROGRESS_WAIT)
        )
        status = with_progress(status, reports)
    finally:
        await nc.close()
    if args.json:
        print(msgspec.json.encode(status).decode())
    else:
        print(render(status))
    return exit_code(status)


def exit_code(status: Status) -> int:
    """1 when one of the services has no ready replica; a degraded one is ready (it answers,
    and its other routes may serve), so it alone does not fail the check."""
    missing = [s.name for s in status.services if s.name in SERVICES and s.ready == 0]
    return 1 if missing else 0


async def _connect_once(url: str, credentials: busauth.Credentials | None) -> NATS:
    """A connection that gives up at once: a health check must answer, not wait for NATS.
    It is the monitor's: discovery only."""

    async def quiet(_: Exception) -> None:
        pass  # the failure is reported once, by the caller

    return await nats.connect(
        # A cluster's URLs may come as one comma-separated list (compose.cluster.yaml).
        [part.strip() for part in url.split(",") if part.strip()],
        name="runbus-status",
        inbox_prefix=subjects.SERVICE_INBOX_PREFIX,
        **(
            {"user": credentials.user, "password": credentials.password}
            if credentials and not busauth.in_url(url)
            else {}
        ),
        connect_timeout=2,
        max_reconnect_attempts=1,
        reconnect_time_wait=0.1,
        error_cb=quiet,
    )


async def discover(nc: NATS, url: str, *, wait: float = DISCOVERY_WAIT) -> Status:
    """Ask every replica of every service for its ping, info and stats, all at once."""
    return summarise(url, await discovery.discover(nc, wait=wait))


async def progress_reports(nc: NATS, wait: float) -> list[ServiceProgress]:
    """The latest progress report of every process that is not plainly ready (starting,
    waiting, degraded, stopping), heard within `wait` seconds (they report every second)."""
    latest: dict[str, ServiceProgress] = {}

    async def on_report(msg: Msg) -> None:
        with contextlib.suppress(msgspec.DecodeError):
            report = SERVICE_PROGRESS_DECODER.decode(msg.data)
            latest[report.instance] = report

    subscription = await nc.subscribe(subjects.PROGRESS_ALL, cb=on_report)
    try:
        await asyncio.sleep(wait)
    finally:
        await subscription.unsubscribe()
    return sorted(
        (r for r in latest.values() if r.state != "ready"), key=lambda r: (r.service, r.instance)
    )


def with_progress(status: Status, reports: list[ServiceProgress]) -> Status:
    """`status` with the processes not ready yet and the degraded ones."""
    return msgspec.structs.replace(
        status,
        starting=[r for r in reports if r.state != "degraded"],
        degraded=[r for r in reports if r.state == "degraded"],
    )


def describe(report: ServiceProgress) -> str:
    """`memory (host:42) waiting: Qdrant at … (RUNBUS_QDRANT_URL): refused, try 3`."""
    if report.state == "degraded":
        return f"{report.service} ({report.instance}) degraded: {report.reason}"
    if report.state == "waiting":
        return (
            f"{report.service} ({report.instance}) not ready, waiting at {report.step!r}: "
            f"{report.reason} (try {report.attempt})"
        )
    return f"{report.service} ({report.instance}) {report.state}: {report.step}"


def _is_local(reply: discovery.Ping, host: str, pid: int | None) -> bool:
    return reply.host == host and (pid is None or reply.pid == str(pid))


async def ping(
    nc: NATS, service: str, *, wait: float, local: bool = False, pid: int | None = None
) -> int:
    """Exit code of a health check: 0 if a replica of `service` answers `$SRV.PING` within
    `wait` seconds — with `local`, the one on this host (and with this `pid`): a hung replica
    fails its own probe even while its siblings answer theirs."""
    host = socket.gethostname()
    subject = discovery.ping_subject(service)
    if not local:
        ready = await discovery.pings(nc, service, wait=wait)
        if not ready:
            print(f"{service}: no replica answers {subject}", file=sys.stderr)
            return 1
        print(f"{service}: {len(ready)} replica(s) ready")
        return 0
    where = f" on {host}" + (f" with pid {pid}" if pid is not None else "")
    if not await discovery.answers(
        nc, service, wait=wait, matches=lambda p: _is_local(p, host, pid)
    ):
        print(f"{service}: no replica{where} answers {subject} within {wait}s", file=sys.stderr)
        return 1
    print(f"{service}: the replica{where} is ready")
    return 0


def _endpoint(seen: EndpointSeen) -> EndpointStatus:
    total_ms = seen.processing_ns / 1e6
    return EndpointStatus(
        name=seen.name,
        subject=seen.subject,
        queue_group=seen.queue_group,
        group=seen.group,
        requests=seen.requests,
        errors=seen.errors,
        total_ms=round(total_ms, 3),
        average_ms=round(total_ms / seen.answered, 3) if seen.answered else 0.0,
        answered=seen.answered,
        last_error=seen.last_error,
    )


def _summed(endpoints: list[EndpointStatus]) -> EndpointStatus:
    answered = sum(e.answered for e in endpoints)
    total_ms = sum(e.total_ms for e in endpoints)
    return msgspec.structs.replace(
        endpoints[0],
        requests=sum(e.requests for e in endpoints),
        answered=answered,
        errors=sum(e.errors for e in endpoints),
        total_ms=round(total_ms, 3),
        average_ms=round(total_ms / answered, 3) if answered else 0.0,
        last_error=next((e.last_error for e in endpoints if e.last_error), ""),
    )


def _service(name: str, replicas: list[Replica], description: str) -> ServiceStatus:
    by_endpoint: dict[str, list[EndpointStatus]] = defaultdict(list)
    for replica in replicas:
        for endpoint in replica.endpoints:
            by_endpoint[endpoint.name].append(endpoint)
    return ServiceStatus(
        name=name,
        replicas=len(replicas),
        ready=sum(r.ready for r in replicas),
        versions=sorted({r.version for r in replicas if r.version}),
        description=description,
        endpoints=[_summed(by_endpoint[e]) for e in sorted(by_endpoint)],
        instances=replicas,
    )


def summarise(url: str, instances: list[Instance]) -> Status:
    """Group the replicas discovery saw by service: the runbus services first (missing ones
    with none), then any other micro service."""
    replicas: dict[str, list[Replica]] = defaultdict(list)
    description_of: dict[str, str] = {}
    for instance in instances:
        if instance.description:
            description_of[instance.name] = instance.description
        replicas[instance.name].append(
            Replica(
                id=instance.id,
                version=instance.version,
                ready=instance.ready,
                started=instance.started,
                host=instance.host,
                pid=instance.pid,
                endpoints=[_endpoint(e) for e in instance.endpoints],
            )
        )
    others = sorted(set(replicas) - set(SERVICES))
    return Status(
        url=url,
        services=[
            _service(name, replicas.get(name, []), description_of.get(name, ""))
            for name in (*SERVICES, *others)
        ],
    )


def render(status: Status) -> str:
    """A table for a person: one line per endpoint, the service on its first line."""
    header = (
        "SERVICE",
        "REPLICAS",
        "VERSION",
        "ENDPOINT",
        "SUBJECT",
        "REQUESTS",
        "ERRORS",
        "AVG MS",
    )
    rows: list[tuple[str, ...]] = []
    degraded = Counter(report.service for report in status.degraded)
    for service in status.services:
        replicas = f"{service.ready}/{service.replicas} ready" if service.replicas else "none"
        if degraded[service.name]:
            replicas += f", {degraded[service.name]} degraded"
        first = (service.name, replicas, ",".join(service.versions) or "-")
        if not service.endpoints:
            rows.append((*first, "-", "", "", "", ""))
        for index, e in enumerate(service.endpoints):
            lead = first if index == 0 else ("", "", "")
            rows.append(
                (
                    *lead,
                    e.name,
                    e.subject,
                    str(e.requests),
                    str(e.errors),
                    f"{e.average_ms:.2f}",
                )
            )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    right = {5, 6, 7}

    def line(row: tuple[str, ...]) -> str:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        return "  ".join(cells).rstrip()

    notes = [describe(report) for report in (*status.starting, *status.degraded)]
    return "\n".join([f"NATS {status.url}", line(header), *map(line, rows), *notes])
