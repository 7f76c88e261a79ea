"""Model backends for tests: they speak the router's backend interface, so runs go through the
real model_router service; only the model itself is scripted."""

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime

from runbus.messages import (
    ChatMessage,
    FunctionCallContent,
    ModelRequest,
    ModelResponse,
    TextContent,
    Usage,
)
from runbus_model_router.backends import OnDelta

Reply = Callable[[ModelRequest, int], ChatMessage]


def text(answer: str) -> ChatMessage:
    return ChatMessage(role="assistant", contents=[TextContent(text=answer)])


def call(name: str, call_id: str, **arguments: object) -> ChatMessage:
    return ChatMessage(
        role="assistant",
        contents=[FunctionCallContent(call_id=call_id, name=name, arguments=arguments)],
    )


def turn_step(request: ModelRequest) -> int:
    """Assistant messages since the last user message: which step of the turn this is."""
    step = 0
    for message in reversed(request.messages):
        if message.role == "user" and message.source != "context_provider":
            break
        step += message.role == "assistant"
    return step


class GatedModel:
    """Answers from `replies(request, step)`; `hold` steps wait for `release` (to catch a run
    mid-flight). Records every request it saw."""

    name = "gated"

    def __init__(self, replies: Reply, *, hold: set[int] | None = None) -> None:
        self.replies = replies
        self.hold = hold or set()
        self.release = asyncio.Event()
        self.reached = asyncio.Event()
        self.requests: list[ModelRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
        self.requests.append(request)
        step = turn_step(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if step in self.hold:
                self.reached.set()
                await self.release.wait()
            message = self.replies(request, step)
        finally:
            self.in_flight -= 1
        message = ChatMessage(
            role="assistant", contents=message.contents, created_at=datetime.now(UTC)
        )
        if message.text:
            await on_delta(message.text)
        return ModelResponse(
            message=message,
            model="gated",
            finish_reason="tool_calls" if message.function_calls else "stop",
            usage=Usage(input_tokens=10, output_tokens=5),
        )


def weather_then_answer(request: ModelRequest, step: int) -> ChatMessage:
    """Step 0 asks for the weather, step 1 answers from the tool result."""
    if step == 0:
        return call("get_weather", "c-weather", city="Sydney")
    results = [r for m in request.messages for r in m.function_results]
    return text(f"Done: {results[-1].result if results else 'no result'}")
