"""A remote agent for the multi-agent example, written with the a2a-sdk alone (no runbus): it
answers exchange-rate questions over A2A (JSON-RPC, streaming) and takes only the bearer token
in `RATES_TOKEN`. `python examples/multi_agent/rates_agent.py` serves it on port 9999."""

import asyncio
import os
import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

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

RATES = {"AUD": 1.0, "USD": 0.65, "EUR": 0.6, "JPY": 98.0}


class Rates(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        if task is None:
            assert context.message is not None
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work(updater.new_agent_message([Part(text="looking up rates")]))
        named = [c for c in re.findall(r"[A-Z]{3}", context.get_user_input().upper()) if c in RATES]
        base, quote = [*named, "AUD", "USD"][:2]
        answer = f"1 {base} = {RATES[quote] / RATES[base]:.4f} {quote}"
        await updater.add_artifact([Part(text=answer)], artifact_id="answer", last_chunk=True)
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None
        await TaskUpdater(event_queue, context.task_id, context.context_id or "").cancel()


def card(url: str) -> AgentCard:
    return AgentCard(
        name="rates",
        description="Exchange rates",
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
        skills=[AgentSkill(id="rates", name="rates", description="Exchange rates", tags=["fx"])],
    )


def bearer_only(app: ASGIApp, token: str) -> ASGIApp:
    async def check(scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers", []))
        if scope["type"] == "http" and headers.get(b"authorization") != f"Bearer {token}".encode():
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"bearer token required"})
            return
        await app(scope, receive, send)

    return check


@asynccontextmanager
async def serving(token: str, port: int = 0) -> AsyncIterator[str]:
    """The agent on 127.0.0.1 (`port` 0: a free one) while the block runs: its URL."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/rates"
    agent = card(url)
    handler = DefaultRequestHandler(
        agent_executor=Rates(), task_store=InMemoryTaskStore(), agent_card=agent
    )
    app = Starlette(
        routes=[
            *create_agent_card_routes(agent, card_url="/rates/.well-known/agent-card.json"),
            *create_jsonrpc_routes(handler, "/rates"),
        ]
    )
    config = uvicorn.Config(bearer_only(app, token), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        yield url
    finally:
        server.should_exit = True
        await task


async def main() -> None:
    async with serving(os.environ["RATES_TOKEN"], 9999) as url:
        print(f"rates agent at {url}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
