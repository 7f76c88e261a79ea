"""The web console in a real browser (Debian's headless Chromium driven by Playwright): sign in,
start a run, approve its booking, watch the answer stream in, and be refused another user's run;
open a run started through the SDK and see its trace link. Screenshots of each step are kept in
the test's tmp dir (and in $RUNBUS_SCREENSHOTS if set)."""

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import NamedTuple

import msgspec
import pytest
from playwright.async_api import Browser, Page, Route, async_playwright, expect

from runbus.client import connect
from runbus.messages import ChatMessage, ModelRequest, ModelResponse, TextContent, Usage
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import load_agents
from runbus_model_router.backends import OnDelta
from tests.integration.ingress.conftest import ingress
from tests.models import call, turn_step
from tests.stack import SecuredNats, start_stack

CHROMIUM = "/usr/bin/chromium"
JAEGER = "http://jaeger.invalid:16686"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


class BookingModel:
    """Books business class (over the approval limit), then answers in two deltas with a pause
    between them, so the page can be seen half-way through the answer."""

    name = "booking"

    def __init__(self) -> None:
        self.halfway = asyncio.Event()
        self.finish = asyncio.Event()

    async def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
        if turn_step(request) == 0:
            message = call("create_booking", "c-book", flight_id="QF412-20261208", cabin="business")
        else:
            result = [r for m in request.messages for r in m.function_results][-1]
            booking = result.result if isinstance(result.result, dict) else {}
            first, rest = "Booked: ", f"confirmation {booking.get('confirmation')}."
            await on_delta(first)
            self.halfway.set()
            await self.finish.wait()
            await on_delta(rest)
            message = ChatMessage(role="assistant", contents=[TextContent(text=first + rest)])
        return ModelResponse(
            message=message,
            model="booking",
            finish_reason="tool_calls" if message.function_calls else "stop",
            usage=Usage(input_tokens=40, output_tokens=12),
        )


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    assert Path(CHROMIUM).exists(), "no /usr/bin/chromium: `make browser` installs it"
    # A loaded 2-core machine can take seconds to paint; the page's facts are still awaited.
    expect.set_options(timeout=20_000)
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield launched
        await launched.close()


async def shot(page: Page, folder: Path, name: str) -> None:
    path = folder / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    if keep := os.environ.get("RUNBUS_SCREENSHOTS"):
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)


class Console(NamedTuple):
    base: str
    """The ingress's URL, the console at its root."""
    model: BookingModel
    screenshots: Path


@contextlib.asynccontextmanager
async def booking_console(nats_server: SecuredNats, tmp_path: Path) -> AsyncIterator[Console]:
    """The stack with the travel agent on the booking model, and the console in front of it."""
    model = BookingModel()
    agents = {"travel": msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="booking")}
    screenshots = tmp_path / "screenshots"
    screenshots.mkdir()
    async with (
        start_stack(nats_server.url, data_dir=tmp_path, agents=agents, routes={"booking": model}),
        ingress(nats_server.url, jaeger_url=JAEGER) as (base, _),
    ):
        yield Console(base, model, screenshots)


async def sign_in(page: Page, base: str, token: str) -> None:
    await page.goto(base)
    await page.fill("#token", token)
    await page.click("#signin-form button")
    await expect(page.locator("#start-form")).to_be_visible()


@pytest.mark.browser
async def test_a_person_signs_in_runs_approves_watches_the_answer_and_is_refused_others_runs(
    nats_server: SecuredNats, tmp_path: Path, browser: Browser
) -> None:
    async with booking_console(nats_server, tmp_path) as (base, model, screenshots):
        page = await browser.new_page(viewport={"width": 1200, "height": 800})
        await sign_in(page, base, "dev-alice")
        await page.fill("#start-form input[name=text]", "Book QF412 in business, please")
        await page.click("#start-form button[type=submit]")

        approve = page.get_by_role("button", name="Approve")
        await expect(approve).to_be_visible()
        await expect(page.locator("#run-status [data-status]")).to_have_text("waiting_approval")
        await shot(page, screenshots, "1-approval")
        run_id = page.url.rsplit("/", 1)[-1]
        trace_link = await page.locator("#trace").get_attribute("href")
        await approve.click()

        await asyncio.wait_for(model.halfway.wait(), 20)
        await expect(page.locator("#answer")).to_have_text("Booked: ")
        await shot(page, screenshots, "2-streaming")
        model.finish.set()
        await expect(page.locator("#run-status [data-status]")).to_have_text("completed")
        booking = page.locator("#tools .result")
        await expect(booking).to_contain_text('"cabin": "business"')
        confirmation = await booking.inner_text()
        await expect(page.locator("#answer")).to_contain_text("Booked: confirmation RB-")
        # Two model calls of 40 in and 12 out each.
        await expect(page.locator("#usage")).to_have_text("80 tokens in · 24 tokens out")
        await shot(page, screenshots, "3-completed")
        await page.goto(f"{base}/#runs")
        await expect(page.locator(f"#runs a[href='#run/{run_id}']")).to_be_visible()

        await page.click("#signout")
        await sign_in(page, base, "dev-bob")
        await page.goto(f"{base}/#run/{run_id}")
        refusal = page.get_by_role("alert")
        await expect(refusal).to_contain_text("not_found")
        await shot(page, screenshots, "4-refused")

    assert '"approved_by"' in confirmation
    assert trace_link is not None
    assert trace_link.startswith(f"{JAEGER}/trace/")
    assert len(trace_link.rsplit("/", 1)[-1]) == 32
    assert sorted(p.name for p in screenshots.iterdir()) == [
        "1-approval.png",
        "2-streaming.png",
        "3-completed.png",
        "4-refused.png",
    ]


@pytest.mark.browser
async def test_a_browser_that_did_not_start_a_run_shows_its_trace_link(
    nats_server: SecuredNats, tmp_path: Path, browser: Browser
) -> None:
    """The run is started through the SDK, and opened live and again once it has ended."""
    async with (
        booking_console(nats_server, tmp_path) as (base, model, screenshots),
        connect(nats_server.client_url, token="dev-alice") as sdk,
    ):
        run_id, trace_id = await sdk.start_traced(
            "travel", "Book QF412 in business, please", session_id="s-sdk"
        )
        link = f"{JAEGER}/trace/{trace_id}"
        page = await browser.new_page(viewport={"width": 1200, "height": 800})
        await sign_in(page, base, "dev-alice")
        await page.goto(f"{base}/#run/{run_id}")
        # Live: the run waits for a person while the page opens it.
        await expect(page.locator("#run-status [data-status]")).to_have_text("waiting_approval")
        trace = page.locator("#trace")
        await expect(trace).to_have_text(trace_id)
        await expect(trace).to_have_attribute("href", link)
        await shot(page, screenshots, "1-started-elsewhere")
        await page.get_by_role("button", name="Approve").click()
        await asyncio.wait_for(model.halfway.wait(), 20)
        model.finish.set()
        await expect(page.locator("#run-status [data-status]")).to_have_text("completed")

        # Replayed: the ended run opened again, in a browser that never saw it start.
        later = await browser.new_page(viewport={"width": 1200, "height": 800})
        await sign_in(later, base, "dev-alice")
        await later.goto(f"{base}/#run/{run_id}")
        await expect(later.locator("#answer")).to_contain_text("Booked: confirmation RB-")
        await expect(later.locator("#trace")).to_have_attribute("href", link)
        await shot(later, screenshots, "2-replayed-elsewhere")


@pytest.mark.browser
async def test_a_run_that_ends_before_the_page_hears_back_on_its_decision_stays_completed(
    nats_server: SecuredNats, tmp_path: Path, browser: Browser
) -> None:
    """The answer to the page's own approval arrives after the run's last events (a slow
    reply on a busy machine): the run stays shown completed, not back to running."""
    async with (
        booking_console(nats_server, tmp_path) as (base, model, _),
        connect(nats_server.client_url, token="dev-alice") as sdk,
    ):
        run_id = await sdk.start("travel", "Book QF412 in business, please", session_id="s-late")
        model.finish.set()  # the answer comes at once once the booking is approved
        page = await browser.new_page(viewport={"width": 1200, "height": 800})
        await sign_in(page, base, "dev-alice")
        answer_back = asyncio.Event()

        async def hold_the_answer(route: Route) -> None:
            response = await route.fetch()  # the decision reaches the gateway now
            await answer_back.wait()
            await route.fulfill(response=response)

        await page.route("**/approvals/**", hold_the_answer)
        await page.goto(f"{base}/#run/{run_id}")
        badge = page.locator("#run-status [data-status]")
        await expect(badge).to_have_text("waiting_approval")
        await page.get_by_role("button", name="Approve").click()
        await expect(badge).to_have_text("completed")  # from the run's events
        answer_back.set()

        await expect(page.locator(".decided")).to_have_text("approved")
        await expect(badge).to_have_text("completed")
