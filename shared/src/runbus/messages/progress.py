"""A service process's start-up progress: what it is doing and, while it waits, on what."""

from typing import Literal

import msgspec

from ._base import Message

ProgressState = Literal["starting", "waiting", "ready", "stopping"]


class ServiceProgress(Message, frozen=True, tag="service.progress"):
    """Published by a process while it starts (again at every change and once a second), and
    once when it is ready; `runbus up`, the test stack and `runbus status` read it."""

    service: str
    """Service name (`memory`)."""
    instance: str
    """This process: `<host>:<pid>`."""
    state: ProgressState
    """`starting`: working through its steps; `waiting`: a dependency is down and it retries;
    `ready`: answering requests; `stopping`: draining."""
    step: str
    """What it is doing now, for a person (`opening the memory store`)."""
    reason: str = ""
    """While `waiting`: what is down, naming the URL and the setting (`Qdrant at
    http://q:6333 (RUNBUS_QDRANT_URL): connection refused`)."""
    attempt: int = 0
    """While `waiting`: how many times it has tried so far."""
    elapsed: float = 0.0
    """Seconds since the process started."""


SERVICE_PROGRESS_DECODER = msgspec.json.Decoder(ServiceProgress)
