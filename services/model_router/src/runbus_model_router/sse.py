"""Server-sent events, parsed from the bytes as they arrive: each event's `data` once its blank
line has come. Only `data` matters to a chat-completions stream; `event:`, `id:`, `retry:` and
comment lines (keep-alive pings such as `: PROCESSING`) are skipped."""


class SSEDecoder:
    """Feed it the response body piece by piece; it returns the data of each completed event.

    Lines end in LF or CRLF. An event's several `data:` lines are joined with LF, as the
    format says; one leading space after the colon is not part of the value.
    """

    def __init__(self) -> None:
        self._tail = b""
        self._data: list[bytes] = []

    def feed(self, piece: bytes) -> list[bytes]:
        if self._tail:
            piece = self._tail + piece
        lines = piece.split(b"\n")
        self._tail = lines.pop()
        events: list[bytes] = []
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    events.append(self._data[0] if len(self._data) == 1 else b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
        return events

    def close(self) -> list[bytes]:
        """The last event of a body that ended without its blank line."""
        events = self.feed(b"\n\n") if self._tail or self._data else []
        self._tail = b""
        return events
