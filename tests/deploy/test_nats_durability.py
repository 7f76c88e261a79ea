"""Every NATS runbus starts or ships writes to disk before it acknowledges
(`sync_interval: always`): the deploy configs, the compose files and Helm values that run them,
the configuration a local stack generates, the embedded server and cluster, and any test or
bench fixture that starts nats-server itself. Configs are found by scanning, so a new one
without the setting fails here; each is also started once on the installed nats-server, which
must report `sync_always` for it."""

import asyncio
import json
import re
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import nkeys
import pytest
import yaml
from structlog.testing import capture_logs

from runbus import busauth
from runbus.embedded import EmbeddedNats, EmbeddedNatsCluster, nats_server_binary
from tests.helpers import eventually

ROOT: Final = Path(__file__).resolve().parents[2]
DEPLOY_NATS: Final = ROOT / "deploy" / "nats"
SKIPPED_DIRS: Final = {".git", ".venv", ".runbus", "node_modules", "__pycache__", ".mypy_cache"}
SYNC_ALWAYS: Final = re.compile(r"^\s*sync_interval:\s*always\s*$", re.MULTILINE)
JETSTREAM_BLOCK: Final = re.compile(r"^\s*jetstream\s*\{", re.MULTILINE)
INCLUDE: Final = re.compile(r"^\s*include\s+\"?([^\"\s]+)\"?", re.MULTILINE)

STACK: Final = busauth.StackSecrets(
    service_password="service-secret",
    auth_password="auth-secret",
    monitor_password="monitor-secret",
    issuer_seed=nkeys.encode_seed(bytes(range(32)), nkeys.PREFIX_BYTE_ACCOUNT),
)
DEPLOY_ENV: Final = {
    "NATS_SERVER_NAME": "nats-1",
    "NATS_RUNBUS_AUTH_PASSWORD": "auth",
    "NATS_RUNBUS_SERVICE_PASSWORD": "service",
    "NATS_RUNBUS_MONITOR_PASSWORD": "monitor",
    "NATS_RUNBUS_AUTH_ISSUER": STACK.issuer_public_key,
    "NATS_SYS_PASSWORD": "sys",
    "NATS_ROUTE_PASSWORD": "route",
    "NATS_ROUTE_URLS": "[nats-route://runbus-route:route@127.0.0.1:1]",
}

# Python files that run the nats-server binary themselves, and what covers the configuration
# each starts it with. A new one fails the scan below until it is added (and covered) here.
LAUNCHERS: Final = {
    "shared/src/runbus/embedded.py": "test_the_embedded_server_and_cluster_sync_always",
    "tests/deploy/test_nats_auth.py": "deploy/nats/nats-auth.conf, as compose runs it",
    "tests/deploy/test_nats_cluster_auth.py": "cluster.conf from compose.cluster.yaml's command",
    "tests/deploy/test_deploy_files.py": "`nats-server -t` only: checks, starts nothing",
    "tests/deploy/test_nats_durability.py": "reported_sync_always",
    "tests/cluster/harness.py": "test_every_node_runs_the_shipped_settings (/varz sync_always)",
}
LAUNCH: Final = re.compile(r"nats_server_binary\(\)|parent / \"nats-server\"")


def repo_files(pattern: str) -> Iterator[Path]:
    for path in ROOT.rglob(pattern):
        if not SKIPPED_DIRS.intersection(path.relative_to(ROOT).parts):
            yield path


def with_includes(config: Path) -> str:
    """A config's text followed by the text of every file it includes (recursively)."""
    text = config.read_text()
    included = [with_includes(config.parent / name) for name in INCLUDE.findall(text)]
    return "\n".join([text, *included])


def effective_jetstream(text: str) -> str:
    """The body of the last `jetstream { … }` block: a later block replaces an earlier one."""
    blocks = re.findall(r"^\s*jetstream\s*\{(.*?)^\s*\}", text, re.MULTILINE | re.DOTALL)
    return blocks[-1] if blocks else ""


def syncs_always(text: str) -> bool:
    return bool(SYNC_ALWAYS.search(effective_jetstream(text)))


def reported_sync_always(
    config: Path, *, env: Mapping[str, str] | None = None, args: tuple[str, ...] = ()
) -> bool:
    """Start nats-server once with `config` and read `sync_always` from its /varz."""
    ports = Path(tempfile.mkdtemp(prefix="runbus-durability-"))
    log = ports / "nats.log"
    process = subprocess.Popen(
        [
            str(nats_server_binary()),
            "-c", str(config),
            "-a", "127.0.0.1", "-p", "-1", "-m", "-1",
            "--ports_file_dir", str(ports),
            "--log", str(log),
            *args,
        ],
        env=dict(env or {}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        monitoring = monitoring_url(process, ports / f"nats-server_{process.pid}.ports", log)
        with urllib.request.urlopen(f"{monitoring}/varz", timeout=5) as response:
            varz: dict[str, Any] = json.load(response)
        return bool(varz["jetstream"]["config"].get("sync_always"))
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(ports, ignore_errors=True)


def monitoring_url(process: "subprocess.Popen[bytes]", ports_file: Path, log: Path) -> str:
    """The server's monitoring URL, once its ports file is written whole."""

    def reported() -> str:
        if process.poll() is not None:
            text = log.read_text() if log.exists() else ""
            raise AssertionError(f"nats-server refused its config: {text[-2000:]}")
        url: str = json.loads(ports_file.read_text())["monitoring"][0]
        return url

    return asyncio.run(
        eventually(reported, retrying=(OSError, ValueError, KeyError), what="nats-server's ports")
    )


def deploy_copy(folder: Path) -> Path:
    """deploy/nats copied with its store, route port and names made local to `folder`."""
    copy = folder / "nats"
    shutil.copytree(DEPLOY_NATS, copy)
    for config in copy.glob("*.conf"):
        text = config.read_text()
        text = re.sub(r"store_dir: /data$", f'store_dir: "{folder / "data"}"', text, flags=re.M)
        text = re.sub(r"^(\s*)port: 6222$", r"\1port: -1", text, flags=re.M)
        config.write_text(text)
    return copy


# The files shipped in the repository


def test_every_nats_config_file_in_the_repository_with_a_jetstream_block_syncs_always() -> None:
    configs = [path for path in repo_files("*.conf") if JETSTREAM_BLOCK.search(path.read_text())]

    assert configs, "no NATS config found: the scan is broken"
    assert [path for path in configs if not syncs_always(path.read_text())] == []


def compose_nats_configs() -> list[tuple[str, str, Path]]:
    """(compose file, service, repo file) of each config a compose file starts nats-server with."""
    found = []
    for compose in sorted(ROOT.glob("compose*.yaml")):
        document = yaml.safe_load(compose.read_text())
        for name, service in document.get("services", {}).items():
            command = service.get("command")
            if command is None:
                continue
            line = " ".join(command) if isinstance(command, list) else command
            for config in re.findall(r"-c\s+(\S+)", line):
                mounts = dict(
                    reversed(volume.split(":")[:2])
                    for volume in service.get("volumes", [])
                    if volume.startswith("./")
                )
                found.append((compose.name, name, ROOT / mounts[config]))
    return found


def test_every_nats_server_a_compose_file_runs_syncs_always() -> None:
    configs = compose_nats_configs()

    assert {(compose, service) for compose, service, _ in configs} >= {
        ("compose.yaml", "nats"),
        ("compose.cluster.yaml", "nats-2"),
    }
    assert [entry for entry in configs if not syncs_always(with_includes(entry[2]))] == []


def test_the_helm_values_of_every_nats_release_sync_always() -> None:
    values = [(path, yaml.safe_load(path.read_text())) for path in repo_files("*values*.yaml")]
    nats = [
        (path, document)
        for path, document in values
        if isinstance(document, dict) and "jetstream" in document.get("config", {})
    ]

    assert nats, "no NATS Helm values found: the scan is broken"
    for path, document in nats:
        assert document["config"]["jetstream"]["merge"]["sync_interval"] == "always", path


def test_no_kubernetes_manifest_runs_nats_server_outside_the_helm_values() -> None:
    images = [
        path.name
        for path in repo_files("deploy/k8s/*.yaml")
        if re.search(r"image:\s*\"?nats[:@]", path.read_text())
    ]

    assert images == []


def test_every_python_file_that_runs_nats_server_is_covered_here() -> None:
    launchers = {
        path.relative_to(ROOT).as_posix()
        for path in repo_files("*.py")
        if LAUNCH.search(path.read_text())
    }

    assert launchers == set(LAUNCHERS)


def test_every_deploy_config_a_server_starts_with_syncs(tmp_path: Path) -> None:
    copy = deploy_copy(tmp_path)

    assert reported_sync_always(copy / "nats.conf")
    assert reported_sync_always(copy / "nats-auth.conf", env=DEPLOY_ENV)
    assert reported_sync_always(copy / "cluster.conf", env=DEPLOY_ENV)


# The configurations runbus generates and starts


def test_the_generated_stack_config_syncs_always_and_nats_server_applies_it(
    tmp_path: Path,
) -> None:
    config = tmp_path / "nats.conf"
    config.write_text(busauth.server_config(STACK, "always"))

    assert syncs_always(config.read_text())
    assert reported_sync_always(config, args=("-js", "--store_dir", str(tmp_path / "js")))


def test_the_generated_stack_config_syncs_always_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(busauth.SYNC_VARIABLE, raising=False)

    assert syncs_always(busauth.server_config(STACK))


def test_the_embedded_server_and_cluster_sync_always(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(busauth.SYNC_VARIABLE, raising=False)
    with EmbeddedNats(tmp_path / "open") as server:
        open_config = server.durability_file.read_text()
    busauth.secrets_dir(tmp_path).mkdir()
    secured = busauth.write_server_config(tmp_path, STACK)
    open_cluster = EmbeddedNatsCluster(tmp_path / "open-cluster", size=2)
    secured_cluster = EmbeddedNatsCluster(tmp_path / "cluster", size=2, config_file=secured)

    assert syncs_always(open_config)
    for cluster in (open_cluster, secured_cluster):
        for node in cluster.nodes:
            assert node.config_file is not None
            assert syncs_always(with_includes(node.config_file)), node.config_file
    with open_cluster:
        for node in open_cluster.nodes:
            url = f"http://127.0.0.1:{node.monitoring_port}/varz"
            with urllib.request.urlopen(url, timeout=5) as response:
                assert json.load(response)["jetstream"]["config"]["sync_always"] is True


def test_lazy_sync_is_an_opt_out_that_warns_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(busauth.SYNC_VARIABLE, "lazy")

    with capture_logs() as logs, EmbeddedNats(tmp_path / "js") as server:
        config = server.durability_file.read_text()

    assert not syncs_always(config)
    assert not syncs_always(busauth.server_config(STACK))
    (warning,) = [log for log in logs if log["event"] == "nats_fsync_off"]
    assert warning["log_level"] == "warning"
    assert "machine crash" in warning["risk"]


def test_an_unknown_sync_policy_fails_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(busauth.SYNC_VARIABLE, "sometimes")

    with pytest.raises(ValueError, match=busauth.SYNC_VARIABLE):
        EmbeddedNats(tmp_path / "js").start()
