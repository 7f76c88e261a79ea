"""Agents that call agents, for the tests: a triage agent that asks a flights specialist (a
child run), and one model backend that answers as whichever agent's instructions it reads."""

import asyncio
from collections.abc import Collection
from datetime import UTC, datetime

from runbus.messages import ChatMessage, ModelRequest, ModelResponse, Usage
from runbus_gateway.agents import AgentSpec, AgentTool
from runbus_model_router.backends import OnDelta
from tests.models import call, text, turn_step

TRIAGE = AgentSpec(
    name="triage",
    instructions="You are triage: route each question to the right specialist.",
    model="agents",
    description="Routes questions to specialists",
    agent_tools=[
        AgentTool(agent="flights", description="Flight search: ask it for flights in full."),
    ],
)
FLIGHTS = AgentSpec(
    name="flights",
    instructions="You are flights: answer with one flight.",
    model="agents",
    description="Finds flights",
)
DEEP = AgentSpec(
    name="deep",
    instructions="You are deep: always ask deep again.",
    model="agents",
    agent_tools=[AgentTool(agent="deep")],
)
AGENTS = {a.name: a for a in (TRIAGE, FLIGHTS, DEEP)}
CALLS = {"triage": "flights", "deep": "deep", "fx": "rates", "desk": "flights"}
"""The tool each calling agent calls first."""
ASKS_WITH_THE_QUESTION = {"fx"}
"""Agents that pass the user's own words on (the others ask a fixed question)."""
USAGE = Usage(input_tokens=10, output_tokens=5)
"""What each model call uses."""


class AgentsModel:
    """Answers as the agent whose instructions open the prompt. `hold`: the (agent, step)
    model calls that wait for `release` (to catch a run mid-flight)."""

    name = "agents"

    def __init__(self, *, hold: Collection[tuple[str, int]] = ()) -> None:
        self.hold = set(hold)
        self.release = asyncio.Event()
        self.reached = asyncio.Event()
        self.requests: list[ModelRequest] = []

    def calls_of(self, agent: str) -> int:
        return sum(1 for r in self.requests if _agent(r) == agent)

    async def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
        self.requests.append(request)
        agent, step = _agent(request), turn_step(request)
        if (agent, step) in self.hold:
            self.reached.set()
            await self.release.wait()
        message = _reply(agent, step, request)
        message = ChatMessage(
            role="assistant", contents=message.contents, created_at=datetime.now(UTC)
        )
        if message.text:
            await on_delta(message.text)
        return ModelResponse(
            message=message,
            model="agents",
            finish_reason="tool_calls" if message.function_calls else "stop",
            usage=USAGE,
        )


def _agent(request: ModelRequest) -> str:
    system = next(m.text for m in request.messages if m.role == "system")
    return system.removeprefix("You are ").split(":", 1)[0]


def _reply(agent: str, step: int, request: ModelRequest) -> ChatMessage:
    if agent == "flights":
        question = next(m.text for m in request.messages if m.role == "user")
        return text(f"QF1 09:00 for {question!r}")
    if step == 0:
        if agent in ASKS_WITH_THE_QUESTION:
            question = next(m.text for m in request.messages if m.role == "user")
            return call(CALLS[agent], "c-ask", input=question)
        return call(CALLS[agent], "c-ask", input="SYD to MEL on Friday")
    result = [r for m in request.messages for r in m.function_results][-1]
    return text(f"{agent} heard: {result.error or result.result}")
