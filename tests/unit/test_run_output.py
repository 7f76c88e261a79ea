"""The final answer's checks in the run loop: an output format (validation, the one repair turn,
`output_invalid`) and output guardrails that hold the text until it passes (`output_blocked`)."""

from pathlib import Path

import msgspec
import pytest

from runbus.messages import (
    ChatMessage,
    OutputFormat,
    RunCompleted,
    RunTextDelta,
    TextContent,
)
from runbus_gateway.agents import OutputPolicy, load_agents
from runbus_gateway.errors import GatewayConfigError, OutputBlocked, OutputInvalid
from tests.unit.test_run_loop import AGENT, RecordingPorts, asks, request, run, said

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
PLANNER = msgspec.structs.replace(
    AGENT, output_format=OutputFormat(name="trip", schema=CITY), output=OutputPolicy(schema=CITY)
)
GUARDED = msgspec.structs.replace(
    AGENT,
    output=OutputPolicy(guardrails=[{"name": "blocked_terms", "terms": ["launch codes"]}]),
)


def deltas(ports: RecordingPorts) -> str:
    return "".join(e.delta for e in ports.events if isinstance(e, RunTextDelta))


def stored_text(ports: RecordingPorts) -> str:
    return " ".join(m.text for m in ports.appended)


async def test_a_valid_answer_completes_with_its_output_and_the_model_is_asked_natively() -> None:
    ports = RecordingPorts([said('{"city": "Kyoto", "days": 2}')])

    done: RunCompleted = await run(ports, agent=PLANNER)

    assert done.output == {"city": "Kyoto", "days": 2}
    assert done.text == '{"city": "Kyoto", "days": 2}'
    assert ports.outputs == [(PLANNER.output_format, False)]
    assert deltas(ports) == done.text


async def test_an_invalid_answer_gets_one_repair_turn_naming_the_problem() -> None:
    ports = RecordingPorts(
        [said('{"city": "Kyoto", "days": 0}'), said('{"city": "Kyoto", "days": 1}')]
    )

    done: RunCompleted = await run(ports, agent=PLANNER)

    assert done.output == {"city": "Kyoto", "days": 1}
    repair = ports.prompts[1][-1]
    assert repair.role == "user"
    assert "0 is less than the minimum of 1" in repair.text
    assert ports.prompts[1][-2].text == '{"city": "Kyoto", "days": 0}'
    # The refused answer was never shown nor stored.
    assert '"days": 0' not in deltas(ports)
    assert '"days": 0' not in stored_text(ports)
    assert [m.text for m in done.response] == ['{"city": "Kyoto", "days": 1}']


async def test_a_second_invalid_answer_fails_the_run_as_output_invalid() -> None:
    ports = RecordingPorts([said("Kyoto, two days"), said('{"city": "Kyoto"}')])

    with pytest.raises(OutputInvalid) as failed:
        await run(ports, agent=PLANNER)

    assert failed.value.code == "output_invalid"
    assert "'days' is a required property" in failed.value.message
    assert len(ports.prompts) == 2
    assert deltas(ports) == ""


async def test_a_request_output_format_applies_to_that_run_only() -> None:
    asked = OutputFormat(name="any")
    req = msgspec.structs.replace(request("Kyoto?"), output_format=asked)
    ports = RecordingPorts([said('{"answer": "go"}')])

    done: RunCompleted = await run(ports, req)

    assert done.output == {"answer": "go"}
    assert ports.outputs == [(asked, False)]
    assert AGENT.output_format is None


async def test_an_agent_without_output_checks_streams_and_completes_without_output() -> None:
    ports = RecordingPorts([said("Sunny.")])

    done: RunCompleted = await run(ports)

    assert done.output is None
    assert ports.outputs == [(None, True)]
    # The model router streamed the text; the gateway adds none of its own.
    assert deltas(ports) == ""


async def test_an_output_guardrail_blocks_the_answer_before_any_of_it_is_shown_or_stored() -> None:
    ports = RecordingPorts([said("Sure: the launch codes are 0000.")])

    with pytest.raises(OutputBlocked) as failed:
        # A statement an allowed run would store in memory.
        await run(ports, request("I am vegetarian."), agent=GUARDED)

    assert failed.value.code == "output_blocked"
    assert failed.value.details == {"guardrail": "blocked_terms"}
    assert ports.outputs == [(None, False)]
    assert "launch" not in deltas(ports)
    assert "launch" not in stored_text(ports)
    assert "launch" not in failed.value.message
    assert ports.stored == []  # no memory is written from a blocked run


async def test_held_text_of_a_reply_with_tool_calls_is_checked_too() -> None:
    reply = ChatMessage(
        role="assistant",
        contents=[
            TextContent(text="Fetching the launch codes."),
            *asks(("get_weather", {})).contents,
        ],
    )
    ports = RecordingPorts([reply, said("done")])

    with pytest.raises(OutputBlocked):
        await run(ports, agent=GUARDED)

    assert ports.invoked == []


async def test_tool_calls_of_a_held_run_are_announced_as_they_happen_between_held_texts() -> None:
    reply = ChatMessage(
        role="assistant",
        contents=[TextContent(text="Checking."), *asks(("get_weather", {})).contents],
    )
    ports = RecordingPorts([reply, said("Sunny.")])

    await run(ports, agent=GUARDED)

    shown = [
        e.delta if isinstance(e, RunTextDelta) else e.__struct_config__.tag
        for e in ports.events
        if e.__struct_config__.tag != "run.started"
    ]
    assert shown == ["Checking.", "run.tool_call", "run.tool_result", "Sunny."]


async def test_an_allowed_answer_arrives_whole_as_one_delta() -> None:
    ports = RecordingPorts([said("It is sunny in Sydney.")])

    done: RunCompleted = await run(ports, agent=GUARDED)

    assert done.text == "It is sunny in Sydney."
    shown = [e for e in ports.events if isinstance(e, RunTextDelta)]
    assert [e.delta for e in shown] == ["It is sunny in Sydney."]


def write_agent(folder: Path, body: str) -> None:
    (folder / "a.toml").write_text(f'name = "a"\nmodel = "offline"\n{body}')


def test_a_misspelt_model_setting_is_refused_naming_the_file_and_the_valid_ones(
    tmp_path: Path,
) -> None:
    write_agent(tmp_path, "[model_settings]\ntemprature = 0.2\n")

    with pytest.raises(GatewayConfigError) as failed:
        load_agents(tmp_path)

    message = str(failed.value)
    assert "a.toml" in message
    assert "'temprature'" in message
    assert "max_output_tokens, temperature, top_p, stop, seed" in message


def test_an_output_schema_comes_inline_from_a_file_or_from_a_msgspec_type(tmp_path: Path) -> None:
    write_agent(tmp_path, '[output]\nschema = {type = "object", required = ["city"]}\n')
    inline = load_agents(tmp_path)["a"].output_format
    (tmp_path / "trip.json").write_text(msgspec.json.encode(CITY).decode())
    write_agent(tmp_path, '[output]\nschema_file = "trip.json"\nname = "trip"\n')
    from_file = load_agents(tmp_path)["a"].output_format
    write_agent(tmp_path, '[output]\ntype = "runbus.messages:Usage"\n')
    from_type = load_agents(tmp_path)["a"].output_format

    assert inline == OutputFormat(schema={"type": "object", "required": ["city"]})
    assert from_file == OutputFormat(name="trip", schema=CITY)
    assert from_type is not None
    assert from_type.schema is not None
    assert "$defs" in from_type.schema


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('[output]\nschema = {type = "thing"}\n', "is not valid under any of the given schemas"),
        ('[output]\nschema_file = "missing.json"\n', "missing.json"),
        ('[output]\ntype = "runbus.messages:Nothing"\n', "has no class 'Nothing'"),
        ('[output]\nguardrails = [{name = "nope"}]\n', "nope"),
        ('[output_format]\nname = "x"\n', "declared in the [output] table"),
    ],
)
def test_a_bad_output_table_fails_the_agent_file(tmp_path: Path, body: str, problem: str) -> None:
    write_agent(tmp_path, body)

    with pytest.raises(GatewayConfigError) as failed:
        load_agents(tmp_path)

    assert problem in str(failed.value)
    assert "a.toml" in str(failed.value)
