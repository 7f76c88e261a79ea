"""Token counters: bytes / 4 by default, OpenAI's cl100k_base from the bundled table on request."""

import json

from runbus.messages import ChatMessage, FunctionResultContent, TextContent
from runbus_compaction.strategies import compact
from runbus_compaction.tokens import (
    BYTES,
    MESSAGE_OVERHEAD_TOKENS,
    counter_for,
    estimate_tokens,
    measure,
)


def test_the_cl100k_counter_counts_real_bpe_tokens_without_a_download() -> None:
    cl100k = counter_for("cl100k")

    assert cl100k.name == "cl100k"
    assert cl100k.count("Weather in Sydney?") == 4
    assert cl100k.count("The quick brown fox jumps over the lazy dog.") == 10
    assert counter_for("cl100k") is cl100k


def test_the_byte_counter_is_the_default_and_rounds_up() -> None:
    assert counter_for("bytes") is BYTES
    assert BYTES.count("Weather in Sydney?") == 5
    assert BYTES.count("") == 0


def test_json_tool_output_costs_more_real_tokens_than_bytes_over_four() -> None:
    flights = [
        {"flight_id": f"QF{400 + i}", "departs": f"{6 + i:02d}:15", "price_aud": 129 + 13 * i}
        for i in range(8)
    ]
    message = ChatMessage(
        role="tool", contents=[FunctionResultContent(call_id="c1", result=flights)]
    )

    by_bytes = estimate_tokens(message)
    by_bpe = estimate_tokens(message, counter_for("cl100k"))

    assert by_bpe > by_bytes * 1.3
    assert measure(message)[0] == len(json.dumps(flights, separators=(",", ":")))


async def test_a_compaction_counted_with_cl100k_says_so_in_its_report() -> None:
    prompt = [ChatMessage(role="user", contents=[TextContent(text="Weather in Sydney?")])]

    result = await compact(prompt, counter=counter_for("cl100k"))

    assert result.report.tokenizer == "cl100k"
    assert result.report.tokens_after == MESSAGE_OVERHEAD_TOKENS + 4
