"""The state bag during a run: compare-and-set writes, so parallel tool calls and other
replicas never share a todo id or lose an update."""

import asyncio
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from runbus import todos as stored
from runbus.errors import RemoteError
from runbus.headers import RunContext
from runbus.messages import FunctionCallContent
from runbus.messages.sessions import SessionRecord
from runbus_gateway.harness import Harness, HarnessConfig, SessionState
from runbus_gateway.harness.errors import SessionGone, StateConflict

CTX = RunContext(run_id="r-1", session_id="s1", agent="travel", props={"tenant": "acme"})
NOW = datetime(2025, 1, 1, tzinfo=UTC)


class SessionStore:
    """The history service's session record as far as the state bag goes: one record, a
    revision bumped by every write, `conflict` on a stale expected revision."""

    def __init__(self) -> None:
        self.record = SessionRecord(
            session_id="s1",
            tenant="acme",
            owner="alice",
            agent="travel",
            created_at=NOW,
            updated_at=NOW,
            revision=1,
        )
        self.writes = 0
        self.conflicts = 0
        self.before_write: list[Any] = []
        """Callables run before a write lands: another writer that gets in first."""

    def put(self, key: str, value: Any) -> SessionRecord:
        state = dict(self.record.state)
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
        self.record = msgspec.structs.replace(
            self.record, state=state, revision=self.record.revision + 1
        )
        return self.record

    async def get_session(self, ctx: RunContext) -> SessionRecord:
        return self.record

    async def update_state(
        self, ctx: RunContext, key: str, value: Any, expected_revision: int
    ) -> SessionRecord:
        await asyncio.sleep(0)  # a real hop lets other tasks run
        if self.before_write:
            self.before_write.pop(0)()
        if expected_revision != self.record.revision:
            self.conflicts += 1
            raise RemoteError("conflict", "session 's1' changed")
        self.writes += 1
        return self.put(key, value)


HARNESS = Harness.from_config(msgspec.convert({"todos": {"enabled": True}}, HarnessConfig))


def add(*titles: str) -> FunctionCallContent:
    return FunctionCallContent(
        call_id=f"c-{'-'.join(titles)}",
        name="todos_add",
        arguments={"todos": [{"title": t} for t in titles]},
    )


def ids_in(store: SessionStore) -> list[int]:
    return [item.id for item in stored.load(store.record.state.get("todos")).items]


async def test_parallel_todo_calls_of_one_reply_get_unique_ids_and_all_are_kept() -> None:
    store = SessionStore()
    state = SessionState(store, CTX, store.record)

    results = await asyncio.gather(*(HARNESS.call_tool(state, add(f"item {n}")) for n in range(10)))

    assert sorted(r.result[0]["id"] for r in results) == list(range(1, 11))
    assert sorted(ids_in(store)) == list(range(1, 11))
    assert store.conflicts == 0


async def test_two_replicas_writing_the_same_session_lose_no_update() -> None:
    store = SessionStore()
    one = SessionState(store, CTX, store.record)
    two = SessionState(store, CTX, store.record)

    results = await asyncio.gather(
        *(HARNESS.call_tool(one, add(f"a{n}")) for n in range(5)),
        *(HARNESS.call_tool(two, add(f"b{n}")) for n in range(5)),
    )

    assert sorted(r.result[0]["id"] for r in results) == list(range(1, 11))
    assert sorted(ids_in(store)) == list(range(1, 11))
    assert store.conflicts > 0


async def test_a_change_is_applied_again_to_what_another_writer_stored() -> None:
    store = SessionStore()
    state = SessionState(store, CTX, store.record)
    store.before_write.append(lambda: store.put("todos", {"items": [], "next_id": 7}))

    result = await HARNESS.call_tool(state, add("after the other writer"))

    assert result.result[0]["id"] == 7
    assert ids_in(store) == [7]
    assert state.revision == store.record.revision


async def test_a_call_that_changes_nothing_writes_nothing() -> None:
    store = SessionStore()
    state = SessionState(store, CTX, store.record)

    result = await HARNESS.call_tool(
        state, FunctionCallContent(call_id="c1", name="todos_get_all", arguments={})
    )

    assert result.result == []
    assert store.writes == 0


async def test_a_writer_that_always_wins_makes_the_change_give_up_with_conflict() -> None:
    store = SessionStore()
    state = SessionState(store, CTX, store.record)
    store.before_write.extend(lambda n=n: store.put("other", n) for n in range(20))

    with pytest.raises(StateConflict) as raised:
        await state.change("todos", lambda current: ({"items": [], "next_id": 5}, None))

    assert raised.value.code == "conflict"
    assert "todos" not in store.record.state


async def test_a_todo_call_that_keeps_losing_is_an_error_result_the_model_can_retry() -> None:
    store = SessionStore()
    state = SessionState(store, CTX, store.record)
    store.before_write.extend(lambda n=n: store.put("other", n) for n in range(20))

    result = await HARNESS.call_tool(state, add("never lands"))

    assert result.error == (
        "state 'todos' of the session kept changing; gave up after 8 attempts; try the call again"
    )
    assert "todos" not in store.record.state


async def test_errors_other_than_conflict_are_not_retried() -> None:
    store = SessionStore()
    state = SessionState(store, CTX, store.record)

    def gone() -> None:
        raise RemoteError("not_found", "no session 's1'")

    store.before_write.append(gone)

    with pytest.raises(RemoteError, match="no session"):
        await HARNESS.call_tool(state, add("x"))


async def test_a_session_made_again_under_the_same_id_never_gets_the_runs_state() -> None:
    """The run's session is deleted and made again meanwhile (a conflict, then the re-read
    finds a record of another incarnation): the run stops instead of writing into it."""
    store = SessionStore()
    state = SessionState(store, CTX, store.record)

    def made_again() -> None:
        store.record = msgspec.structs.replace(
            store.record, incarnation="new", state={}, revision=store.record.revision + 5
        )

    store.before_write.append(made_again)

    with pytest.raises(SessionGone) as gone:
        await HARNESS.call_tool(state, add("the old run's todo"))

    assert gone.value.code == "not_found"
    assert store.writes == 0
    assert store.record.state == {}
    with pytest.raises(SessionGone):
        await state.refresh()
