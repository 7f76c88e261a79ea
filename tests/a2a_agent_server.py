"""An A2A agent written with the a2a-sdk's own server (its request handler, task store and
routes under uvicorn), for the tests of remote agents as tools. It takes only its bearer
token. It answers a rate at once, asks which currency before it converts, works forever on
anything "slow" (until it is cancelled) and on anything "held" until the test releases it."""

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import uvicorn
from a2a.helpers.proto_helpers import new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part
from a2a.utils.constants import PROTOCOL_VERSION_1_0, TransportProtocol
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

TOKEN = "a2a-s3cret"


@dataclass
class Seen:
    """What the agent was asked, and which of its tasks were cancelled."""

    inputs: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    working: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    """Lets a "held" task answer."""


class Rates(AgentExecutor):
    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        text = context.get_user_input()
        self.seen.inputs.append(text)
        task = context.current_task
        if task is None:
            assert context.message is not None
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work(updater.new_agent_message([Part(text="looking it up")]))
        if "slow" in text:
            self.seen.working.set()
            await asyncio.Event().wait()  # until cancelled
        if "held" in text:
            self.seen.working.set()
            await self.seen.release.wait()
        if text.startswith("convert") and len(self.seen.inputs) == 1:
            await updater.requires_input(updater.new_agent_message([Part(text="Which currency?")]))
            return
        answer = f"100 AUD is 65 {text}" if len(self.seen.inputs) > 1 else "1 AUD is 0.65 USD"
        await updater.add_artifact([Part(text=answer)], artifact_id="answer", last_chunk=True)
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None
        self.seen.cancelled.append(context.task_id)
        updater = TaskUpdater(event_queue, context.task_id, context.context_id or "")
        await updater.cancel()


def guarded(app: ASGIApp) -> ASGIApp:
    async def check(scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers", []))
        if scope["type"] == "http" and headers.get(b"authorization") != f"Bearer {TOKEN}".encode():
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"who are you?"})
            return
        await app(scope, receive, send)

    return check


@asynccontextmanager
async def rates_agent() -> AsyncIterator[tuple[str, Seen]]:
    """The agent served on a free port of 127.0.0.1: its URL and what it saw."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/rates"
    card = AgentCard(
        name="rates",
        description="Exchange rates and conversions",
        version="1.0",
        supported_interfaces=[
            AgentInterface(
                url=url,
                protocol_binding=TransportProtocol.JSONRPC.value,
                protocol_version=PROTOCOL_VERSION_1_0,
            )
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="rates", name="rates", description="rates", tags=["fx"])],
    )
    seen = Seen()
    handler = DefaultRequestHandler(
        agent_executor=Rates(seen), task_store=InMemoryTaskStore(), agent_card=card
    )
    app = Starlette(
        routes=[
            *create_agent_card_routes(card, card_url="/rates/.well-known/agent-card.json"),
            *create_jsonrpc_routes(handler, "/rates"),
        ]
    )
    server = uvicorn.Server(uvicorn.Config(guarded(app), log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        yield url, seen
    finally:
        server.should_exit = True
        await serving
