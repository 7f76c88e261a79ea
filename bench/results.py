"""What `make bench` measured, as typed records: one Struct per section, filled in by
bench/run.py from the sections that measure, read by bench/report/ and stored as
results.json. Dicts keyed by a number of clients, gateways or runs in flight use its string."""

from typing import Literal, assert_never

import msgspec


class Record(msgspec.Struct, kw_only=True):
    """Base of every result record. msgspec applies kw_only to a class's own fields only, so
    each record says it again (a required field may then follow a defaulted one)."""


class Machine(Record, kw_only=True):
    cpus: int | None
    cpu_model: str
    platform: str
    python: str
    memory_gb: float


class Meta(Record, kw_only=True):
    timestamp: str
    commit: str
    dirty: bool
    machine: Machine
    quick: bool
    loop: str
    completed_sections: list[str] = []
    """Sections that ran, in order; written before each section so a stopped run says so."""
    section_s: dict[str, float] = {}
    duration_s: float | None = None


class Latency(Record, kw_only=True):
    p50_ms: float
    p99_ms: float
    n: int


class Floor(Record, kw_only=True):
    """The physical floor: raw nats-py request/reply and a JetStream publish."""

    request_reply: Latency
    js_publish: Latency


class Hop(Record, kw_only=True):
    runbus: Latency
    """One `Bus.request` to a `Service`, next to the floor's raw round trip."""


class InProcessRun(Latency, kw_only=True):
    """The whole run with the services in the bench's own process."""

    hops_per_run: float
    events_per_run: float
    publishes_per_run: float
    spans_per_run: dict[str, float]
    cpu_ms_per_run: float
    runs_per_s: dict[str, float]


class ProcessCpu(Record, kw_only=True):
    """CPU ms per run of the six-process stack."""

    services: float
    nats_server: float
    client: float
    total: float
    by_process: dict[str, float]


class SequentialRun(Record, kw_only=True):
    """Runs one after another on the six-process stack."""

    p50_ms: float
    p99_ms: float
    n: int
    cpu_ms_per_run: ProcessCpu


class BusMessages(Record, kw_only=True):
    """Messages per run on the services' account, counted over `runs` runs of their own."""

    runs: int
    by_kind: dict[str, float]
    hops_by_subject: dict[str, float]
    kv_and_other_by_subject: dict[str, float]
    stored_by_stream: dict[str, float] = {}
    """Messages each stream stored per run (its last sequence moved by that much over the
    counted runs; a KV bucket is its stream `KV_<bucket>`): every one an acknowledged write,
    which with `sync_interval: always` is an fsync."""


class WholeRun(Record, kw_only=True):
    runbus: SequentialRun | None = None
    in_process: InProcessRun | None = None
    messages: BusMessages | None = None
    hops_per_run: float | None = None
    """Request/reply hops per run: the six processes' count when measured, else in process."""
    events_per_run: float | None = None


class RunCost(Record, kw_only=True):
    """An in-process system's run: latency one at a time, CPU, runs/s by clients."""

    n: int
    p50_ms: float
    p99_ms: float
    cpu_ms_per_run: float
    runs_per_s: dict[str, float]
    cpu_ms_per_run_by_clients: dict[str, float] = {}


class Maf(RunCost, kw_only=True):
    """The same agent on Microsoft Agent Framework, in process."""

    tool_calls_per_run: int
    model_calls_per_run: int


class AnchorPoint(RunCost, kw_only=True):
    """A LangGraph saver's run, its process and its database's CPU apart."""

    cpu_ms_by_process: dict[str, float] = {}


class Anchors(Record, kw_only=True):
    langgraph_memory: AnchorPoint | None = None
    langgraph_sqlite: AnchorPoint | None = None
    langgraph_postgres: AnchorPoint | None = None
    langgraph_postgres_skipped: str | None = None
    """Why no Postgres could start, when it could not."""


class ThroughputPoint(Record, kw_only=True):
    runs_per_s: float
    """The median round's."""
    trials: list[float]
    p50_ms: float
    p99_ms: float
    n: int
    cpu_ms_per_run: float | None = None


class ProcessResume(Record, kw_only=True):
    """A gateway process SIGKILLed mid-run and a new one started."""

    kill_to_completed_s: float
    new_gateway_ready_s: float
    ack_wait_s: float


class InProcessResume(Record, kw_only=True):
    """In process, with ack_wait lowered: the median of `trials`."""

    ack_wait_s: float
    tool_s: float
    kill_to_completed_s: float
    trials: list[float]


class Profile(Record, kw_only=True):
    """pyinstrument over the gateway process while it served `runs` sequential runs."""

    runs: int
    profile: str
    """The call tree's file name, next to results.md."""
    wall_s: float
    cpu_s: float
    top_self_time: list[str]
    p50_ms: float
    p99_ms: float
    n: int


class ModelServerRound(Record, kw_only=True):
    """The loopback model server's own account of a round."""

    calls: int
    cores: float
    cpu_ms_per_call: float
    late_p99_ms: float
    body_p99_ms: float
    lag_p99_ms: float
    lag_max_ms: float


class SlowPoint(Record, kw_only=True):
    """One system at one level of runs in flight against the slow model."""

    runs: int
    runs_per_s: float
    failures: int
    failure_kinds: list[str]
    p50_ms: float | None
    """None when every run failed."""
    p99_ms: float | None
    cpu_ms_per_run: float
    peak_rss_mib: dict[str, float]
    cpu_ms_by_process: dict[str, float] = {}
    cores_by_process: dict[str, float] = {}
    model_server: ModelServerRound | None = None
    rounds_runs_per_s: list[float] = []


SlowSystem = Literal["runbus", "langgraph_memory", "langgraph_postgres"]


class SlowModel(Record, kw_only=True):
    latency_ms: float = 300.0
    levels: list[int] = []
    rounds: int = 0
    runbus: dict[str, SlowPoint] = {}
    langgraph_memory: dict[str, SlowPoint] = {}
    langgraph_postgres: dict[str, SlowPoint] = {}
    langgraph_postgres_skipped: str | None = None

    def points(self, system: SlowSystem) -> dict[str, SlowPoint]:
        """`system`'s points by level."""
        match system:
            case "runbus":
                return self.runbus
            case "langgraph_memory":
                return self.langgraph_memory
            case "langgraph_postgres":
                return self.langgraph_postgres
            case _:
                assert_never(system)


class OverheadModelServer(Record, kw_only=True):
    late_p50_ms: float
    cpu_ms_per_call: float


class Overhead(Record, kw_only=True):
    """Where one run's time beyond the model's goes (bench/overhead.py)."""

    runs: int
    traced: int
    latency_ms: float
    overhead_p50_ms: float
    parts_ms: dict[str, float]
    """Median ms per run of each part, largest first."""
    model_server: OverheadModelServer | None = None


class SessionVariant(Record, kw_only=True):
    run_ms: list[float]
    first_ms: float
    last_ms: float
    last_over_first: float


class SessionLength(Record, kw_only=True):
    runs: int
    rounds: int
    window_turns: int
    windowed: SessionVariant | None = None
    persisted: SessionVariant | None = None


class ToolScalingPoint(Record, kw_only=True):
    replicas: int
    calls_per_s: float
    ideal: float
    p50_ms: float
    p99_ms: float
    calls: int


class FirstDelta(Record, kw_only=True):
    p50_us: float
    p99_us: float
    n: int


class Streaming(Record, kw_only=True):
    direct: FirstDelta
    bus: FirstDelta


class ProviderCpu(Record, kw_only=True):
    cpu_us_per_call: dict[str, float]
    cpu_us_rounds: dict[str, list[float]]
    ratio_msgspec_over_sdk: float
    calls_per_round: int
    rounds: int


class RealModel(Record, kw_only=True):
    first_token_ms: dict[str, float]
    per_token_ms: dict[str, float]
    first_token_ratio: float
    per_token_ratio: float
    whole_reply_ms: dict[str, float]
    whole_reply_ratio: float
    cancel_to_idle_ms: float
    cancel_to_idle_max_ms: float


class LongSession(Record, kw_only=True):
    """One session of many turns without compaction in the agent file (history's window)."""

    turns: int
    turn_bytes: int
    max_payload: int
    early_ms: float
    """Median run latency over turns 6-15."""
    late_ms: float
    """Median run latency over the last 50 turns."""
    late_over_early: float
    late_max_ms: float
    run_ms: list[float]
    """Each run's latency, in turn order."""


class HeldDeltas(Record, kw_only=True):
    """The same answer streamed as the model writes it and held until output guardrails pass."""

    words: int
    pace_ms: float
    """Milliseconds between the scripted model's words."""
    runs: int
    streamed_first_ms: float
    """Median time from the request to the first text byte, no output guardrails."""
    streamed_completed_ms: float
    """Median time from the request to `run.completed`, no output guardrails."""
    held_first_ms: float
    held_completed_ms: float


class McpTool(Record, kw_only=True):
    """One tool call per run: a native registry tool against an MCP stdio server's."""

    runs: int
    """Runs of each, interleaved."""
    native_p50_ms: float
    mcp_p50_ms: float
    ratio: float
    """MCP over native, whole run p50."""
    call_native_p50_ms: float | None = None
    """A bare `runbus.tools.<name>.invoke` of the native tool over the bus."""
    call_mcp_p50_ms: float | None = None


class SectionNumbers(Record, kw_only=True, omit_defaults=True):
    """What a per-service section's `run_benchmark()` returns besides its printed text."""

    tool_scaling: list[ToolScalingPoint] = []
    streaming: Streaming | None = None
    model_router_provider_cpu: dict[str, ProviderCpu] = {}
    """By the loopback server's way of streaming (token chunks, whole replies)."""
    real_model: RealModel | None = None
    long_session: LongSession | None = None
    held_deltas: HeldDeltas | None = None
    mcp_tool: McpTool | None = None


class Results(Record, kw_only=True, omit_defaults=True):
    """Every number of one `make bench` run; a section that did not run is absent."""

    meta: Meta
    floor: Floor | None = None
    hop: Hop | None = None
    whole_run: WholeRun | None = None
    resume_in_process: InProcessResume | None = None
    maf: Maf | None = None
    anchors: Anchors | None = None
    rss_mib: dict[str, float] = {}
    """VmRSS of each process of the six-process stack after its sequential runs."""
    throughput: dict[str, dict[str, ThroughputPoint]] = {}
    """By gateways, then by clients."""
    resume: ProcessResume | None = None
    profile: Profile | None = None
    slow_model: SlowModel | None = None
    overhead: Overhead | None = None
    session_length: SessionLength | None = None
    sections: dict[str, str] = {}
    """Each per-service section's printed text."""
    tool_scaling: list[ToolScalingPoint] = []
    streaming: Streaming | None = None
    model_router_provider_cpu: dict[str, ProviderCpu] = {}
    real_model: RealModel | None = None
    long_session: LongSession | None = None
    held_deltas: HeldDeltas | None = None
    mcp_tool: McpTool | None = None

    def add(self, numbers: SectionNumbers) -> None:
        """A per-service section's numbers, where it measured any."""
        for name in numbers.__struct_fields__:
            value = getattr(numbers, name)
            if value:
                setattr(self, name, value)


def decode(data: bytes) -> Results:
    return msgspec.json.decode(data, type=Results)


def encode(results: Results) -> bytes:
    """results.json's text: indented, fields in the order above."""
    return msgspec.json.format(msgspec.json.encode(results), indent=2) + b"\n"
