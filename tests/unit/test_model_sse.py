"""Server-sent events as providers write them, cut anywhere by the network."""

from runbus_model_router.sse import SSEDecoder

STREAM = (
    b": keep-alive\n\n"
    b'data: {"a": 1}\n\n'
    b"event: message\r\nid: 7\r\n"
    b'data: {"b":\r\ndata: 2}\r\n\r\n'
    b"data:[DONE]\n\n"
)


def test_events_come_out_whole_however_the_bytes_are_cut() -> None:
    for size in (1, 2, 3, 7, len(STREAM)):
        decoder = SSEDecoder()
        events = [
            e for i in range(0, len(STREAM), size) for e in decoder.feed(STREAM[i : i + size])
        ]
        events += decoder.close()

        assert events == [b'{"a": 1}', b'{"b":\n2}', b"[DONE]"], size


def test_a_body_that_ends_without_its_blank_line_still_gives_its_last_event() -> None:
    decoder = SSEDecoder()

    assert decoder.feed(b'data: {"a": 1}\n\ndata: {"b": 2}') == [b'{"a": 1}']
    assert decoder.close() == [b'{"b": 2}']
    assert decoder.close() == []
