"""Loop mode: after the model gives its answer, evaluators decide whether the agent goes on.

Evaluators are asked in the order configured; the first that wants to continue wins and its
feedback becomes the next user turn. The loop stops when none wants to continue, when an
approval is pending (a human has to act first), or at `max_loop_iterations` passes — checked
before any evaluator, so a model that never converges cannot spin forever.

    [harness.loop]
    enabled = true
    max_loop_iterations = 10
    evaluators = [{name = "todos_open", only_in_execute = true}]
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from runbus import modes, todos
from runbus.messages import ChatMessage, TextContent

from ._registry import Registry, plugin_name
from .errors import StateInvalid

DEFAULT_MAX_LOOP_ITERATIONS: Final = 10


@dataclass(frozen=True)
class LoopContext:
    """What an evaluator sees after a pass of the agent."""

    iteration: int
    """Passes finished so far in this run (1 after the first answer)."""
    state: Mapping[str, Any]
    """The session's state bag after the pass."""
    answer: str
    """The final assistant text of the pass."""
    default_mode: modes.Mode = "plan"
    """The agent's mode when the state bag has none."""

    @property
    def mode(self) -> modes.Mode:
        try:
            return modes.load(self.state.get(modes.STATE_KEY), self.default_mode).mode
        except msgspec.ValidationError as exc:
            raise StateInvalid(modes.STATE_KEY, str(exc)) from None


class Evaluator(
    msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, tag_field="name"
):
    """Decides whether the agent goes on. Subclasses are registered with `@evaluator`."""

    def evaluate(self, context: LoopContext) -> str | None:
        """Feedback for the next pass, or None when this evaluator does not ask for one."""
        raise NotImplementedError


EVALUATORS: Final = Registry("loop evaluator", Evaluator)
evaluator = EVALUATORS.register


@evaluator
class TodosOpen(Evaluator, frozen=True, tag="todos_open"):
    """Continue while the todo list has open items; the feedback lists them."""

    only_in_execute: bool = False
    """Only in `execute` mode (in `plan` mode open items wait for the user's approval)."""
    message: str = (
        "These todo items are still open. Continue working on them; mark each one complete "
        "with todos_complete when it is done, or remove it with todos_remove if it is no "
        "longer needed."
    )
    """Text above the list of open items."""

    def evaluate(self, context: LoopContext) -> str | None:
        if self.only_in_execute and context.mode != "execute":
            return None
        try:
            state = todos.load(context.state.get(todos.STATE_KEY))
        except msgspec.ValidationError as exc:
            raise StateInvalid(todos.STATE_KEY, str(exc)) from None
        if not state.open_items:
            return None
        lines = "\n".join(todos.render_item(item) for item in state.open_items)
        return f"{self.message}\n{lines}"


def build_evaluators(tables: Sequence[Mapping[str, Any]]) -> list[Evaluator]:
    return EVALUATORS.build(tables)


StopReason = Literal["done", "iteration_cap"]


class Continue(msgspec.Struct, kw_only=True, frozen=True):
    feedback: str
    """The next user turn, written on the user's behalf."""
    evaluator: str
    """Name of the evaluator that asked for it."""


class Stop(msgspec.Struct, kw_only=True, frozen=True):
    reason: StopReason
    """Why the loop ends: no evaluator asked to go on, or the bound. (A pass never ends with
    an approval pending: the run waits for the decision inside the pass.)"""


def decide(
    evaluators: Sequence[Evaluator],
    context: LoopContext,
    *,
    max_loop_iterations: int = DEFAULT_MAX_LOOP_ITERATIONS,
) -> Continue | Stop:
    """Whether the agent makes another pass after the one that just ended."""
    if context.iteration >= max_loop_iterations:
        return Stop(reason="iteration_cap")
    for one in evaluators:
        feedback = one.evaluate(context)
        if feedback is not None:
            return Continue(feedback=feedback, evaluator=plugin_name(one))
    return Stop(reason="done")


def feedback_message(decision: Continue, message_id: str) -> ChatMessage:
    """The next pass's input: a user message the gateway writes on the user's behalf. It is
    stamped `external` so history keeps it and a resumed run sees what the model answered."""
    return ChatMessage(
        role="user", contents=[TextContent(text=decision.feedback)], message_id=message_id
    )
