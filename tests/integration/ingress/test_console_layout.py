"""The console as a person sees it, in a real browser: who is signed in, one block per
assistant message, a long answer that wraps and keeps the side panel on screen at 1,100 and
420 px wide, an approved call that no longer looks pending (live and replayed), and a refused
token told in words for a person. Screenshots go to the test's tmp dir (and $RUNBUS_SCREENSHOTS)."""

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import openai
import pytest
from playwright.async_api import Browser, Page, expect

from runbus.messages import (
    ChatMessage,
    FunctionCallContent,
    ModelRequest,
    ModelResponse,
    TextContent,
    Usage,
)
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import load_agents
from runbus_model_router.backends import OnDelta
from tests.integration.ingress.conftest import ingress
from tests.integration.ingress.test_console import BookingModel, browser, shot, sign_in
from tests.models import turn_step
from tests.stack import SecuredNats, start_stack

__all__ = ["browser"]  # the fixture, shared with the console's other browser tests

LONG_WORD = "https://example.com/" + "a-very-long-path-segment" * 20
LONG_ANSWER = ("It will be sunny in Sydney all week. " * 30) + LONG_WORD
PENDING_BACKGROUND = "rgb(255, 250, 234)"
"""The pending approval's yellow (`.approval` in the console's style sheet)."""


class TwoMessagesModel:
    """Says something, calls a tool, then answers at length: two assistant messages."""

    name = "two"

    async def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
        if turn_step(request) == 0:
            text = "Let me look at the weather."
            await on_delta(text)
            call = FunctionCallContent(
                call_id="c-w", name="get_weather", arguments={"city": "Sydney"}
            )
            message = ChatMessage(role="assistant", contents=[TextContent(text=text), call])
        else:
            await on_delta(LONG_ANSWER)
            message = ChatMessage(role="assistant", contents=[TextContent(text=LONG_ANSWER)])
        return ModelResponse(
            message=message,
            model="two",
            finish_reason="tool_calls" if message.function_calls else "stop",
            usage=Usage(input_tokens=10, output_tokens=5),
        )


@contextlib.asynccontextmanager
async def console(
    nats_server: SecuredNats, tmp_path: Path, model: object, name: str
) -> AsyncIterator[tuple[str, Path]]:
    agents = {"travel": msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model=name)}
    screenshots = tmp_path / "screenshots"
    screenshots.mkdir(exist_ok=True)
    async with (
        start_stack(nats_server.url, data_dir=tmp_path, agents=agents, routes={name: model}),  # type: ignore[dict-item]
        ingress(nats_server.url) as (base, _),
    ):
        yield base, screenshots


async def start_run(page: Page, text: str) -> None:
    await page.fill("#start-form input[name=text]", text)
    await page.click("#start-form button[type=submit]")


async def overflow(page: Page) -> int:
    """How many pixels the page is wider than the window (0: nothing sticks out)."""
    width: int = await page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    return width


@pytest.mark.browser
async def test_the_header_says_who_is_signed_in(
    nats_server: SecuredNats, tmp_path: Path, browser: Browser
) -> None:
    async with console(nats_server, tmp_path, TwoMessagesModel(), "two") as (base, screenshots):
        page = await browser.new_page(viewport={"width": 1200, "height": 800})
        await sign_in(page, base, "dev-alice")
        who = page.locator("#who")
        await expect(who).to_have_text("Signed in as alice (acme)")
        await shot(page, screenshots, "signed-in")
        await page.reload()  # a returning visitor, signed in by the stored token
        await expect(who).to_have_text("Signed in as alice (acme)")
        await page.click("#signout")
        await expect(who).to_have_text("")
        await sign_in(page, base, "dev-carol")
        await expect(who).to_have_text("Signed in as carol (globex)")


@pytest.mark.browser
@pytest.mark.parametrize("width", [1100, 420])
async def test_two_messages_are_two_blocks_and_a_long_answer_wraps_beside_the_side_panel(
    nats_server: SecuredNats, tmp_path: Path, browser: Browser, width: int
) -> None:
    async with console(nats_server, tmp_path, TwoMessagesModel(), "two") as (base, screenshots):
        page = await browser.new_page(viewport={"width": width, "height": 900})
        await sign_in(page, base, "dev-alice")
        runs_overflow = await overflow(page)
        await shot(page, screenshots, f"runs-{width}")
        await start_run(page, "Weather in Sydney this week?")
        await expect(page.locator("#run-status [data-status]")).to_have_text("completed")
        blocks = page.locator("#answer .message")
        await expect(blocks).to_have_count(2)
        await shot(page, screenshots, f"run-{width}")
        first, second = await blocks.nth(0).bounding_box(), await blocks.nth(1).bounding_box()
        usage = await page.locator("#usage").bounding_box()
        run_overflow = await overflow(page)
        texts = await blocks.all_inner_texts()
        await page.goto(f"{base}/#sessions")
        await expect(page.locator("#sessions")).to_be_visible()
        sessions_overflow = await overflow(page)

    assert texts == ["Let me look at the weather.", LONG_ANSWER]
    assert first is not None
    assert second is not None
    assert second["y"] >= first["y"] + first["height"]  # one under the other, not run together
    assert usage is not None
    assert usage["x"] + usage["width"] <= width  # the side panel stays on screen
    assert (runs_overflow, run_overflow, sessions_overflow) == (0, 0, 0)


@pytest.mark.browser
async def test_an_approved_call_no_longer_looks_pending_live_or_replayed(
    nats_server: SecuredNats, tmp_path: Path, browser: Browser
) -> None:
    model = BookingModel()
    model.finish.set()
    async with console(nats_server, tmp_path, model, "booking") as (base, screenshots):
        page = await browser.new_page(viewport={"width": 1200, "height": 800})
        await sign_in(page, base, "dev-alice")
        await start_run(page, "Book QF412 in business, please")
        call = page.locator("#tools .tool[data-call=c-book]")
        await expect(page.get_by_role("button", name="Approve")).to_be_visible()
        pending = await call.evaluate("box => getComputedStyle(box).backgroundColor")
        await page.get_by_role("button", name="Approve").click()
        await expect(call.locator(".decided")).to_have_text("approved")
        live = await call.evaluate("box => getComputedStyle(box).backgroundColor")
        await expect(page.locator("#run-status [data-status]")).to_have_text("completed")
        await shot(page, screenshots, "approved-live")

        replay = await browser.new_page(viewport={"width": 1200, "height": 800})
        await sign_in(replay, base, "dev-alice")
        await replay.goto(page.url)
        replayed_call = replay.locator("#tools .tool[data-call=c-book]")
        await expect(replayed_call.locator(".decided")).to_have_text("approved")
        await expect(replay.get_by_role("button", name="Approve")).to_have_count(0)
        replayed = await replayed_call.evaluate("box => getComputedStyle(box).backgroundColor")
        await shot(replay, screenshots, "approved-replayed")

    assert pending == PENDING_BACKGROUND
    assert live != PENDING_BACKGROUND
    assert replayed != PENDING_BACKGROUND


@pytest.mark.browser
async def test_a_refused_token_is_told_in_words_for_a_person(
    nats_server: SecuredNats, tmp_path: Path, browser: Browser
) -> None:
    async with console(nats_server, tmp_path, TwoMessagesModel(), "two") as (base, screenshots):
        page = await browser.new_page(viewport={"width": 420, "height": 800})
        await page.goto(base)
        await page.fill("#token", "not-a-token")
        await page.click("#signin-form button")
        error = page.locator("#signin-error")
        await expect(error).to_contain_text("not accepted")
        said = await error.inner_text()
        await shot(page, screenshots, "refused")

    assert said == "Sign-in refused: this token was not accepted: it is unknown or has expired"


async def test_an_openai_client_with_a_refused_key_is_told_no_bus_detail(served: str) -> None:
    async with openai.AsyncOpenAI(
        base_url=f"{served}/v1", api_key="not-a-token", max_retries=0
    ) as stranger:
        with pytest.raises(openai.AuthenticationError) as refused:
            await stranger.models.list()

    message = str(refused.value.message)
    assert "not accepted" in message
    for internal in ("nats", "NATS", "RUNBUS_TOKEN", "127.0.0.1", "4222"):
        assert internal not in message
