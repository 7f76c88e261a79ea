"""Where a replica runs, as discovery reports it: every replica publishes its host and pid, and
`runbus status` shows them per replica."""

import os
import socket

from runbus.commands.status import summarise
from runbus.discovery import Ping, join
from runbus.instance import instance_metadata


def test_a_replica_publishes_its_host_and_process_id() -> None:
    assert instance_metadata() == {"host": socket.gethostname(), "pid": str(os.getpid())}


def test_status_shows_each_replicas_host_and_pid_from_its_metadata() -> None:
    pings = [
        Ping(id="a", name="history", metadata={"host": "pod-a", "pid": "7"}),
        Ping(id="b", name="history", metadata={"host": "pod-b", "pid": "9"}),
        Ping(id="c", name="history"),
    ]

    status = summarise("nats://x", join(pings, [], []))

    (history,) = [s for s in status.services if s.name == "history"]
    assert [(r.host, r.pid) for r in history.instances] == [
        ("pod-a", "7"),
        ("pod-b", "9"),
        ("", ""),
    ]
