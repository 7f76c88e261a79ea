"""The demo `make run` shows: three runs of the travel agent, across two sessions of one user,
on the embedded stack with the offline model (a rule-based stand-in, not an LLM)."""

import uuid
from typing import TextIO

from .client import RunbusClient
from .render import EventPrinter
from .runner import connect
from .settings import Settings
from .supervisor import ProcessStack

CONVERSATION = (
    ("first", "What's the weather in Sydney?"),
    ("first", "Remember that I always want a window seat."),
    ("first", "My password is hunter2, can you log in and book for me?"),
    ("second", "Book me a flight from Melbourne to Sydney next Tuesday."),
    ("second", "Also book VA823 on Friday."),
)
"""Weather through a tool; a preference remembered; a guardrail refusing before any model
call; a new session that recalls the preference and books with it; a booking on a carrier
the corporate policy blocks, which stops the tool loop."""


async def run_demo(settings: Settings, out: TextIO) -> int:
    stack = ProcessStack(settings)
    url = await stack.start()
    out.write(
        f"runbus demo: embedded NATS at {url}, six services as processes, the offline model "
        "(rule-based, not an LLM).\nLogs: "
        f"{stack.data / 'logs'}\n\n"
    )
    tag = uuid.uuid4().hex[:6]
    try:
        nc = await connect(url, "runbus-demo")
        try:
            client = RunbusClient(nc, token=settings.token)
            printer = EventPrinter(out)
            for session, text in CONVERSATION:
                session_id = f"demo-{session}-{tag}"
                out.write(f"[{session_id}] you: {text}\n")
                async for event in client.stream("travel", text, session_id=session_id):
                    printer(event)
                out.write("\n")
        finally:
            await nc.drain()
    finally:
        await stack.stop()
    return 0
