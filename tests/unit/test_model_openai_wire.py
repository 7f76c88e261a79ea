"""runbus messages ⇄ OpenAI chat-completions: every content type out, streamed chunks back in."""

import base64
from typing import Any

import msgspec

from runbus.messages import (
    ChatMessage,
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    ReasoningContent,
    TextContent,
    ToolSpec,
    UriContent,
    Usage,
    UsageContent,
)
from runbus_model_router.openai_wire import (
    CHUNK_DECODER,
    NOT_RUN,
    StreamAssembler,
    WireChunk,
    to_openai_messages,
    to_openai_tools,
)

PNG = b"\x89PNG\r\n\x1a\nfake"


def msg(role: Any, *contents: Any) -> ChatMessage:
    return ChatMessage(role=role, contents=list(contents))


def wire(body: dict[str, Any]) -> WireChunk:
    """A chunk as the backend decodes it: from the JSON bytes a provider sends."""
    return CHUNK_DECODER.decode(msgspec.json.encode(body))


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> WireChunk:
    return wire(
        {
            "id": "c-1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m-2025",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
    )


def test_plain_text_messages_become_string_contents() -> None:
    out = to_openai_messages(
        [msg("system", TextContent(text="Be brief.")), msg("user", TextContent(text="Hi"))]
    )

    assert out == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]


def test_a_data_image_is_sent_as_a_data_url_next_to_the_text() -> None:
    (user,) = to_openai_messages(
        [
            msg(
                "user",
                TextContent(text="What is this?"),
                DataContent(data=PNG, media_type="image/png"),
            )
        ]
    )

    assert user["content"] == [
        {"type": "text", "text": "What is this?"},
        {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()},
        },
    ]


def test_audio_files_and_uris_each_get_their_own_part_type() -> None:
    (user,) = to_openai_messages(
        [
            msg(
                "user",
                DataContent(data=b"RIFF", media_type="audio/wav"),
                DataContent(data=b"%PDF", media_type="application/pdf"),
                UriContent(uri="https://example.com/cat.jpg"),
                UriContent(uri="https://example.com/report", media_type="text/html"),
            )
        ]
    )

    assert [p["type"] for p in user["content"]] == ["input_audio", "file", "image_url", "text"]
    assert user["content"][0]["input_audio"] == {"data": "UklGRg==", "format": "wav"}
    assert user["content"][1]["file"]["file_data"].startswith("data:application/pdf;base64,")
    assert user["content"][2]["image_url"]["url"] == "https://example.com/cat.jpg"
    assert user["content"][3]["text"] == "https://example.com/report"


def test_function_calls_and_results_map_to_tool_calls_and_tool_messages() -> None:
    out = to_openai_messages(
        [
            msg("user", TextContent(text="Weather in Sydney and Perth?")),
            msg(
                "assistant",
                FunctionCallContent(call_id="a", name="get_weather", arguments={"city": "Sydney"}),
                FunctionCallContent(call_id="b", name="get_weather", arguments={"city": "Perth"}),
            ),
            msg(
                "tool",
                FunctionResultContent(call_id="a", result={"t": 21}),
                FunctionResultContent(call_id="b", error="no such city"),
            ),
        ]
    )

    assert out[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Sydney"}'},
            },
            {
                "id": "b",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Perth"}'},
            },
        ],
    }
    assert out[2:] == [
        {"role": "tool", "tool_call_id": "a", "content": '{"t": 21}'},
        {"role": "tool", "tool_call_id": "b", "content": "Error: no such city"},
    ]


def test_a_call_without_a_result_gets_one_and_a_result_without_its_call_is_dropped() -> None:
    out = to_openai_messages(
        [
            msg("tool", FunctionResultContent(call_id="orphan", result=1)),
            msg("assistant", FunctionCallContent(call_id="a", name="f")),
            msg("user", TextContent(text="never mind")),
        ]
    )

    assert [m["role"] for m in out] == ["assistant", "tool", "user"]
    assert out[1] == {"role": "tool", "tool_call_id": "a", "content": NOT_RUN}


def test_reasoning_goes_back_only_under_the_familys_field_and_usage_parts_never() -> None:
    history = [
        msg(
            "assistant",
            ReasoningContent(text="think"),
            TextContent(text="Answer"),
            UsageContent(input_tokens=1, output_tokens=2),
        )
    ]

    assert to_openai_messages(history) == [{"role": "assistant", "content": "Answer"}]
    assert to_openai_messages(history, reasoning_field="reasoning_content") == [
        {"role": "assistant", "content": "Answer", "reasoning_content": "think"}
    ]


def test_tools_are_sent_as_function_tools_with_their_schema() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}

    (tool,) = to_openai_tools([ToolSpec(name="get_weather", description="W", parameters=schema)])

    assert tool == {
        "type": "function",
        "function": {"name": "get_weather", "description": "W", "parameters": schema},
    }


def test_streamed_text_is_returned_piece_by_piece_and_assembled_with_usage() -> None:
    assembler = StreamAssembler()

    pieces = [
        assembler.feed(chunk({"role": "assistant", "content": "Sun"})),
        assembler.feed(chunk({"content": "ny"})),
        assembler.feed(chunk({}, finish="stop")),
        assembler.feed(
            wire(
                {
                    "id": "c-1",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "m-2025",
                    "choices": [],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
                }
            )
        ),
    ]
    result = assembler.result()

    assert pieces == ["Sun", "ny", "", ""]
    assert result.contents == [TextContent(text="Sunny")]
    assert result.usage == Usage(input_tokens=5, output_tokens=2)
    assert (result.finish_reason, result.model, result.response_id) == ("stop", "m-2025", "c-1")


def test_parallel_tool_calls_streamed_in_fragments_are_assembled_in_order() -> None:
    assembler = StreamAssembler()
    for delta in [
        {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x"'}}]},
        {"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": "{}"}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]},
    ]:
        assert assembler.feed(chunk(delta)) == ""
    assembler.feed(chunk({}, finish="tool_calls"))

    result = assembler.result()

    assert result.contents == [
        FunctionCallContent(call_id="a", name="f", arguments={"x": 1}),
        FunctionCallContent(call_id="b", name="g", arguments={}),
    ]
    assert result.finish_reason == "tool_calls"
    assert not result.problems


def test_calls_with_a_stop_finish_reason_still_finish_as_tool_calls() -> None:
    assembler = StreamAssembler()
    assembler.feed(chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f"}}]}))
    assembler.feed(chunk({}, finish="stop"))

    assert assembler.result().finish_reason == "tool_calls"


def test_reasoning_from_a_compatible_server_becomes_a_reasoning_part() -> None:
    assembler = StreamAssembler()
    assembler.feed(chunk({"reasoning_content": "Let me think. "}))
    assembler.feed(chunk({"reasoning_content": "Done."}))
    assembler.feed(chunk({"content": "42"}, finish="stop"))

    assert assembler.result().contents == [
        ReasoningContent(text="Let me think. Done."),
        TextContent(text="42"),
    ]


def test_unreadable_arguments_are_reported_and_almost_json_is_repaired() -> None:
    assembler = StreamAssembler()
    assembler.feed(
        chunk(
            {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{'x"}}]}
        )
    )
    assembler.feed(
        chunk(
            {
                "tool_calls": [
                    {"index": 1, "id": "b", "function": {"name": "g", "arguments": '{"y": 2,'}}
                ]
            }
        )
    )

    result = assembler.result()

    assert set(result.problems) == {"a"}
    assert "{'x" in result.problems["a"]
    assert result.repaired == ["b"]
    assert result.contents[1] == FunctionCallContent(call_id="b", name="g", arguments={"y": 2})
    assert result.contents[0] == FunctionCallContent(call_id="a", name="f", arguments={})


def test_a_whole_completion_is_assembled_like_a_stream() -> None:
    """A server that answers at once: calls listed without an index, arguments as an object,
    a null reasoning field."""
    assembler = StreamAssembler()
    text = assembler.feed(
        wire(
            {
                "id": "c-2",
                "object": "chat.completion",
                "model": "m-2025",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls",
                        "message": {
                            "role": "assistant",
                            "content": "Checking.",
                            "reasoning": None,
                            "tool_calls": [
                                {"id": "a", "function": {"name": "f", "arguments": '{"x": 1}'}},
                                {"id": "b", "function": {"name": "g", "arguments": {"y": 2}}},
                            ],
                        },
                    }
                ],
                "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
            }
        )
    )

    result = assembler.result()

    assert text == "Checking."
    assert result.contents == [
        TextContent(text="Checking."),
        FunctionCallContent(call_id="a", name="f", arguments={"x": 1}),
        FunctionCallContent(call_id="b", name="g", arguments={"y": 2}),
    ]
    assert result.usage == Usage(input_tokens=9, output_tokens=4)
    assert result.finish_reason == "tool_calls"


def test_fields_runbus_does_not_read_are_skipped_and_an_error_event_is_kept() -> None:
    extra = wire(
        {
            "id": "c-3",
            "model": "m",
            "system_fingerprint": "fp",
            "choices": [{"index": 0, "delta": {"content": "x", "refusal": None}, "logprobs": {}}],
            "timings": {"prompt_n": 31},
            "usage": None,
        }
    )
    error = wire({"error": {"message": "overloaded", "type": "server_error"}})

    assert StreamAssembler().feed(extra) == "x"
    assert error.error == {"message": "overloaded", "type": "server_error"}
