"""`RunState`: what a run started from, where it stands, and what it has not stored yet.

The stages read and move it; `record` is the one way progress is made. A redelivered run
loads it from the messages it checkpointed (`RunState.load`) and goes on from there.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from runbus.messages import ChatMessage, FunctionCallContent
from runbus.messages.history import REPAIR_SUFFIX
from runbus.messages.sessions import SessionOpened

from .checkpoints import Checkpointer


def message_id(run_id: str, part: str) -> str:
    """Id of a message a run makes: `<run_id>:<part>`. The colon cannot occur in a run id, so
    a run's own messages are found in history by prefix without matching another run's."""
    return f"{run_id}:{part}"


@dataclass(frozen=True)
class Context:
    """What context providers add to a run (`context.py`): at its start, `recalled` and
    `notices`; before each step, `instructions` and `messages`."""

    recalled: list[ChatMessage] = field(default_factory=list)
    """Put right after the instructions, before the session's history (recalled memory)."""
    notices: list[ChatMessage] = field(default_factory=list)
    """Put just before the run's input (a host's mode switch, told once)."""
    instructions: str = ""
    """Added to the agent's instructions in the system message."""
    messages: list[ChatMessage] = field(default_factory=list)
    """Put as late as they may go in one step's copy of the prompt only (the todo list)."""


@dataclass
class RunState:
    run_id: str
    inputs: list[ChatMessage]
    """This run's input: the resumed copy from history, else the request's."""
    earlier: list[ChatMessage]
    """The session's history before this run."""
    context: Context
    """What the context providers added when the run started (recalled memory, notices)."""
    prompt: list[ChatMessage]
    """What the model is given (before each step's compaction and step context): the
    instructions, the context, the history, the input, then what this run produced."""
    checkpoints: Checkpointer
    """What the run produced and has not stored yet, and where the session's history ends."""
    step: int = 0
    """Model replies so far."""
    response: list[ChatMessage] = field(default_factory=list)
    """What the run produced, in order: model replies, tool results, loop feedback."""
    pending_calls: list[FunctionCallContent] = field(default_factory=list)
    """Calls of the last model reply that have no results yet (a resumed run runs them)."""
    finished: bool = False
    final_text: str | None = None
    """Set when the run ends on something other than an assistant answer (a terminate)."""

    @classmethod
    def load(
        cls,
        run_id: str,
        opened: SessionOpened,
        inputs: list[ChatMessage],
        context: Context,
        instructions: ChatMessage,
        checkpoints: Checkpointer,
        checkpointed: Sequence[ChatMessage] = (),
    ) -> "RunState":
        """The state of a run on the session as opened: a new run's, or — when history or the
        run's own events (`checkpointed`) hold messages of this run (a redelivery) — where
        that one stood, so no model or tool call that already has a result is repeated."""
        own = message_id(run_id, "")
        earlier = [m for m in opened.messages if not m.message_id.startswith(own)]
        stored = [
            m
            for m in opened.messages
            if m.message_id.startswith(own) and not m.message_id.endswith(REPAIR_SUFFIX)
        ]
        # History got a prefix of what the run produced; its events carry the rest.
        appended = {m.message_id for m in stored}
        held = [
            m for m in checkpointed if m.message_id.startswith(own) and m.message_id not in appended
        ]
        mine = [*stored, *(msgspec.structs.replace(m, source="chat_history") for m in held)]
        resumed_inputs = [m for m in mine if m.role == "user" and ":in" in m.message_id]
        # The owner's notes added at a pause (`<run_id>:note…`) are the run's too.
        response = [m for m in mine if m.role in ("assistant", "tool") or ":note" in m.message_id]
        checkpoints.history_end = opened.history_end
        checkpoints.incarnation = opened.record.incarnation
        checkpoints.resume(held)
        if not resumed_inputs:
            checkpoints.add(inputs)
        state = cls(
            run_id=run_id,
            inputs=resumed_inputs or inputs,
            earlier=earlier,
            context=context,
            prompt=[
                instructions,
                *context.recalled,
                *earlier,
                *context.notices,
                *(resumed_inputs or inputs),
                *response,
            ],
            checkpoints=checkpoints,
            step=sum(1 for m in response if m.role == "assistant"),
            response=response,
        )
        if response and response[-1].role == "assistant":
            state.pending_calls = response[-1].function_calls
            state.finished = not state.pending_calls
        return state

    def record(self, message: ChatMessage, *, urgent: bool = False) -> None:
        """The run produced `message`: the model reads it next, it is part of the response (an
        assistant message is a step), and it is stored with the next checkpoint (`urgent`:
        one starts now, in the background)."""
        self.prompt.append(message)
        self.response.append(message)
        if message.role == "assistant":
            self.step += 1
        self.checkpoints.add([message], urgent=urgent)

    def finish(self, final_text: str | None = None) -> None:
        self.finished = True
        self.final_text = final_text

    @property
    def history_length(self) -> int:
        """Messages of the session once this run's are stored (what the release records)."""
        return len(self.earlier) + len(self.inputs) + len(self.response)
