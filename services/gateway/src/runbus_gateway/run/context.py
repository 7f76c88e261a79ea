"""Context providers: what a run draws on besides its history and its input, each asked through
one shape — `before_run` once while the session opens, `before_step` before each model call,
`after_run` once it answered. The agent's memory and its harness are the two providers."""

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from runbus.headers import RunContext
from runbus.messages import ChatMessage, TextContent

from ..agents import AgentSpec, MemoryPolicy
from ..harness.runtime import Harness
from ..harness.state import SessionState
from ..recall import memorable_statements, recall_message, recall_query, user_utterances
from .ports import RunPorts
from .state import Context, RunState

NOTHING = Context()


@dataclass(frozen=True)
class RunStart:
    """What a provider may look at when the run starts."""

    inputs: list[ChatMessage]
    """The run's input as the caller sent it (stamped)."""
    session: asyncio.Future[SessionState]
    """The session being opened; await it for its state bag."""


class ContextProvider(Protocol):
    async def before_run(self, start: RunStart) -> Context:
        """What the run's prompt starts with (asked once, while the session opens)."""
        ...

    def before_step(self, bag: Mapping[str, Any]) -> Context:
        """What the next model call sees besides the prompt (the session's state bag now)."""
        ...

    async def after_run(self, state: RunState) -> None:
        """The run answered; its final checkpoint is being stored meanwhile."""
        ...


def instructions(agent: AgentSpec, contexts: list[Context]) -> ChatMessage:
    """The system message: the agent's instructions, then what the providers add now (the
    todo guidance, the current mode's rules). First in the prompt; written again before each
    step, as `mode_set` changes it."""
    text = agent.instructions.strip()
    for context in contexts:
        if context.instructions:
            text += f"\n\n{context.instructions}"
    return ChatMessage(
        role="system",
        contents=[TextContent(text=text)],
        message_id="instructions",
        source="context_provider",
    )


def before_step(providers: list["ContextProvider"], bag: Mapping[str, Any]) -> list[Context]:
    return [p.before_step(bag) for p in providers]


class MemoryContext:
    """Long-term memory: recalled before the run (`before_invoke`) with the run's whole input as
    the query, and after it the user's statements handed to the memory service's write stream:
    the sentences the rules keep (`store = "rules"`), or the user's messages for the memory
    service to extract facts from with a model and reconcile (`store = "model"`)."""

    def __init__(self, ports: RunPorts, ctx: RunContext, policy: MemoryPolicy) -> None:
        self.ports = ports
        self.ctx = ctx
        self.policy = policy

    async def before_run(self, start: RunStart) -> Context:
        query = recall_query(start.inputs)
        if not (self.policy.searches_before_invoke and query):
            return NOTHING
        recalled = recall_message(await self.ports.search_memory(self.ctx, query, self.policy))
        return Context(recalled=[recalled]) if recalled else NOTHING

    def before_step(self, bag: Mapping[str, Any]) -> Context:
        return NOTHING

    async def after_run(self, state: RunState) -> None:
        if not self.policy.store_user_statements:
            return
        if self.policy.store == "model":
            texts = user_utterances(state.inputs)
            # The policy travels as trusted run properties, like the search scope does.
            props = {**self.ctx.props, **self.policy.store_props()}
            ctx = msgspec.structs.replace(self.ctx, props=props)
        else:
            texts, ctx = memorable_statements(state.inputs), self.ctx
        if texts:
            await self.ports.store_memory(ctx, texts)


class HarnessContext:
    """The harness: a host's mode switch told once (then acknowledged), the todo and mode
    instructions, and the current todo list before each model call."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness

    async def before_run(self, start: RunStart) -> Context:
        if not self.harness.config.modes.enabled:
            return NOTHING
        session = await start.session
        notice = self.harness.mode_notice(session.bag)
        if notice is None:
            return NOTHING
        await self.harness.acknowledge_mode(session)
        return Context(notices=[notice])

    def before_step(self, bag: Mapping[str, Any]) -> Context:
        todo = self.harness.todo_message(bag)
        return Context(instructions=self.harness.instructions(bag), messages=[todo] if todo else [])

    async def after_run(self, state: RunState) -> None:
        return None
