"""The deployments' probe command checks *this* replica: a hung replica fails its own probe
within the probe's timeout while its siblings pass theirs, on the same bus."""

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from tests.helpers import eventually
from tests.stack import SecuredNats

REPO = Path(__file__).resolve().parents[2]
RUNBUS = str(Path(sys.executable).parent / "runbus")
REPLICAS = 3


def liveness_probe(service: str) -> tuple[list[str], int]:
    """The liveness probe command of `service`'s Kubernetes deployment and its timeout."""
    manifest = REPO / "deploy" / "k8s" / f"{service.replace('_', '-')}.yaml"
    for document in yaml.safe_load_all(manifest.read_text()):
        if document and document.get("kind") == "Deployment":
            (container,) = document["spec"]["template"]["spec"]["containers"]
            probe = container["livenessProbe"]
            return probe["exec"]["command"], probe["timeoutSeconds"]
    raise AssertionError(f"{manifest} has no Deployment")


@pytest.fixture
async def replicas(
    nats_server: SecuredNats, tmp_path: Path
) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """Three history replicas as their own processes, each logging to its own file."""
    env = {**os.environ, "RUNBUS_NATS_URL": nats_server.url, "RUNBUS_DATA_DIR": str(tmp_path)}
    started: list[asyncio.subprocess.Process] = []
    logs = [tmp_path / f"history-{i}.log" for i in range(REPLICAS)]
    try:
        for log in logs:
            with log.open("wb") as out:
                started.append(
                    await asyncio.create_subprocess_exec(
                        sys.executable, "-m", "runbus_history", env=env, stdout=out, stderr=out
                    )
                )
        await eventually(lambda: all(b"service_started" in log.read_bytes() for log in logs), 60)
        yield started
    finally:
        for process in started:
            if process.returncode is None:
                process.send_signal(signal.SIGCONT)
                process.terminate()
        for process in started:
            await process.wait()


async def probe(command: list[str], url: str, *extra: str) -> tuple[int, float, str]:
    """Run a probe command as the kubelet would (in the pod: same host); its exit code, how
    long it took and what it printed."""
    began = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        RUNBUS,
        *command[1:],
        *extra,
        env={**os.environ, "RUNBUS_NATS_URL": url},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, time.monotonic() - began, out.decode()


async def test_a_hung_replica_fails_its_own_liveness_probe_while_its_siblings_pass(
    replicas: list[asyncio.subprocess.Process], nats_server: SecuredNats
) -> None:
    command, timeout = liveness_probe("history")
    hung, *siblings = replicas
    # Here every replica shares one host, so `--pid` names the process a pod would hold alone.
    healthy_before = await probe(command, nats_server.url, "--pid", str(hung.pid))

    hung.send_signal(signal.SIGSTOP)
    hung_probe = await probe(command, nats_server.url, "--pid", str(hung.pid))
    sibling_probes = [await probe(command, nats_server.url, "--pid", str(p.pid)) for p in siblings]
    hung.send_signal(signal.SIGCONT)
    recovered = await probe(command, nats_server.url, "--pid", str(hung.pid))

    assert command == ["runbus", "status", "--ping", "history", "--local"]
    assert healthy_before[0] == 0, healthy_before
    code, took, said = hung_probe
    assert code == 1, said
    assert took < timeout, f"the probe of a hung replica took {took:.1f}s (timeout {timeout}s)"
    assert f"with pid {hung.pid}" in said
    assert [code for code, _, _ in sibling_probes] == [0] * len(siblings), sibling_probes
    assert recovered[0] == 0, recovered
