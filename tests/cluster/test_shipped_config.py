"""The cluster harness runs the shipped NATS configuration, not a copy of it: the nodes read
deploy/nats/cluster.conf with only its store path moved, and include deploy/nats/auth.conf
itself. If the shipped files change a setting the harness's results rest on, or the harness
starts changing more than that path, these fail."""

import difflib
import re
from pathlib import Path
from typing import Final

import yaml

from runbus import busauth
from tests.cluster import harness

COMPOSE_CLUSTER: Final = harness.ROOT / "compose.cluster.yaml"
EXPECTED: Final = {
    "server_name": "$NATS_SERVER_NAME",
    "port": str(harness.CLIENT_PORT),
    "http_port": str(harness.MONITOR_PORT),
    "max_payload": "8MB",
    "jetstream.store_dir": "/data",
    "jetstream.sync_interval": "always",
    "cluster.name": "runbus",
    "cluster.port": str(harness.ROUTE_PORT),
    "cluster.authorization.user": busauth.ROUTE_USER,
    "cluster.authorization.password": "$NATS_ROUTE_PASSWORD",
    "cluster.routes": "$NATS_ROUTE_URLS",
    "include": "./auth.conf",
}
"""Every setting of cluster.conf, as the harness (and this page's guarantees) expect it: a new
setting, a removed one or a changed value fails until it is looked at here."""


def settings(text: str) -> dict[str, str]:
    """`block.key` → value of a nats-server config (the subset its syntax cluster.conf uses:
    `key: value`, `key { … }`, `include file`, `#` comments)."""
    found: dict[str, str] = {}
    blocks: list[str] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line == "}":
            blocks.pop()
        elif match := re.fullmatch(r"(\w+)\s*\{", line):
            blocks.append(match[1])
        elif match := re.fullmatch(r"include\s+(\S+)", line):
            found[".".join([*blocks, "include"])] = match[1]
        elif match := re.fullmatch(r"(\w+)\s*[:=]\s*(.+)", line):
            found[".".join([*blocks, match[1]])] = match[2].strip().strip('"')
        else:
            raise AssertionError(f"cluster.conf line the harness cannot read: {raw!r}")
    assert not blocks, f"unclosed blocks {blocks}"
    return found


def test_the_shipped_cluster_config_holds_every_setting_the_harness_measured() -> None:
    assert settings(harness.CLUSTER_CONF.read_text()) == EXPECTED


def test_a_node_runs_the_shipped_config_with_only_its_store_path_moved(tmp_path: Path) -> None:
    shipped = harness.CLUSTER_CONF.read_text().splitlines()
    served = harness.node_config(tmp_path / "store").splitlines()

    changed = [
        line
        for line in difflib.unified_diff(shipped, served, lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert changed == ["-  store_dir: /data", f'+  store_dir: "{tmp_path / "store"}"']


def test_compose_runs_the_same_files_and_replicas_as_the_harness() -> None:
    compose = yaml.safe_load(COMPOSE_CLUSTER.read_text())
    nodes = ["nats", "nats-2", "nats-3"]
    mounts = {
        node: sorted(v.split(":")[0] for v in compose["services"][node]["volumes"])
        for node in nodes
    }
    service_env = compose["services"]["gateway"]["environment"]

    for node in nodes:
        assert "./deploy/nats/cluster.conf" in mounts[node]
        assert "./deploy/nats/auth.conf" in mounts[node]
        assert compose["services"][node]["environment"]["NATS_SERVER_NAME"] == (
            "nats-1" if node == "nats" else node
        )
    assert service_env["RUNBUS_STREAM_REPLICAS"] == harness.STREAM_REPLICAS
