"""What a run's owner reads when the run fails: the agent's `[harness] errors` text for the
code, or the default text for a code whose message runbus does not write for the caller —
never the upstream message (an internal URL) — in the final event and the run record alike."""

from pathlib import Path

import msgspec
import nats
import pytest

from runbus import ops
from runbus.client import RunbusClient
from runbus.errors import ModelError
from runbus.messages import ChatMessage, ModelRequest, RunFailed
from runbus.messages.runs import RunGet
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import load_agents
from runbus_gateway.harness.config import HarnessConfig
from runbus_gateway.harness.user_errors import ErrorMessages
from tests.models import GatedModel
from tests.stack import SecuredNats, start_stack

UPSTREAM = "upstream 500 from https://llm.internal:8443/v1"
BUSY = "The assistant is busy; please try again in a minute."
TRAVEL = msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="gated")
AGENTS = {
    "travel": TRAVEL,
    "mapped": msgspec.structs.replace(
        TRAVEL,
        name="mapped",
        harness=HarnessConfig(errors=ErrorMessages(messages={"model_error": BUSY})),
    ),
}


def _upstream_fails(request: ModelRequest, step: int) -> ChatMessage:
    raise ModelError(UPSTREAM)


@pytest.mark.parametrize(
    ("agent", "shown"), [("mapped", BUSY), ("travel", ErrorMessages().default)]
)
async def test_a_failed_run_shows_its_owner_the_agents_text_not_the_upstream_message(
    nats_server: SecuredNats, tmp_path: Path, agent: str, shown: str
) -> None:
    model = GatedModel(_upstream_fails)
    alice = RunbusClient(await nats.connect(nats_server.url), token="dev-alice")
    try:
        async with start_stack(
            nats_server.url, data_dir=tmp_path, agents=AGENTS, routes={"gated": model}
        ):
            run_id = await alice.start(agent, "Weather in Hobart?", session_id="s-err")
            final = [i.event async for i in alice.follow(run_id, timeout=20)][-1]
            record = (await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))).record
    finally:
        await alice.nc.drain()

    assert isinstance(final, RunFailed)
    assert (final.error.code, final.error.message) == ("model_error", shown)
    assert record.error is not None
    assert (record.error.code, record.error.message) == ("model_error", shown)
    assert len(model.requests) == 1
