"""A service process's start-up progress: what it is doing and, while it waits, on what; once
it serves, which dependency it does without."""

from typing import Literal

import msgspec

from ._base import Message

ProgressState = Literal["starting", "waiting", "ready", "degraded", "stopping"]


class ServiceProgress(Message, frozen=True, tag="service.progress"):
    """Published by a process while it starts (again at every change and once a second), once
    when it is ready, and once a second while it is degraded; `runbus up`, the test stack and
    `runbus status` read it."""

    service: str
    """Service name (`memory`)."""
    instance: str
    """This process: `<host>:<pid>`."""
    state: ProgressState
    """`starting`: working through its steps; `waiting`: a dependency is down and it retries;
    `ready`: answering requests; `degraded`: answering requests, but a dependency it serves
    some of them with is down (a model server of one route: other routes and fallbacks still
    answer); `stopping`: draining."""
    step: str
    """What it is doing now, for a person (`opening the memory store`)."""
    reason: str = ""
    """While `waiting` or `degraded`: what is down, naming the URL and the setting (`Qdrant at
    http://q:6333 (RUNBUS_QDRANT_URL): connection refused`); several are joined by `; `."""
    attempt: int = 0
    """While `waiting`: how many times it has tried so far."""
    elapsed: float = 0.0
    """Seconds since the process started."""


SERVICE_PROGRESS_DECODER = msgspec.json.Decoder(ServiceProgress)
