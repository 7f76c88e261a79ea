"""The durable anchors at zero model latency: LangGraph with its in-memory, SQLite and Postgres
savers (bench/graph_anchor.py, each in its own process; Postgres from bench/postgres.py, the
row skipped with the reason where it cannot start)."""

import asyncio
import json
import sys
from typing import Any

import msgspec

from bench import postgres
from bench.processes import REPO
from bench.results import AnchorPoint, Anchors


async def graph_anchor(saver: str, args: list[str], db: postgres.Postgres | None) -> Any:
    """bench/graph_anchor.py in its own process with `saver`, `args` and the database `db`:
    the JSON of its last line of output."""
    command = [sys.executable, "-m", "bench.graph_anchor", "--saver", saver, *args]
    if db is not None:
        command += ["--dsn", db.dsn, "--db-pid", str(db.pid)]
    process = await asyncio.create_subprocess_exec(
        *command, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"LangGraph anchor ({saver}) failed: {err.decode()[-2000:]}")
    return json.loads(out.decode().strip().splitlines()[-1])


async def one(
    saver: str, n: int, levels: tuple[int, ...], trials: int, db: postgres.Postgres | None = None
) -> AnchorPoint:
    args = ["--n", str(n), "--levels", ",".join(map(str, levels)), "--trials", str(trials)]
    result = msgspec.convert(await graph_anchor(saver, args, db), AnchorPoint)
    by = result.cpu_ms_by_process
    print(
        f"  LangGraph, {saver:<8} saver  p50 {result.p50_ms:7.3f} ms   p99 "
        f"{result.p99_ms:7.3f} ms   CPU {result.cpu_ms_per_run:.2f} ms/run (anchor "
        f"{by['anchor']:.2f} + database {by['database']:.2f});  runs/s by clients: "
        + ", ".join(f"{c}: {r:.0f}" for c, r in result.runs_per_s.items())
    )
    return result


async def measure(n: int, levels: tuple[int, ...], trials: int) -> Anchors:
    print(
        "\n[anchors] the same run on LangGraph, a thread per run, every step checkpointed "
        "(durability sync), zero-latency scripted model"
    )
    results = Anchors(
        langgraph_memory=await one("memory", n, levels, trials),
        langgraph_sqlite=await one("sqlite", n, levels, trials),
    )
    try:
        with postgres.server() as db:
            results.langgraph_postgres = await one("postgres", n, levels, trials, db)
    except postgres.Unavailable as exc:
        print(f"  LangGraph + Postgres skipped: {exc}")
        results.langgraph_postgres_skipped = str(exc)
    return results
