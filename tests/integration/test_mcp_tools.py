"""MCP servers as tool sources, on a real nats-server: the real `mcp-server-time` and
`mcp-server-git` over stdio, and a misbehaving server (`rogue_mcp_server.py`) that crashes,
hangs, answers garbage and changes its tool list."""

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from structlog.testing import capture_logs

from runbus import blobs
from runbus.headers import RunContext
from runbus.owners import Owner
from runbus.service import ServiceOptions
from runbus.telemetry import create_tracer_provider
from runbus_examples.scripted import load_scripts
from runbus_gateway.agents import load_agents
from runbus_tool_executor.config import Deployment, ToolOverride, load_deployment
from runbus_tool_executor.mcp_servers import McpServerConfig
from runbus_tool_executor.middleware import PROCEED, Call, Decision, Middleware, Modify, Reject
from runbus_tool_executor.service import ToolExecutorService
from tests.helpers import eventually, publish_and_collect, raw_request
from tests.integration.rogue_mcp_server import PICTURE
from tests.integration.test_tool_executor_bus import ALICE, invoke, listed
from tests.stack import SecuredNats, start_stack

BIN = Path(sys.executable).parent
ROGUE = Path(__file__).with_name("rogue_mcp_server.py")
HTTP_SERVER = Path(__file__).with_name("http_mcp_server.py")
EXAMPLE = Path(__file__).parents[2] / "examples" / "mcp_time"
CAROL = RunContext(run_id="r-c", agent="travel", props={"user_id": "carol", "tenant": "globex"})

Start = Callable[..., Awaitable[ToolExecutorService]]


@pytest.fixture
async def start(nats_server: SecuredNats, spans: InMemorySpanExporter) -> AsyncIterator[Start]:
    """Start a tool_executor replica serving the given MCP servers; stopped after the test."""
    async with AsyncExitStack() as stack:

        async def start_replica(
            *servers: McpServerConfig,
            overrides: dict[str, ToolOverride] | None = None,
            middleware: list[Middleware] | None = None,
        ) -> ToolExecutorService:
            nc = await nats.connect(nats_server.url)
            stack.push_async_callback(nc.drain)
            provider = create_tracer_provider(
                "tool_executor", processors=[SimpleSpanProcessor(spans)]
            )
            service = ToolExecutorService(
                nc,
                [],
                deployment=Deployment(
                    mcp_servers=list(servers), overrides=overrides, middleware=middleware
                ),
                options=ServiceOptions(tracer_provider=provider),
            )
            await service.start()
            stack.push_async_callback(service.stop)
            return service

        yield start_replica


@pytest.fixture
def rogue_log(tmp_path: Path) -> Path:
    return tmp_path / "rogue.log"


def rogue(log: Path, **options: Any) -> McpServerConfig:
    env = {"ROGUE_LOG": str(log), **options.pop("env", {})}
    return McpServerConfig(
        name="rogue", command=sys.executable, args=[str(ROGUE)], env=env, **options
    )


def time_server(**options: Any) -> McpServerConfig:
    return McpServerConfig(
        name="time",
        command=str(BIN / "mcp-server-time"),
        args=["--local-timezone", "UTC"],
        **options,
    )


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """A git repository with one commit."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=Ada", "-c", "user.email=ada@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "notes.txt").write_text("hello\n")
    subprocess.run([*git, "add", "notes.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "Add the first notes"], check=True)
    return repo


async def test_mcp_tools_are_listed_namespaced_with_their_schemas_and_answer_for_real(
    start: Start, nc: NATS, repository: Path
) -> None:
    git = McpServerConfig(
        name="git", command=str(BIN / "mcp-server-git"), args=["--repository", str(repository)]
    )
    await start(time_server(), git)

    schemas = await listed(nc, None)
    now = await invoke(nc, "time__get_current_time", {"timezone": "Europe/Paris"})
    history = await invoke(nc, "git__git_log", {"repo_path": str(repository)}, call_id="c-log")

    assert schemas["time__get_current_time"]["required"] == ["timezone"]
    assert schemas["time__get_current_time"]["properties"]["timezone"]["type"] == "string"
    assert "repo_path" in schemas["git__git_log"]["properties"]
    assert "git__git_commit" in schemas
    assert now.result.error is None
    assert now.result.result["timezone"] == "Europe/Paris"
    assert now.result.result["datetime"].endswith(("+01:00", "+02:00"))
    assert history.result.error is None
    assert "Add the first notes" in history.result.result


@pytest.fixture
def web_server(tmp_path: Path) -> Iterator[str]:
    """The URL of a streamable HTTP MCP server that wants the bearer token `s3cret`."""
    server = subprocess.Popen(
        [sys.executable, str(HTTP_SERVER)],
        env={"MCP_TOKEN": "s3cret", "PATH": str(BIN)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.terminate()
        server.wait(10)
        if server.stdout is not None:
            server.stdout.close()


async def test_a_streamable_http_server_is_called_with_the_token_from_its_secret_file(
    start: Start, nc: NATS, web_server: str, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    secret = tmp_path / "token"
    secret.write_text("s3cret\n")
    await start(McpServerConfig(name="web", url=web_server, token_file=str(secret)))

    schemas = await listed(nc, None)
    reply = await invoke(nc, "web__add", {"a": 2, "b": 3})

    assert schemas["web__add"]["required"] == ["a", "b"]
    assert reply.result.result == {"result": 5}
    span = next(s for s in spans.get_finished_spans() if s.name == "execute_tool web__add")
    assert (span.attributes or {})["mcp.session.id"]
    assert (span.attributes or {})["network.transport"] == "tcp"


async def test_a_server_refusing_the_token_serves_no_tools_and_says_why(
    start: Start, nc: NATS, web_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEB_TOKEN", "wrong")
    service = await start(McpServerConfig(name="web", url=web_server, token_env="WEB_TOKEN"))

    schemas = await listed(nc, None)

    assert not any(name.startswith("web__") for name in schemas)
    assert "401" in service.mcp.servers["web"].last_error


async def test_the_call_span_carries_the_gen_ai_and_mcp_attributes(
    start: Start, nc: NATS, spans: InMemorySpanExporter
) -> None:
    await start(time_server())

    await invoke(nc, "time__get_current_time", {"timezone": "UTC"})

    span = next(s for s in spans.get_finished_spans() if s.name.startswith("execute_tool"))
    attributes = dict(span.attributes or {})
    assert span.name == "execute_tool time__get_current_time"
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    assert attributes["gen_ai.tool.name"] == "time__get_current_time"
    assert attributes["mcp.method.name"] == "tools/call"
    assert attributes["runbus.mcp.server"] == "time"
    assert attributes["runbus.mcp.tool"] == "get_current_time"
    assert attributes["runbus.tool.side_effect"] is False


async def test_a_server_that_exits_mid_call_gives_an_error_result_and_is_restarted(
    start: Start, nc: NATS, rogue_log: Path
) -> None:
    service = await start(rogue(rogue_log))

    crashed = await invoke(nc, "rogue__crash", {}, call_id="c-crash")
    again = await invoke(nc, "rogue__echo", {"text": "still here"}, call_id="c-echo")

    assert crashed.result.error == (
        "tool 'rogue__crash' could not run: MCP server 'rogue' closed the connection during "
        "the call; it is being restarted"
    )
    assert again.result.result == "still here"
    assert service.mcp.servers["rogue"].restarts == 1
    assert rogue_log.read_text().count("started") == 2


async def test_a_hung_call_times_out_and_the_server_is_told_it_was_cancelled(
    start: Start, nc: NATS, rogue_log: Path
) -> None:
    await start(rogue(rogue_log, timeout=0.5))

    hung = await invoke(nc, "rogue__hang", {})

    assert hung.result.error == "tool 'rogue__hang' timed out after 0.5s."
    await eventually(lambda: "cancelled" in rogue_log.read_text(), what="notifications/cancelled")
    assert (await invoke(nc, "rogue__echo", {"text": "ok"}, call_id="c-2")).result.result == "ok"


async def test_the_runs_deadline_cuts_an_mcp_call_shorter_than_its_timeout(
    start: Start, nc: NATS, rogue_log: Path
) -> None:
    await start(rogue(rogue_log, timeout=30))
    hurried = msgspec.structs.replace(ALICE, deadline=time.time() + 1.0)

    started = time.monotonic()
    hung = await invoke(nc, "rogue__hang", {}, ctx=hurried)

    assert time.monotonic() - started < 2.0
    assert hung.result.error is not None
    assert hung.result.error.startswith("tool 'rogue__hang' timed out after 0.")
    await eventually(lambda: "cancelled" in rogue_log.read_text(), what="notifications/cancelled")


async def test_cancelling_the_run_ends_the_call_and_tells_the_server(
    start: Start, nc: NATS, rogue_log: Path
) -> None:
    service = await start(rogue(rogue_log, timeout=30))
    call = asyncio.ensure_future(invoke(nc, "rogue__hang", {}, timeout=10))
    await eventually(lambda: "call hang" in rogue_log.read_text(), what="the call at the server")

    service.executor.cancel_run(Owner.of(ALICE), ALICE.run_id)

    assert (await call).result.error == "not finished: the run was cancelled."
    await eventually(lambda: "cancelled" in rogue_log.read_text(), what="notifications/cancelled")


async def test_a_server_that_stops_answering_even_pings_is_restarted(
    start: Start, nc: NATS, rogue_log: Path
) -> None:
    service = await start(rogue(rogue_log, timeout=0.5, ping_interval=0.5))

    frozen = await invoke(nc, "rogue__freeze", {})
    # A restart spawns a new server process: slow on a loaded machine, so a generous bound.
    await eventually(
        lambda: service.mcp.servers["rogue"].restarts >= 1, what="a restart", timeout=60
    )
    after = await invoke(nc, "rogue__echo", {"text": "back"}, call_id="c-back")

    assert frozen.result.error == "tool 'rogue__freeze' timed out after 0.5s."
    assert "did not answer in time" in service.mcp.servers["rogue"].last_error
    assert after.result.result == "back"
    assert rogue_log.read_text().count("started") == 2


@pytest.mark.parametrize(
    ("tool", "error"),
    [
        ("fail", "the flux capacitor is empty"),
        (
            "garbage",
            "tool 'rogue__garbage' could not run: MCP server 'rogue' answered with something "
            "that is not an MCP tool result (content: Input should be a valid list)",
        ),
    ],
    ids=["is-error", "not-mcp"],
)
async def test_an_error_or_a_non_mcp_answer_is_an_error_result(
    start: Start, nc: NATS, rogue_log: Path, tool: str, error: str
) -> None:
    await start(rogue(rogue_log))

    reply = await invoke(nc, f"rogue__{tool}", {})

    assert reply.outcome == "result"
    assert reply.result.error == error


async def test_a_stray_line_on_the_servers_output_is_logged_and_the_call_still_answered(
    start: Start, nc: NATS, rogue_log: Path
) -> None:
    await start(rogue(rogue_log))

    with capture_logs() as logs:
        reply = await invoke(nc, "rogue__babble", {})

    assert reply.result.result == "babbled"
    assert any(e["event"] == "mcp_transport_error" for e in logs)


async def test_an_oversized_result_is_cut_to_the_cap_with_a_note(
    start: Start, nc: NATS, rogue_log: Path
) -> None:
    await start(rogue(rogue_log, max_result_bytes=1024))

    reply = await invoke(nc, "rogue__huge", {})

    text = reply.result.result
    assert len(text.encode()) <= 1024
    assert text.startswith("xxx")
    assert text.endswith("over this tool's 1024 byte cap; ask for less]")


async def test_a_large_image_reaches_the_model_as_a_reference_to_the_stored_bytes(
    start: Start, nc: NATS, rogue_log: Path
) -> None:
    await start(rogue(rogue_log))

    reply = await invoke(nc, "rogue__picture", {})

    text, image = reply.result.result
    assert text == {"type": "text", "text": "a grey square"}
    assert image["type"] == "uri"
    assert image["media_type"] == "image/png"
    assert image["uri"].startswith("runbus-blob://")
    assert await blobs.get(nc, image["uri"]) == PICTURE


async def test_arguments_are_checked_against_the_servers_schema_before_it_is_called(
    start: Start, nc: NATS, rogue_log: Path
) -> None:
    await start(rogue(rogue_log))

    reply = await invoke(nc, "rogue__echo", {"text": 5})

    assert reply.result.error == "invalid arguments: `text`: 5 is not of type 'string'"
    assert "call echo" not in rogue_log.read_text()


async def test_a_tool_with_a_schema_runbus_cannot_use_is_left_out_and_the_rest_served(
    start: Start, nc: NATS, rogue_log: Path
) -> None:
    await start(rogue(rogue_log))

    schemas = await listed(nc, None)

    assert "rogue__oddly" not in schemas
    assert "rogue__echo" in schemas


async def test_a_server_whose_listing_is_not_mcp_serves_nothing_and_the_replica_serves_on(
    start: Start, nc: NATS, rogue_log: Path
) -> None:
    await start(rogue(rogue_log, env={"ROGUE_STRING_SCHEMA": "1"}), time_server())

    schemas = await listed(nc, None)

    assert not any(name.startswith("rogue__") for name in schemas)
    assert "time__get_current_time" in schemas


async def test_a_tool_list_change_is_picked_up_and_the_new_tool_answers(
    start: Start, nc: NATS, rogue_log: Path
) -> None:
    await start(rogue(rogue_log))
    assert "rogue__grown" not in await listed(nc, None)

    await invoke(nc, "rogue__grow", {})

    async def grown() -> bool:
        return "rogue__grown" in await listed(nc, None)

    await eventually(grown, what="the new tool in tools.list")
    reply = await invoke(nc, "rogue__grown", {}, call_id="c-grown")
    assert reply.result.result == "grown ran"


async def test_another_tenants_run_neither_sees_nor_calls_a_servers_tools(
    start: Start, nc: NATS, rogue_log: Path
) -> None:
    await start(rogue(rogue_log, tenants=["acme"]))

    assert "rogue__echo" in await listed(nc, None, ALICE)
    assert not any(name.startswith("rogue__") for name in await listed(nc, None, CAROL))
    refused = await invoke(nc, "rogue__echo", {"text": "hi"}, ctx=CAROL)

    assert refused.result.error == "no tool named 'rogue__echo' is available to this run"
    assert "call echo" not in rogue_log.read_text()


async def test_an_injected_argument_comes_from_the_run_never_from_the_model(
    start: Start, nc: NATS, rogue_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROGUE_SECRET", "from-the-replica")
    await start(rogue(rogue_log, inject={"user": "user_id"}, env_from=["ROGUE_SECRET"]))

    schema = (await listed(nc, ["rogue__whoami"]))["rogue__whoami"]
    reply = await invoke(nc, "rogue__whoami", {"user": "mallory"})

    assert "user" not in schema["properties"]
    assert "required" not in schema
    assert reply.result.result == "user=alice secret=from-the-replica"


async def test_a_side_effecting_mcp_call_sent_twice_runs_once(
    start: Start, nc: NATS, rogue_log: Path
) -> None:
    await start(rogue(rogue_log))

    first = await invoke(nc, "rogue__grow", {}, call_id="c-once")
    second = await invoke(nc, "rogue__grow", {}, call_id="c-once")

    assert first.result == second.result
    assert second.replayed
    assert rogue_log.read_text().count("call grow") == 1


async def test_the_deployments_middleware_sees_and_decides_mcp_calls(
    start: Start, nc: NATS, rogue_log: Path
) -> None:
    seen: list[tuple[str, bool]] = []

    def policy(call: Call) -> Decision:
        seen.append((call.tool, call.side_effect))
        if call.tool == "rogue__grow":
            return Reject(error="growing is not allowed here")
        if call.tool == "rogue__echo":
            return Modify({"text": str(call.arguments["text"]).upper()})
        return PROCEED

    await start(rogue(rogue_log), middleware=[policy])

    refused = await invoke(nc, "rogue__grow", {}, call_id="c-grow")
    shouted = await invoke(nc, "rogue__echo", {"text": "quiet"}, call_id="c-echo")

    assert refused.result.error == "growing is not allowed here"
    assert shouted.result.result == "QUIET"
    assert seen == [("rogue__grow", True), ("rogue__echo", False)]
    assert "call grow" not in rogue_log.read_text()


async def test_a_deployment_override_puts_an_mcp_tool_behind_approval(
    start: Start, nc: NATS, rogue_log: Path
) -> None:
    await start(rogue(rogue_log), overrides={"rogue__echo": ToolOverride(approval="always")})

    reply = await invoke(nc, "rogue__echo", {"text": "hi"})

    assert reply.outcome == "approval_required"
    assert reply.approval is not None
    assert reply.approval.arguments == {"text": "hi"}
    assert "call echo" not in rogue_log.read_text()


async def test_the_example_agent_calls_mcp_server_time_through_the_gateway(
    nats_server: SecuredNats, nc: NATS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{BIN}:{os.environ.get('PATH', '')}")
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path / "data",
        agents=load_agents(EXAMPLE / "agents"),
        scripts=load_scripts(EXAMPLE / "scripts.toml"),
    ) as stack:
        await stack.start_service(
            ToolExecutorService, registries=[], deployment=load_deployment(EXAMPLE / "tools.toml")
        )
        events = await publish_and_collect(
            nc,
            "r-clock",
            raw_request("r-clock", "What time is it in Paris?", agent="clock"),
            subject="runbus.runs.clock",
            token="dev-alice",
        )

    assert events[-1]["type"] == "run.completed", events[-1]
    (result,) = (e["result"] for e in events if e["type"] == "run.tool_result")
    assert result.get("error") is None
    assert result["result"]["timezone"] == "Europe/Paris"
    assert events[-1]["text"].startswith("mcp-server-time says: ")
    assert result["result"]["datetime"] in events[-1]["text"]


async def test_a_user_of_another_tenant_cannot_reach_an_mcp_server_kept_for_one(
    nats_server: SecuredNats, nc: NATS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{BIN}:{os.environ.get('PATH', '')}")
    deployment = load_deployment(EXAMPLE / "tools.toml")
    acme_only = msgspec.structs.replace(deployment.mcp_servers[0], tenants=["acme"])
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path / "data",
        agents=load_agents(EXAMPLE / "agents"),
        scripts=load_scripts(EXAMPLE / "scripts.toml"),
    ) as stack:
        await stack.start_service(
            ToolExecutorService,
            registries=[],
            deployment=Deployment(mcp_servers=[acme_only]),
        )
        events = await publish_and_collect(
            nc,
            "r-carol",
            raw_request("r-carol", "What time is it in Paris?", agent="clock"),
            subject="runbus.runs.clock",
            token="dev-carol",
        )

    (result,) = (e["result"] for e in events if e["type"] == "run.tool_result")
    assert result.get("result") is None
    assert result["error"] == "no tool named 'time__get_current_time' is available to this run"
    assert "Paris" not in events[-1]["text"]
