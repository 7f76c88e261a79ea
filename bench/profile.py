"""A pyinstrument profile of the gateway process while it serves sequential whole runs
(bench/whole_run.py's clients): its call tree, and the functions by their own time."""

from pathlib import Path

from pyinstrument.frame import Frame
from pyinstrument.renderers import ConsoleRenderer
from pyinstrument.session import Session

from bench.processes import Bench
from bench.results import Profile
from bench.whole_run import Clients, stats_ms


async def gateway(bench: Bench, clients: Clients, n: int, out: Path) -> Profile:
    """Replace the gateways by one under pyinstrument; `n` sequential runs; its profile as a
    call tree (`out`) and the functions that took the most time themselves."""
    for process in list(bench.gateways):
        await bench.stop_gateway(process)
    session_file = bench.data / "gateway.pyisession"
    profiled = await bench.add_gateway(profile_to=session_file)
    samples = [await clients.one() for _ in range(n)]
    await bench.stop_gateway(profiled)
    session = Session.load(str(session_file))
    out.write_text(ConsoleRenderer(show_all=False, unicode=False, color=False).render(session))
    totals: dict[str, float] = {}
    loop = find(session.root_frame(), "run", "asyncio/runners.py")
    if loop is not None:  # the service's life inside the event loop, not its imports
        self_times(loop, totals)
    ranked = sorted(totals.items(), key=lambda item: -item[1])[:20]
    top = [f"{seconds:7.3f} s  {name}" for name, seconds in ranked]
    latency = stats_ms(samples)
    return Profile(
        runs=n,
        profile=out.name,
        wall_s=session.duration,
        cpu_s=session.cpu_time,
        top_self_time=top,
        p50_ms=latency.p50_ms,
        p99_ms=latency.p99_ms,
        n=latency.n,
    )


def find(frame: Frame | None, function: str, file_suffix: str) -> Frame | None:
    """The first frame, depth first, of `function` in a file ending with `file_suffix`."""
    if frame is None:
        return None
    if frame.function == function and (frame.file_path_short or "").endswith(file_suffix):
        return frame
    for child in frame.children:
        if (found := find(child, function, file_suffix)) is not None:
            return found
    return None


def self_times(frame: Frame, totals: dict[str, float]) -> None:
    """Add up each function's own time over the call tree (pyinstrument's flat view merges
    every `[self]` leaf into one row, which hides where the idle time is)."""
    if not frame.is_synthetic:
        where = f"{frame.function}  {frame.file_path_short}:{frame.line_no}"
        totals[where] = totals.get(where, 0.0) + frame.total_self_time
    for child in frame.children:
        self_times(child, totals)
