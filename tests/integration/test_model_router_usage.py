"""Usage and budgets across replicas: counters in the JetStream KV bucket, `budget_exceeded`
before any provider request, and the `runbus usage` report."""

import json

import pytest
from nats.aio.client import Client as NATS

from runbus import ops, subjects
from runbus.cli import build_parser
from runbus.commands import usage as usage_command
from runbus.headers import RunContext
from runbus.settings import load_settings
from runbus_model_router.usage import utc_day
from tests.integration.model_provider import answer, ask, loopback, refusal, router, text_reply
from tests.stack import SecuredNats

ALICE = RunContext(run_id="r-a", agent="travel", props={"tenant": "acme", "user_id": "alice"})
BOB = RunContext(run_id="r-b", agent="travel", props={"tenant": "acme", "user_id": "bob"})
CAROL = RunContext(run_id="r-c", agent="planner", props={"tenant": "globex", "user_id": "carol"})


def budgeted(url: str) -> str:
    return f"""
currency = "USD"
[backends.lb]
base_url = "{url}"
[routes.cheap]
[[routes.cheap.targets]]
backend = "lb"
model = "small-1"
input_price = 2.0
output_price = 8.0
[budgets.acme]
tokens_per_day = 100
"""


async def test_a_tenant_over_budget_gets_budget_exceeded_before_any_provider_request(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as provider, router(nats_server.url, budgeted(provider.base_url)):
        provider.default = lambda: text_reply("spent", usage=(90, 20))
        await answer(nc, ask("first"), ALICE)

        refused = await refusal(nc, ask("second"), BOB)
        other_tenant = await answer(nc, ask("unlimited"), CAROL)

    assert refused.code == "budget_exceeded"
    assert refused.details["tenant"] == "acme"
    assert refused.details["spent"] == 110
    assert refused.details["limit"] == 100
    assert len(provider.requests) == 2, "only alice's and carol's calls reached the provider"
    assert other_tenant.message.text == "spent"


async def test_a_budget_spent_through_one_replica_is_enforced_by_another(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as provider:
        provider.default = lambda: text_reply("spent", usage=(90, 20))
        async with router(nats_server.url, budgeted(provider.base_url)):
            await answer(nc, ask("first"), ALICE)
        async with router(nats_server.url, budgeted(provider.base_url)) as second:
            assert second.ledger is not None
            refused = await refusal(nc, ask("second"), ALICE)

    assert refused.code == "budget_exceeded"
    assert len(provider.requests) == 1


async def test_usage_from_replicas_adds_up_in_the_shared_counters(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with (
        loopback() as provider,
        router(nats_server.url, budgeted(provider.base_url)) as first,
        router(nats_server.url, budgeted(provider.base_url)) as second,
    ):
        provider.default = lambda: text_reply("ok", usage=(3, 1))
        for _ in range(10):
            await answer(nc, ask("hi"), CAROL)
        assert first.ledger is not None
        assert second.ledger is not None
        await first.ledger.flush()
        await second.ledger.flush()
        spent = await first.ledger.spent(utc_day(), "globex")

    assert (spent.calls, spent.input_tokens, spent.output_tokens) == (10, 30, 10)
    assert spent.cost == pytest.approx(10 * (3 * 2.0 + 1 * 8.0) / 1e6)


async def test_runbus_usage_prints_calls_per_tenant_user_agent_route_and_model(
    nats_server: SecuredNats, nc: NATS, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = load_settings({"RUNBUS_NATS_URL": nats_server.url})
    async with loopback() as provider, router(nats_server.url, budgeted(provider.base_url)):
        provider.default = lambda: text_reply("ok", usage=(10, 5))
        await answer(nc, ask("hi"), ALICE)
        await answer(nc, ask("hi again"), ALICE)
        await answer(nc, ask("hi"), BOB)
        await answer(nc, ask("Weather in Sydney?", route="offline"), CAROL)

        capsys.readouterr()  # the services' log lines so far
        table_code = await usage_command.handle(settings, build_parser().parse_args(["usage"]))
        table = capsys.readouterr().out
        json_code = await usage_command.handle(
            settings, build_parser().parse_args(["usage", "--json", "--tenant", "acme"])
        )
        report = ops.MODEL_USAGE.decode_reply.decode(capsys.readouterr().out)

    assert (table_code, json_code) == (0, 0)
    lines = table.splitlines()
    assert lines[0] == f"Model usage on {utc_day()} (UTC), costs in USD"
    assert any(line.split()[:4] == ["acme", "3", "45", "100"] for line in lines)
    assert any(
        line.split()[:6] == ["acme", "alice", "travel", "cheap", "small-1", "2"] for line in lines
    )
    assert any(
        line.split()[:5] == ["globex", "carol", "planner", "offline", "offline"] for line in lines
    )
    assert [(r.user_id, r.calls, r.input_tokens, r.output_tokens) for r in report.rows] == [
        ("alice", 2, 20, 10),
        ("bob", 1, 10, 5),
    ]
    (acme,) = report.tenants
    assert acme.tokens_per_day == 100
    assert acme.cost == pytest.approx(3 * (10 * 2.0 + 5 * 8.0) / 1e6)


async def test_a_usage_query_for_a_malformed_day_is_refused(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with router(nats_server.url):
        reply = await nc.request(
            subjects.MODEL_USAGE,
            json.dumps({"type": "model.usage_query", "day": "*"}).encode(),
            timeout=5,
        )

    assert reply.headers is not None
    assert reply.headers["rb-error"] == "bad_request"


def test_runbus_usage_refuses_a_day_that_is_not_a_date(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["usage", "--day", "yesterday"])

    assert "not a day" in capsys.readouterr().err
