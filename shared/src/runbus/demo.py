"""The demo `make run` shows: three runs of the travel agent, across two sessions of one user,
on the embedded stack with the offline model (a rule-based stand-in, not an LLM), or with
`--model local` on a real local model (SmolLM2-135M on a llama.cpp server)."""

import contextlib
import os
import uuid
from pathlib import Path
from typing import Literal, TextIO

from . import ops
from .client import RunbusClient, open_connection
from .local_model import MODEL_NAME, LocalModelServer, router_toml
from .messages.runs import ApprovalDecide, RunApprovalRequested, RunFailed
from .render import EventPrinter
from .settings import Settings
from .supervisor import ProcessStack, warm_memory_env

CONVERSATION = (
    ("first", "What's the weather in Sydney?"),
    ("first", "Remember that I always want a window seat."),
    ("first", "My password is hunter2, can you log in and book for me?"),
    ("second", "Book me a flight from Melbourne to Sydney next Tuesday."),
    ("second", "Book QF412 on Thursday in business."),
    ("second", "Also book VA823 on Friday."),
)
"""Weather through a tool; a preference remembered; a guardrail refusing before any model
call; a new session that recalls the preference and books with it; a business fare over the
booking limit, which waits for a person's approval (the demo denies it); a booking on a
carrier the corporate policy blocks, which stops the tool loop."""


DemoModel = Literal["offline", "local"]

LOCAL_RULES = """
# The travel agent asks for `offline`; every such call goes to the local model instead.
[[rules]]
route = "offline"
use = "local"
"""


def local_routes(data: Path, base_url: str) -> Path:
    path = data / "demo-local-routes.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    local_target = "native_tools = false\nmax_output_tokens = 256\ntemperature = 0.2\ntimeout = 120"
    routes = router_toml(base_url, backend='family = "llamacpp"', target=local_target)
    path.write_text(routes + LOCAL_RULES)
    return path


async def run_demo(settings: Settings, out: TextIO, model: DemoModel = "offline") -> int:
    with contextlib.ExitStack() as local:
        router_env: dict[str, str] = {}
        described = "the offline model (rule-based, not an LLM)"
        if model == "local":
            server = local.enter_context(LocalModelServer(slots=1, threads=2))
            routes = local_routes(Path(settings.data_dir), server.base_url)
            router_env = {"RUNBUS_MODEL_ROUTES": str(routes)}
            described = f"the local model {MODEL_NAME} on llama.cpp at {server.url}"
        return await _converse(settings, out, described, {"model_router": router_env})


async def _converse(
    settings: Settings, out: TextIO, described: str, replica_env: dict[str, dict[str, str]]
) -> int:
    stack = ProcessStack(settings, replica_env={**warm_memory_env(os.environ), **replica_env})
    url = await stack.start()
    out.write(
        f"runbus demo: embedded NATS at {url}, seven services as processes, {described}.\nLogs: "
        f"{stack.data / 'logs'}\n\n"
    )
    tag = uuid.uuid4().hex[:6]
    try:
        nc = await open_connection(url, settings.token, name="runbus-demo")
        try:
            client = RunbusClient(nc, token=settings.token)
            printer = EventPrinter(out)
            failed = 0
            for session, text in CONVERSATION:
                session_id = f"demo-{session}-{tag}"
                out.write(f"[{session_id}] you: {text}\n")
                async for event in client.stream("travel", text, session_id=session_id):
                    printer(event)
                    if isinstance(event, RunFailed):
                        failed += 1
                    if isinstance(event, RunApprovalRequested):
                        # Nobody is at the keyboard to decide: the demo says no, and the run
                        # goes on with the refusal as the call's result.
                        out.write("    (the demo denies it)\n")
                        decision = ApprovalDecide(
                            run_id=event.run_id,
                            call_id=event.call_id,
                            decision="denied",
                            note="denied by the demo",
                        )
                        await client.call(ops.API_APPROVALS_DECIDE, decision)
                out.write("\n")
        finally:
            await nc.drain()
    finally:
        await stack.stop()
    if failed:
        out.write(f"runbus demo: {failed} of {len(CONVERSATION)} runs failed\n")
        return 1
    return 0
