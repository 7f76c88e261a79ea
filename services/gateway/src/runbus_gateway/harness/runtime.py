"""`Harness`: one agent's `[harness]` table, built once per agent (`AgentSpec.runtime`), and
everything the run asks of it — refusals, output rewriting, local tools, instructions, context
messages, the loop decision, the program agent. Pure apart from `SessionState` writes.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from runbus import modes as mode_state
from runbus import todos as todo_state
from runbus.messages import (
    ChatMessage,
    ErrorInfo,
    FunctionCallContent,
    FunctionResultContent,
    ToolSpec,
)

from ..errors import GatewayConfigError
from . import evaluators, guardrails, modes, todos
from .config import HarnessConfig
from .errors import StateConflict, StateInvalid
from .programs import ProgramAgent, load_program
from .rewriters import Rewriter, build_rewriters, rewrite_final
from .state import SessionState
from .user_errors import user_error


class Harness:
    def __init__(
        self,
        config: HarnessConfig,
        *,
        checks: list[guardrails.Guardrail],
        rewriters: list[Rewriter],
        loop_evaluators: list[evaluators.Evaluator],
        program: ProgramAgent | None,
    ) -> None:
        self.config = config
        self.guardrails = checks
        self.rewriters = rewriters
        self.evaluators = loop_evaluators
        self.program = program
        """The program agent that replaces the model loop (kind `program`), else None."""
        self._tools = [
            *(todos.TOOL_SPECS if config.todos.enabled else []),
            *(modes.TOOL_SPECS if config.modes.enabled else []),
        ]
        self._tool_names = frozenset(spec.name for spec in self._tools)

    @classmethod
    def from_config(cls, config: HarnessConfig) -> "Harness":
        """Build the plug-ins and the program; `GatewayConfigError` names what is wrong."""
        if config.kind == "program" and not config.program:
            raise GatewayConfigError("harness kind 'program' needs `program = \"module:Class\"`")
        if config.kind == "chat" and config.program:
            raise GatewayConfigError("`program` is set but harness kind is 'chat'")
        built_evaluators = evaluators.build_evaluators(config.loop.evaluators)
        for one in built_evaluators if config.loop.enabled else []:
            if isinstance(one, evaluators.TodosOpen):
                if not config.todos.enabled:
                    raise GatewayConfigError("loop evaluator 'todos_open' needs todos.enabled")
                if one.only_in_execute and not config.modes.enabled:
                    raise GatewayConfigError(
                        "loop evaluator 'todos_open' with only_in_execute needs modes.enabled"
                    )
        return cls(
            config,
            checks=guardrails.build_guardrails(config.guardrails),
            rewriters=build_rewriters(config.rewriters),
            loop_evaluators=built_evaluators,
            program=(
                load_program(config.program, config.program_options)
                if config.kind == "program" and config.program
                else None
            ),
        )

    # -- middleware ------------------------------------------------------------------------

    def refuse(self, inputs: Sequence[ChatMessage]) -> guardrails.Refusal | None:
        """The refusal that ends the run before any model call, or None."""
        return guardrails.check(self.guardrails, inputs)

    def rewrite(self, message: ChatMessage) -> tuple[ChatMessage, str | None]:
        """The final assistant message after the output rewriters, and the text appended to it
        (to stream as one more delta; "" for none, None if streamed text was changed)."""
        return rewrite_final(message, self.rewriters)

    def user_error(self, exc: BaseException) -> ErrorInfo:
        """What the user reads when the run fails with `exc`."""
        return user_error(exc, self.config.errors)

    # -- tools, instructions, context -----------------------------------------------------

    @property
    def tools(self) -> list[ToolSpec]:
        """Tools the gateway runs itself; offer them to the model with the agent's tools."""
        return list(self._tools)

    def handles(self, name: str) -> bool:
        return name in self._tool_names

    def check_tool_names(self, agent_tools: Sequence[str]) -> None:
        """An agent may not list a tool executor tool under a harness tool's name."""
        clash = sorted(self._tool_names.intersection(agent_tools))
        if clash:
            raise GatewayConfigError(f"tools {clash} are the harness's own; remove them")

    async def call_tool(
        self, state: SessionState, call: FunctionCallContent
    ) -> FunctionResultContent:
        """Run a todo or mode tool call against the session's state bag (compare-and-set).
        Other writers winning every attempt is an error result the model may retry; a stored
        value of the wrong shape raises `StateInvalid`."""
        try:
            return await self._call_tool(state, call)
        except StateConflict as exc:
            return FunctionResultContent(
                call_id=call.call_id, error=f"{exc.message}; try the call again"
            )

    async def _call_tool(
        self, state: SessionState, call: FunctionCallContent
    ) -> FunctionResultContent:
        if call.name in todos.TOOL_NAMES and self.config.todos.enabled:

            def change_todos(raw: Any) -> tuple[Any, FunctionResultContent]:
                before = _todos(raw)
                after, result = todos.apply(before, call)
                return (raw if after == before else todo_state.dump(after)), result

            return await state.change(todo_state.STATE_KEY, change_todos)
        if call.name in modes.TOOL_NAMES and self.config.modes.enabled:

            def change_mode(raw: Any) -> tuple[Any, FunctionResultContent]:
                before = self._mode(raw)
                after, result = modes.apply(before, call)
                return (raw if after == before else mode_state.dump(after)), result

            return await state.change(mode_state.STATE_KEY, change_mode)
        return FunctionResultContent(
            call_id=call.call_id, error=f"no tool named {call.name[:64]!r} is available"
        )

    def instructions(self, bag: Mapping[str, Any]) -> str:
        """Text to append to the agent's system prompt ("" when nothing is enabled)."""
        parts = []
        if self.config.todos.enabled:
            parts.append(self.config.todos.instructions or todos.DEFAULT_INSTRUCTIONS)
        if self.config.modes.enabled:
            template = self.config.modes.instructions or modes.DEFAULT_INSTRUCTIONS
            parts.append(modes.instructions(self._mode(bag.get(mode_state.STATE_KEY)), template))
        return "\n".join(part.strip() + "\n" for part in parts)

    def mode_notice(self, bag: Mapping[str, Any]) -> ChatMessage | None:
        """The one-off message telling the model a host switched the mode, if one did."""
        if not self.config.modes.enabled:
            return None
        return modes.notification(self._mode(bag.get(mode_state.STATE_KEY)))

    async def acknowledge_mode(self, state: SessionState) -> None:
        """Clear the host's switch note once `mode_notice` went out."""
        if not self.config.modes.enabled:
            return

        def clear(raw: Any) -> tuple[Any, None]:
            before = self._mode(raw)
            after = modes.acknowledged(before)
            return (raw if after == before else mode_state.dump(after)), None

        await state.change(mode_state.STATE_KEY, clear)

    def todo_message(self, bag: Mapping[str, Any]) -> ChatMessage | None:
        """The `### Current todo list` message for the next model call, or None."""
        if not (self.config.todos.enabled and self.config.todos.inject_message):
            return None
        return todos.context_message(
            _todos(bag.get(todo_state.STATE_KEY)), self.config.todos.format
        )

    # -- loop mode ------------------------------------------------------------------------

    def next_pass(
        self,
        bag: Mapping[str, Any],
        *,
        iteration: int,
        answer: str,
    ) -> evaluators.Continue | evaluators.Stop:
        """After pass `iteration` (1-based) ended with `answer`: go on, or stop and why."""
        if not self.config.loop.enabled:
            return evaluators.Stop(reason="done")
        context = evaluators.LoopContext(
            iteration=iteration,
            state=bag,
            answer=answer,
            default_mode=self.config.modes.default,
        )
        return evaluators.decide(
            self.evaluators,
            context,
            max_loop_iterations=self.config.loop.max_loop_iterations,
        )

    def _mode(self, raw: Any) -> mode_state.ModeState:
        try:
            return mode_state.load(raw, self.config.modes.default)
        except msgspec.ValidationError as exc:
            raise StateInvalid(mode_state.STATE_KEY, str(exc)) from None


def _todos(raw: Any) -> todo_state.TodoState:
    try:
        return todo_state.load(raw)
    except msgspec.ValidationError as exc:
        raise StateInvalid(todo_state.STATE_KEY, str(exc)) from None


def with_context(view: Sequence[ChatMessage], extra: Sequence[ChatMessage]) -> list[ChatMessage]:
    """`view` with `extra` added as late as possible but never inside an open tool-call group
    (between an assistant message that calls tools and the tool messages answering it), where
    a provider would reject the prompt."""
    messages = list(view)
    if not extra:
        return messages
    at = len(messages)
    while at > 0 and _inside_group(messages, at):
        at -= 1
    return [*messages[:at], *extra, *messages[at:]]


def _inside_group(messages: Sequence[ChatMessage], at: int) -> bool:
    """True if a message put at index `at` would sit inside a tool-call group."""
    before = messages[at - 1]
    if at < len(messages) and messages[at].role == "tool":
        return True
    if before.role == "assistant" and before.function_calls:
        return True
    if before.role == "tool":
        # After tool results the group is closed only when every call has its result.
        index = at - 1
        answered: set[str] = set()
        while index >= 0 and messages[index].role == "tool":
            answered.update(r.call_id for r in messages[index].function_results)
            index -= 1
        if index >= 0 and messages[index].role == "assistant":
            wanted = {c.call_id for c in messages[index].function_calls}
            return not wanted <= answered
    return False
