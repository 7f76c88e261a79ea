"""Pause → edit → resume in the web console, in a real browser (Debian's headless Chromium
driven by Playwright): the person pauses a run, sees its pending call, is refused an edit that
breaks the tool's schema (the run stays paused), fixes it and resumes; the run answers from the
edited call; and answers a tool's question. Screenshots of each step are kept in the test's tmp
dir (and $RUNBUS_SCREENSHOTS)."""

import asyncio
from pathlib import Path

import pytest
from playwright.async_api import Browser, expect

from runbus.messages import ModelRequest
from runbus_examples.travel import tools as travel
from tests.integration.ingress.conftest import GATED_AGENTS, ingress
from tests.integration.ingress.test_console import browser, shot, sign_in
from tests.integration.test_tool_interrupts import AGENTS as ASKING_AGENTS
from tests.integration.test_tool_interrupts import asking, seat_then_answer
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, start_stack

__all__ = ["browser"]  # the fixture, shared with the console's other browser tests


def weather(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
    results = [r for m in request.messages for r in m.function_results]
    if not results:
        return call("get_weather", "c-weather", city="Sydney")
    return text(f"Weather for {results[-1].result['city']}")


@pytest.mark.browser
async def test_a_person_pauses_a_run_edits_its_pending_call_and_resumes_it(
    nats_server: SecuredNats, tmp_path: Path, browser: Browser
) -> None:
    model = GatedModel(weather, hold={0})
    screenshots = tmp_path / "screenshots"
    screenshots.mkdir()
    async with (
        start_stack(
            nats_server.url, data_dir=tmp_path, agents=GATED_AGENTS, routes={"gated": model}
        ),
        ingress(nats_server.url) as (base, _),
    ):
        page = await browser.new_page(viewport={"width": 1200, "height": 800})
        await sign_in(page, base, "dev-alice")
        await page.fill("#start-form input[name=text]", "Weather?")
        await page.click("#start-form button[type=submit]")
        await asyncio.wait_for(model.reached.wait(), 20)
        pause = page.locator("#pause")
        await expect(pause).to_be_visible()
        await pause.click()
        await expect(pause).to_have_text("Pausing at the next step…")
        model.release.set()

        badge = page.locator("#run-status [data-status]")
        await expect(badge).to_have_text("paused")
        arguments = page.locator("#pending textarea[data-call=c-weather]")
        await expect(arguments).to_have_value('{\n "city": "Sydney"\n}')
        await shot(page, screenshots, "1-paused")

        await arguments.fill('{"city": 7}')
        await page.click("#resume")
        await expect(page.locator("#edit-error")).to_contain_text("bad_request")
        await expect(page.locator("#edit-error")).to_contain_text("7 is not of type 'string'")
        await expect(badge).to_have_text("paused")
        await shot(page, screenshots, "2-refused")

        await arguments.fill('{"city": "Perth"}')
        await page.fill("#pause-note", "short answer please")
        await page.click("#resume")
        await expect(badge).to_have_text("completed")
        await expect(page.locator("#pending")).to_have_count(0)
        await expect(page.locator("#answer")).to_have_text("Weather for Perth")
        await expect(page.locator("#tools pre").first).to_have_text('{"city":"Perth"}')
        await shot(page, screenshots, "3-resumed")

    assert sorted(p.name for p in screenshots.iterdir()) == [
        "1-paused.png",
        "2-refused.png",
        "3-resumed.png",
    ]


@pytest.mark.browser
async def test_a_person_answers_a_tools_question_in_the_console(
    nats_server: SecuredNats, tmp_path: Path, browser: Browser
) -> None:
    screenshots = tmp_path / "screenshots"
    screenshots.mkdir()
    async with (
        start_stack(
            nats_server.url,
            data_dir=tmp_path,
            agents=ASKING_AGENTS,
            routes={"gated": GatedModel(seat_then_answer)},
            tool_registries=[travel, asking],
        ),
        ingress(nats_server.url) as (base, _),
    ):
        page = await browser.new_page(viewport={"width": 1200, "height": 800})
        await sign_in(page, base, "dev-alice")
        await page.fill("#start-form input[name=text]", "A seat please")
        await page.click("#start-form button[type=submit]")
        await expect(page.locator("#tools .buttons")).to_contain_text(
            "choose_seat asks: Window or aisle on QF1?"
        )
        await page.fill("#tools .answer-input", "window")
        await shot(page, screenshots, "1-question")
        await page.get_by_role("button", name="Answer").click()
        await expect(page.locator("#run-status [data-status]")).to_have_text("completed")
        await expect(page.locator("#answer")).to_have_text("Done: window seat on QF1")
        await shot(page, screenshots, "2-answered")
