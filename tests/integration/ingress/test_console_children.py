"""A run's children and time travel in the web console, in a real browser (Debian's headless
Chromium driven by Playwright): the runs list shows an agent's child run under it, each page
links to the other, and a fork from a checkpoint opens the new session with the run's messages
up to it. Another user sees none of it."""

from pathlib import Path

import pytest
from playwright.async_api import Browser, expect

from runbus import ops
from runbus.client import RunbusClient
from runbus.messages import HistoryLoad, RunCompleted, RunFailed
from runbus_gateway.run.agent_tools import child_run_id
from tests.integration.ingress.conftest import BOB, ingress
from tests.integration.ingress.test_console import browser, shot, sign_in
from tests.multi_agent import AGENTS, AgentsModel
from tests.stack import SecuredNats, start_stack

__all__ = ["browser"]  # the fixture, shared with the console's other browser tests


async def final(client: RunbusClient, run_id: str) -> RunCompleted | RunFailed:
    async for item in client.follow(run_id, timeout=20):
        if isinstance(item.event, RunCompleted | RunFailed):
            return item.event
    raise AssertionError("no final event")


@pytest.mark.browser
async def test_a_person_sees_a_runs_child_under_it_follows_both_ways_and_forks_the_run(
    nats_server: SecuredNats, tmp_path: Path, browser: Browser, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]
    screenshots = tmp_path / "screenshots"
    screenshots.mkdir()
    async with (
        start_stack(
            nats_server.url, data_dir=tmp_path, agents=AGENTS, routes={"agents": AgentsModel()}
        ),
        ingress(nats_server.url) as (base, http),
    ):
        run_id = await alice.start("triage", "Get me to Melbourne", session_id="trip")
        assert isinstance(await final(alice, run_id), RunCompleted)
        child = child_run_id(run_id, "c-ask")
        page = await browser.new_page(viewport={"width": 1200, "height": 800})
        await sign_in(page, base, "dev-alice")

        rows = page.locator("#runs tr[data-run]")
        await expect(rows).to_have_count(2)
        # The child right under its parent, indented.
        await expect(rows.nth(0)).to_have_attribute("data-run", run_id)
        await expect(rows.nth(1)).to_have_attribute("data-run", child)
        await expect(rows.nth(1)).to_have_class("child")
        await shot(page, screenshots, "1-runs")

        await page.click(f"#runs a[href='#run/{run_id}']")
        listed = page.locator(f"#children li[data-child='{child}']")
        await expect(listed).to_contain_text("flights")
        await expect(listed).to_contain_text("completed")
        await listed.locator("a").click()
        await expect(page.locator("#parent")).to_have_text(run_id)
        await expect(page.locator("#children-card")).to_be_hidden()  # it called no agent
        await shot(page, screenshots, "2-child")
        await page.click("#parent")
        await expect(page.locator(f"#children li[data-child='{child}']")).to_be_visible()

        # Checkpoint 1: the run's input only.
        await page.fill("#fork input[name=session_id]", "trip-again")
        await page.fill("#fork input[name=checkpoint]", "1")
        await page.click("#fork button")
        await expect(page).to_have_url(f"{base}/#session/trip-again")
        await shot(page, screenshots, "3-forked")
        # A bad checkpoint is refused, typed, on the page.
        await page.goto(f"{base}/#run/{run_id}")
        await expect(page.locator(f"#children li[data-child='{child}']")).to_be_visible()
        await page.fill("#fork input[name=session_id]", "trip-again")
        await page.click("#fork button")
        await expect(page.locator("#fork .error")).to_contain_text("conflict")

        forked = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="trip-again"))
        original = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="trip"))
        async with http.get(f"{base}/v1/runs?parent_run_id={run_id}", headers=BOB) as reply:
            bobs_view = await reply.json()

    assert [m.message_id for m in forked.messages] == [original.messages[0].message_id]
    assert forked.messages[0].text == "Get me to Melbourne"
    assert bobs_view["records"] == []
