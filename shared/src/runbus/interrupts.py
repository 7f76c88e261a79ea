"""A tool asks the run's owner a question mid-call: `interrupt("Window or aisle?")`.

The first time, the call stops there (`Interrupt`) and the run waits, as for an approval, with
the question as the request's reason; the owner answers by approving with a note. The tool is
then called again from the start, and the same `interrupt` returns that note. A tool that
changes things cannot ask (it would run twice): it asks before it acts, or not at all.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal

Answer = tuple[Literal["answered", "declined"], str] | None
"""How the owner answered a question: ("answered", text), ("declined", why), None: not yet."""

_ANSWERS: ContextVar[Callable[[str], Answer] | None] = ContextVar("runbus_answers", default=None)


class Interrupt(Exception):
    """Raised by `interrupt` the first time: the tool executor turns it into a question."""

    def __init__(self, question: str) -> None:
        super().__init__(question)
        self.question = question


class QuestionDeclined(Exception):
    """The owner declined to answer (or let the question expire): the call fails with it."""

    def __init__(self, question: str, why: str) -> None:
        super().__init__(f"the user did not answer {question!r} ({why})")
        self.question = question
        self.why = why


def interrupt(question: str) -> str:
    """The owner's answer to `question`; the first time, stops the call until they answer."""
    answers = _ANSWERS.get()
    answer = answers(question) if answers is not None else None
    match answer:
        case None:
            raise Interrupt(question)
        case ("answered", text):
            return text
        case ("declined", why):
            raise QuestionDeclined(question, why)
    raise AssertionError(answer)


@contextmanager
def answering(answers: Callable[[str], Answer]) -> Iterator[None]:
    """Calls made inside find their answers through `answers` (the tool executor's)."""
    token = _ANSWERS.set(answers)
    try:
        yield
    finally:
        _ANSWERS.reset(token)
