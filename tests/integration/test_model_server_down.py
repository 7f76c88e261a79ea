"""A model server that is down, as an operator sees it: a model router whose route points at a
closed port is degraded — `runbus status` names the server, its route and the setting, one
log line says it went down — and once a server answers on that port, the report clears."""

import argparse
import json

import pytest
from structlog.testing import capture_logs

from runbus.commands import status
from runbus.progress import Progress
from runbus.settings import Settings
from tests.helpers import eventually
from tests.integration.model_provider import loopback, router
from tests.integration.test_model_router_fallback import closed_port
from tests.stack import SecuredNats, Stack


def routes(url: str) -> str:
    return f"""
[backends.lb]
base_url = "{url}"
[routes.local]
[[routes.local.targets]]
backend = "lb"
model = "small-1"
"""


async def runbus_status(
    nats_server: SecuredNats, capsys: pytest.CaptureFixture[str], *, as_json: bool = False
) -> tuple[int, str]:
    """`runbus status --wait 2` (`--json`) as the monitor, against the test's bus: a replica
    slow to answer discovery on a loaded machine is still counted."""
    settings = Settings(nats_url=nats_server.client_url, data_dir=str(nats_server.data_dir))
    args = argparse.Namespace(json=as_json, ping=None, local=False, pid=None, wait=2.0)
    capsys.readouterr()
    code = await status.handle(settings, args)
    return code, capsys.readouterr().out


async def test_a_model_server_that_is_down_is_named_by_status_until_it_answers(
    nats_server: SecuredNats, stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    port = closed_port()
    url = f"http://127.0.0.1:{port}/v1"
    reporter = Progress("model_router")
    with capture_logs() as logs:
        # A second router replica beside the stack's own, its one route on the closed port.
        async with router(nats_server.url, routes(url), reporter=reporter) as replica:
            reporter.attach(replica.nc)
            reporter.ready()
            await eventually(lambda: reporter.state == "degraded", 30)

            down_code, down = await runbus_status(nats_server, capsys)

            async with loopback(port=port):
                await eventually(lambda: reporter.state == "ready", 30)
                up_code, up = await runbus_status(nats_server, capsys, as_json=True)

    reason = (
        f'model server {url} (route "local", backend "lb" in RUNBUS_MODEL_ROUTES) is '
        "unreachable: connection refused"
    )
    assert down_code == 0, "a degraded router is ready: the check passes"
    [row] = [line for line in down.splitlines() if line.split()[:2] == ["model_router", "2/2"]]
    assert "2/2 ready, 1 degraded" in row, down
    assert f"model_router ({reporter.instance}) degraded: {reason}" in down.splitlines()

    assert up_code == 0
    report = json.loads(up)
    assert report["degraded"] == []
    [router_status] = [s for s in report["services"] if s["name"] == "model_router"]
    assert router_status["ready"] == 2

    events = [(e["event"], e.get("dependency")) for e in logs if e["event"].startswith("dep")]
    assert events == [("dependency_down", url), ("dependency_up", url)]
    [went_down] = [e for e in logs if e["event"] == "dependency_down"]
    assert went_down["reason"] == reason
