"""Session records remembered per history replica, so most appends need no record read.

An entry is a record at the revision it was read or written at. Every write to the sessions
bucket, by any replica, reaches each replica through a watcher: a write newer than an entry
drops it, and a read older than a write already heard of is not remembered. A hit is therefore
never older than the last write this replica has heard of (milliseconds behind the bucket), and
a write made from a hit is still a compare-and-set that fails on anything newer.
"""

from typing import Final

from runbus.messages.sessions import SessionRecord

MAX_ENTRIES: Final = 10_000


class RecordCache:
    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._records: dict[str, SessionRecord] = {}
        """Session key → the record, its `revision` set."""
        self._writes: dict[str, int] = {}
        """Session key → stream sequence of the last write the watcher reported."""
        self._floor = 0
        """The highest write sequence forgotten from `_writes`: a read older than it may have
        missed a write this cache no longer knows of, so it is not remembered."""

    def get(self, key: str) -> SessionRecord | None:
        """The remembered record, or None when it must be read."""
        return self._records.get(key)

    def heard_of(self, key: str) -> bool:
        """Whether `key` was read or written lately (it most likely exists: a delete is a
        write too), as far as this replica remembers."""
        return key in self._records or key in self._writes

    def remember(self, key: str, record: SessionRecord) -> None:
        """Note `record` as read (or written) at `record.revision`, unless a newer write was
        heard of or a newer record is already remembered."""
        revision = record.revision
        if revision < self._floor or self._writes.get(key, 0) > revision:
            return
        current = self._records.get(key)
        if current is not None and current.revision > revision:
            return
        self._records[key] = record
        if len(self._records) > self.max_entries:
            del self._records[next(iter(self._records))]

    def written(self, key: str, sequence: int) -> None:
        """The watcher heard of a write (update, delete or purge) to `key` at `sequence`."""
        current = self._records.get(key)
        if current is not None and current.revision < sequence:
            del self._records[key]
        self._writes.pop(key, None)
        self._writes[key] = sequence
        if len(self._writes) > self.max_entries:
            oldest = next(iter(self._writes))
            self._floor = max(self._floor, self._writes.pop(oldest))

    def forget(self, key: str) -> None:
        """Drop `key` now (this replica deleted it; the watcher will report it too)."""
        self._records.pop(key, None)
