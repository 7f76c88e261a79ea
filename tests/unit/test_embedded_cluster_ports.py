"""An embedded cluster picks its route ports free and binds them only when its nodes start;
another process may take one in between. The cluster then starts again on new ports, and a
start that fails for good leaves no node running."""

import re
import socket
from pathlib import Path

import pytest

from runbus import embedded
from runbus.embedded import EmbeddedNatsCluster, EmbeddedNatsError


def route_port(config: Path) -> int:
    found = re.search(r'listen: "127\.0\.0\.1:(\d+)"', config.read_text())
    assert found is not None
    return int(found.group(1))


def test_a_cluster_whose_route_port_was_taken_starts_on_new_ones(tmp_path: Path) -> None:
    cluster = EmbeddedNatsCluster(tmp_path / "cluster", size=3)
    config = cluster.nodes[1].config_file
    assert config is not None
    taken_port = route_port(config)
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", taken_port))
        taken.listen()
        with cluster:
            assert all(node.running for node in cluster.nodes)
            assert route_port(config) != taken_port


def test_a_cluster_that_cannot_start_leaves_no_node_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held: list[socket.socket] = []
    picked = iter(range(1000))
    free_port = embedded._free_port

    def third_port_already_taken() -> int:
        """Every third route port (the last node's) is held by another socket."""
        if next(picked) % 3 != 2:
            return free_port()
        busy = socket.socket()
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        held.append(busy)
        return int(busy.getsockname()[1])

    monkeypatch.setattr(embedded, "_free_port", third_port_already_taken)
    cluster = EmbeddedNatsCluster(tmp_path / "cluster", size=3)
    try:
        with pytest.raises(EmbeddedNatsError):
            cluster.start()
        assert not any(node.running for node in cluster.nodes)
    finally:
        cluster.stop()
        for busy in held:
            busy.close()
