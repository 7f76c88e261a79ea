"""The durable anchors: the same 3-tool travel run on LangGraph with its in-memory, SQLite and
Postgres checkpoint savers — a thread per run, every step checkpointed before the next starts
(`durability="sync"`, the setting that matches runbus's checkpoint before tools).

The graph is LangGraph's own agent shape: a model node, `ToolNode` with the same three travel
tools as bench/maf.py, `tools_condition` between them. The model is either scripted in process
(a LangChain chat model, zero latency: the CPU floor) or the loopback OpenAI-compatible server
through the openai SDK, streaming (the 300 ms-model section).

Run as its own process (`python -m bench.graph_anchor ...`, JSON on stdout) so its CPU and peak
memory are its own; the database server's CPU (the postmaster and its backends) is added to the
run's cost."""

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import msgspec
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from bench import maf
from bench.results import AnchorPoint, SlowPoint
from bench.timing import in_flight_round, pct, points_per_level, runs_per_s

SAVERS = ("memory", "sqlite", "postgres")


class ScriptedChatModel(BaseChatModel):
    """The bench script as a LangChain chat model: reply N after N assistant messages since the
    last human message, `{last_result}` filled from the last tool result."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> "ScriptedChatModel":
        return self

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        turn: list[BaseMessage] = []
        for message in messages:
            turn = [] if message.type == "human" else [*turn, message]
        step = sum(1 for m in turn if m.type == "ai")
        planned = maf.SCRIPT[min(step, len(maf.SCRIPT) - 1)]
        if isinstance(planned, str):
            results = [m for m in turn if m.type == "tool"]
            last = str(results[-1].content) if results else ""
            return AIMessage(content=planned.replace("{last_result}", last))
        name, arguments = planned
        call = {"name": name, "args": arguments, "id": f"call-{uuid.uuid4().hex[:12]}"}
        return AIMessage(content="", tool_calls=[call])

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        return self._generate(messages)


def _openai_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.type == "system":
            out.append({"role": "system", "content": m.content})
        elif m.type == "human":
            out.append({"role": "user", "content": m.content})
        elif m.type == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})  # type: ignore[attr-defined]
        else:
            calls = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["args"])},
                }
                for c in getattr(m, "tool_calls", [])
            ]
            out.append(
                {
                    "role": "assistant",
                    "content": m.content or None,
                    **({"tool_calls": calls} if calls else {}),
                }
            )
    return out


tools = [StructuredTool.from_function(f) for f in maf.TOOLS]
TOOL_SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": t.name,
            "description": t.description,
            "parameters": t.args_schema.model_json_schema() if t.args_schema else {},  # type: ignore[union-attr]
        },
    }
    for t in tools
]


def openai_node(base_url: str) -> Any:
    """A model node calling the loopback server with the openai SDK, streamed (runbus's
    model_router reads the same stream with msgspec)."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=120)

    async def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        messages = [SystemMessage(maf.INSTRUCTIONS), *state["messages"]]
        # The messages and tools are the wire's dicts, not the SDK's TypedDicts.
        stream = await client.chat.completions.create(  # type: ignore[call-overload]
            model="bench-300ms",
            messages=_openai_messages(messages),
            tools=TOOL_SCHEMAS,
            stream=True,
            stream_options={"include_usage": True},
        )
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        async for chunk in stream:
            for choice in chunk.choices:
                delta = choice.delta
                if delta.content:
                    text.append(delta.content)
                for call in delta.tool_calls or []:
                    entry = calls.setdefault(call.index, {"id": "", "name": "", "args": ""})
                    if call.id:
                        entry["id"] = call.id
                    if call.function and call.function.name:
                        entry["name"] = call.function.name
                    if call.function and call.function.arguments:
                        entry["args"] += call.function.arguments
        tool_calls = [
            {"id": c["id"], "name": c["name"], "args": json.loads(c["args"] or "{}")}
            for c in calls.values()
        ]
        return {"messages": [AIMessage(content="".join(text), tool_calls=tool_calls)]}

    return call_model


def scripted_node() -> Any:
    model = ScriptedChatModel().bind_tools(tools)

    async def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        reply = await model.ainvoke([SystemMessage(maf.INSTRUCTIONS), *state["messages"]])
        return {"messages": [reply]}

    return call_model


def build(saver: BaseCheckpointSaver[Any], model_url: str | None) -> Any:
    graph = StateGraph(MessagesState)
    graph.add_node("agent", openai_node(model_url) if model_url else scripted_node())
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


@asynccontextmanager
async def saver_of(kind: str, dsn: str | None) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    if kind == "memory":
        yield InMemorySaver()
    elif kind == "sqlite":
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        with tempfile.TemporaryDirectory() as tmp:
            async with AsyncSqliteSaver.from_conn_string(str(Path(tmp) / "graph.db")) as saver:
                yield saver
    else:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        assert dsn, "the postgres saver needs --dsn"
        async with AsyncConnectionPool(
            dsn,
            min_size=4,
            max_size=32,
            open=False,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        ) as pool:
            pg_saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
            await pg_saver.setup()
            yield pg_saver


async def one_run(graph: Any) -> None:
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    state = await graph.ainvoke({"messages": [HumanMessage(maf.PROMPT)]}, config, durability="sync")
    text = state["messages"][-1].content
    assert "confirmation" in text, text


def tree_cpu(pid: int | None) -> float:
    """CPU seconds of a process, its waited-for children and its live children (the
    postmaster and its backends)."""
    if pid is None:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        own = int(entry.name) == pid
        if own or int(fields[1]) == pid:
            total += int(fields[11]) + int(fields[12])
            if own:
                total += int(fields[13]) + int(fields[14])
    return total / ticks


def tree_rss_mib(pid: int | None) -> float:
    """Resident memory of a process and its live children, MiB."""
    if pid is None:
        return 0.0
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            status = (entry / "status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(entry.name) == pid or int(stat[1]) == pid:
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


def reset_peak() -> None:
    """Start this process's peak-RSS count afresh (Linux: 5 → clear_refs resets VmHWM)."""
    with suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def floor(
    graph: Any, n: int, levels: list[int], trials: int, db_pid: int | None
) -> AnchorPoint:
    """Zero-latency model: latency and CPU per run (this process + the database server),
    runs/s at each number of clients (median of `trials` rounds)."""
    for _ in range(20):
        await one_run(graph)
    maf.calls.update(dict.fromkeys(maf.calls, 0))
    samples: list[float] = []
    cpu, db = time.process_time(), tree_cpu(db_pid)
    for _ in range(n):
        start = time.perf_counter()
        await one_run(graph)
        samples.append(time.perf_counter() - start)
    own_ms = (time.process_time() - cpu) * 1000 / n
    db_ms = (tree_cpu(db_pid) - db) * 1000 / n
    maf.check_tools_called(n)
    rates = await runs_per_s(
        lambda: one_run(graph),
        levels,
        lambda clients: max(n // 3, clients * 4),
        trials,
        cpu_seconds=lambda: time.process_time() + tree_cpu(db_pid),
    )
    ms = [s * 1000 for s in samples]
    return AnchorPoint(
        n=n,
        p50_ms=statistics.median(ms),
        p99_ms=pct(ms, 0.99),
        cpu_ms_per_run=own_ms + db_ms,
        cpu_ms_by_process={"anchor": own_ms, "database": db_ms},
        runs_per_s=rates.runs_per_s,
        cpu_ms_per_run_by_clients=rates.cpu_ms_per_run,
    )


async def in_flight(graph: Any, levels: list[int], db_pid: int | None) -> dict[str, SlowPoint]:
    """A slow model: at each level, that many runs at once (a few rounds at 1): runs/s,
    latency, failures, peak RSS of this process and the database's RSS."""

    async def timed_run() -> float:
        start = time.perf_counter()
        await one_run(graph)
        return time.perf_counter() - start

    await one_run(graph)
    points: dict[str, SlowPoint] = {}
    for level in levels:
        total = points_per_level(level)
        reset_peak()
        cpu = time.process_time() + tree_cpu(db_pid)
        samples, failures, elapsed = await in_flight_round(
            timed_run, level, total, lambda exc: type(exc).__name__
        )
        ms = [s * 1000 for s in samples] or [float("nan")]
        points[str(level)] = SlowPoint(
            runs=total,
            runs_per_s=len(samples) / elapsed,
            failures=len(failures),
            failure_kinds=sorted(set(failures)),
            p50_ms=statistics.median(ms),
            p99_ms=pct(ms, 0.99),
            cpu_ms_per_run=(time.process_time() + tree_cpu(db_pid) - cpu) * 1000 / total,
            peak_rss_mib={"anchor": peak_mib(), "database": tree_rss_mib(db_pid)},
        )
    return points


async def main(args: argparse.Namespace) -> AnchorPoint | dict[str, SlowPoint]:
    async with saver_of(args.saver, args.dsn) as saver:
        graph = build(saver, args.model_url)
        levels = [int(x) for x in args.levels.split(",")]
        if args.model_url:
            return await in_flight(graph, levels, args.db_pid)
        return await floor(graph, args.n, levels, args.trials, args.db_pid)


if __name__ == "__main__":
    import uvloop

    parser = argparse.ArgumentParser()
    parser.add_argument("--saver", choices=SAVERS, required=True)
    parser.add_argument("--dsn")
    parser.add_argument("--db-pid", type=int)
    parser.add_argument("--model-url", help="loopback OpenAI base URL; default: scripted")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--levels", default="1,8,64")
    parser.add_argument("--trials", type=int, default=3)
    # One line of JSON, the last of the output: what bench/anchors.py reads back. The json
    # module keeps a NaN latency (every run failed) as NaN, where msgspec would write null.
    print(json.dumps(msgspec.to_builtins(uvloop.run(main(parser.parse_args())))))
