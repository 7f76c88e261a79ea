"""A program agent's run has no step boundary: asking it to pause is refused at once, with a
typed error that says what to do instead, rather than standing as a pause nobody reaches."""

from datetime import UTC, datetime
from pathlib import Path

import pytest

from runbus.errors import Conflict
from runbus.messages.runs import RunPause, RunRecord
from runbus.tokens import Principal
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import load_agents
from runbus_gateway.run_control import NotPausable, RunControl

ALICE = Principal(user_id="alice", tenant="acme")


class OneRecord:
    def __init__(self, agent: str) -> None:
        self.record = RunRecord(
            run_id="r1",
            agent=agent,
            session_id="s1",
            tenant="acme",
            user_id="alice",
            status="running",
            created_at=datetime.now(UTC),
            updated_at=datetime.now(UTC),
        )

    async def get(self, tenant: str, user_id: str, run_id: str) -> RunRecord | None:
        return self.record if (tenant, user_id, run_id) == ("acme", "alice", "r1") else None


class NoPauses:
    async def request(self, *args: object) -> object:
        raise AssertionError("no pause is asked for")


async def test_pausing_a_program_agents_run_is_refused_with_a_typed_error(tmp_path: Path) -> None:
    (tmp_path / "refunds.toml").write_text(
        'name = "refunds"\n[harness]\nkind = "program"\n'
        'program = "runbus_examples.refund:RefundPolicyAgent"\n'
    )
    agents = {**load_agents(tmp_path), **load_agents(AGENTS_DIR)}
    control = RunControl(None, OneRecord("refunds"), NoPauses(), agents)  # type: ignore[arg-type]

    with pytest.raises(NotPausable) as refused:
        await control.pause(ALICE, RunPause(run_id="r1"))

    assert isinstance(refused.value, Conflict)
    assert refused.value.code == "conflict"
    assert "program agent 'refunds'" in refused.value.message
    assert "cancel" in refused.value.message
