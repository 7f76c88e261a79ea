"""Run events as a person reads them in the terminal, and as JSON lines for scripts."""

import io

from runbus.messages import (
    ErrorInfo,
    FunctionCallContent,
    FunctionResultContent,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunStarted,
    RunTextDelta,
    RunToolCall,
    RunToolResult,
)
from runbus.messages.runs import RUN_EVENT_DECODER
from runbus.render import EventPrinter

RUN = "r-7f3a"
CALL = FunctionCallContent(call_id="c1", name="get_weather", arguments={"city": "Sydney"})
RESULT = FunctionResultContent(call_id="c1", result={"city": "Sydney", "temperature_c": 21})


def rendered(*events: RunEvent, as_json: bool = False) -> str:
    out = io.StringIO()
    printer = EventPrinter(out, as_json=as_json)
    for event in events:
        printer(event)
    return out.getvalue()


def delta(text: str) -> RunTextDelta:
    return RunTextDelta(run_id=RUN, message_id=f"{RUN}-m1", delta=text)


def completed(text: str) -> RunCompleted:
    return RunCompleted(run_id=RUN, response=[], text=text)


def test_streamed_text_is_printed_once_as_one_assistant_line() -> None:
    output = rendered(
        RunStarted(run_id=RUN, session_id="s1", agent="travel"),
        delta("It's 21°C "),
        delta("in Sydney."),
        completed("It's 21°C in Sydney."),
    )

    assert output == "  assistant: It's 21°C in Sydney.\n"


def test_a_run_without_deltas_prints_the_completed_text() -> None:
    assert rendered(completed("Done.")) == "  assistant: Done.\n"


def test_tool_calls_and_results_are_shown_as_arrows() -> None:
    output = rendered(RunToolCall(run_id=RUN, call=CALL), RunToolResult(run_id=RUN, result=RESULT))

    assert output == (
        '  → get_weather {"city": "Sydney"}\n  ← {"city": "Sydney", "temperature_c": 21}\n'
    )


def test_a_tool_error_is_shown_instead_of_a_result() -> None:
    failed = FunctionResultContent(call_id="c1", error="tool 'get_weather' timed out after 10s")

    assert rendered(RunToolResult(run_id=RUN, result=failed)) == (
        "  ← tool 'get_weather' timed out after 10s\n"
    )


def test_a_long_tool_result_is_cut_to_one_readable_line() -> None:
    long = FunctionResultContent(call_id="c1", result="x" * 1000)

    line = rendered(RunToolResult(run_id=RUN, result=long)).removesuffix("\n")

    assert line.endswith("...")
    assert len(line.removeprefix("  ← ")) == 160


def test_a_tool_call_after_streamed_text_starts_on_a_new_line() -> None:
    output = rendered(delta("Let me check."), RunToolCall(run_id=RUN, call=CALL))

    assert output == '  assistant: Let me check.\n  → get_weather {"city": "Sydney"}\n'


def test_a_failed_run_shows_its_code_and_message() -> None:
    failed = RunFailed(run_id=RUN, error=ErrorInfo(code="unauthenticated", message="unknown token"))

    assert rendered(failed) == "  run failed [unauthenticated]: unknown token\n"


def test_json_mode_writes_one_decodable_event_per_line() -> None:
    events: list[RunEvent] = [
        RunStarted(run_id=RUN, session_id="s1", agent="travel"),
        delta("Hi"),
        RunToolCall(run_id=RUN, call=CALL),
        RunToolResult(run_id=RUN, result=RESULT),
        completed("Hi"),
    ]

    lines = rendered(*events, as_json=True).splitlines()

    assert [RUN_EVENT_DECODER.decode(line) for line in lines] == events
