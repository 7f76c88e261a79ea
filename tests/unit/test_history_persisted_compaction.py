"""Persisted compaction, end to end without a bus: the gateway's checkpointer writes a session's
runs and the compactions it persists into history's storage model (batches and compaction
markers in stream order), and every load afterwards is a list a provider accepts, however many
compactions were persisted, whichever strategy made them, wherever a run stopped. The originals
stay retrievable, and a session exported and imported loads the same."""

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Literal

from hypothesis import event, given
from hypothesis import strategies as st

from runbus.headers import RunContext
from runbus.history_batches import compaction_to_store, messages_to_store
from runbus.messages import (
    ChatMessage,
    FunctionCallContent,
    FunctionResultContent,
    TextContent,
)
from runbus.messages.compaction import (
    CompactionReport,
    CompactionStrategy,
    CompactResult,
    SlidingWindowCompaction,
    SummarizationCompaction,
    TokensExceed,
    ToolResultCompaction,
    TruncationCompaction,
    TurnsExceed,
)
from runbus.messages.history import HistoryCompaction, StoredBatch
from runbus.messages.sessions import StoredCompaction
from runbus_compaction.strategies import compact
from runbus_gateway.run.checkpoints import Checkpointer
from runbus_gateway.run.compaction import persisted_compaction
from runbus_history import core
from tests.unit.test_compaction_properties import (
    PROPERTY_SETTINGS,
    Fate,
    assert_valid_provider_list,
    specs,
    summariser,
)

Step = Literal["text", "tools", "crash"]
"""One model call of a run: an answer (the run ends), tool calls with their results, or tool
calls after which the run stops (a crash: no results, history repairs them on load)."""


@dataclass
class Stored:
    """History's stream for one session: batches and compaction markers, in sequence order."""

    entries: list[StoredBatch | HistoryCompaction] = field(default_factory=list)

    async def append_history(
        self,
        ctx: RunContext,
        messages: list[ChatMessage],
        *,
        release: bool = False,
        history_length: int | None = None,
        compaction: HistoryCompaction | None = None,
        history_end: int | None = None,
        incarnation: str = "",
        closes: bool = False,
    ) -> int | None:
        """What history's `on_append` stores: the compaction, then the new messages."""
        keep, _ = messages_to_store(messages)
        if compaction is not None:
            self.entries.append(compaction_to_store(compaction, ""))
        if keep:
            self.entries.append(StoredBatch(messages=keep))
        return len(self.entries)

    def load(self) -> tuple[list[ChatMessage], bool]:
        """What history's `_read` returns: from the latest compaction on."""
        start, latest = 0, None
        for sequence, entry in enumerate(self.entries):
            if isinstance(entry, HistoryCompaction):
                start, latest = sequence + 1, entry
        batches = [e for e in self.entries[start:] if isinstance(e, StoredBatch)]
        return core.repair(core.loaded(batches, latest)), latest is not None

    def originals(self) -> list[ChatMessage]:
        return core.loaded([e for e in self.entries if isinstance(e, StoredBatch)])

    def document(self) -> tuple[list[ChatMessage], list[StoredCompaction]]:
        """What export writes (stream sequence = position + 1)."""
        return core.document_history(
            [(n + 1, e) for n, e in enumerate(self.entries) if isinstance(e, StoredBatch)],
            [(n + 1, e) for n, e in enumerate(self.entries) if isinstance(e, HistoryCompaction)],
        )

    @classmethod
    def imported(
        cls, messages: list[ChatMessage], compactions: list[StoredCompaction], chunk: int
    ) -> "Stored":
        """What import writes from a document."""
        stored = cls()
        for part in core.document_chunks(messages, compactions, chunk):
            stored.entries.append(StoredBatch(messages=part) if isinstance(part, list) else part)
        return stored


INSTRUCTIONS = ChatMessage(
    role="system",
    contents=[TextContent(text="You are a travel assistant.")],
    message_id="instructions",
    source="context_provider",
)


async def one_run(
    stored: Stored, run: int, steps: list[Step], spec: CompactionStrategy, fate: Fate
) -> None:
    """One run as the gateway's loop makes it, with a compaction (persisted) before each
    model call."""
    run_id = f"r{run}"
    ctx = RunContext(run_id=run_id, session_id="s", agent="travel")
    history, _ = stored.load()
    user = ChatMessage(
        role="user",
        contents=[TextContent(text=f"question {run} " * 20)],
        message_id=f"{run_id}:in0",
        source="external",
    )
    prompt = [INSTRUCTIONS, *history, user]
    checkpoint = Checkpointer(stored, ctx)  # type: ignore[arg-type]
    checkpoint.add([user])
    calls = itertools.count()
    for index, step in enumerate(steps):
        result = await compact(prompt, spec, summarize=summariser(fate))
        assert_valid_provider_list(result.messages)
        persisted = persisted_compaction(
            CompactResult(
                messages=result.messages,
                groups=result.groups,
                total_tokens=result.total_tokens,
                compacted=result.compacted,
                report=result.report,
            ),
            run_id,
        )
        if persisted is not None:
            checkpoint.persist(persisted)
        if step == "text":
            reply = ChatMessage(
                role="assistant",
                contents=[TextContent(text="an answer " * 30)],
                message_id=f"{run_id}:m{index}",
                source="external",
            )
            prompt.append(reply)
            checkpoint.add([reply])
            break
        call_ids = [f"{run_id}-c{next(calls)}" for _ in range(1 + index % 2)]
        reply = ChatMessage(
            role="assistant",
            contents=[FunctionCallContent(call_id=c, name="get_weather") for c in call_ids],
            message_id=f"{run_id}:m{index}",
            source="external",
        )
        prompt.append(reply)
        checkpoint.add([reply])
        await checkpoint.flush()  # the calls are saved before any runs
        if step == "crash":
            break
        results = ChatMessage(
            role="tool",
            contents=[FunctionResultContent(call_id=c, result="sunny " * 40) for c in call_ids],
            message_id=f"{run_id}:t{index}",
            source="external",
        )
        prompt.append(results)
        checkpoint.add([results])
    await checkpoint.close(history_length=len(prompt) - 1)


keen = st.integers(0, 1200).map(lambda n: TokensExceed(tokens=n)) | st.integers(0, 3).map(
    lambda n: TurnsExceed(turns=n)
)
compacting: st.SearchStrategy[CompactionStrategy] = st.one_of(
    st.builds(SlidingWindowCompaction, trigger=keen, minimum_preserved=st.integers(1, 2)),
    st.builds(TruncationCompaction, trigger=keen, minimum_preserved=st.integers(1, 6)),
    st.builds(ToolResultCompaction, trigger=keen, minimum_preserved=st.integers(1, 6)),
    st.builds(SummarizationCompaction, trigger=keen, minimum_preserved=st.integers(1, 6)),
)
"""Specs that compact often, so most sessions persist several compactions (the random `specs`
of the compaction properties mostly leave short sessions alone)."""

runs = st.lists(
    st.lists(st.sampled_from(["text", "tools", "crash"]), min_size=1, max_size=4),
    min_size=1,
    max_size=8,
)


@PROPERTY_SETTINGS
@given(
    session=runs,
    spec=compacting | specs,
    fate=st.sampled_from(["text", "blank", "fails"]),
    chunk=st.integers(1, 7),
)
def test_any_number_of_persisted_compactions_loads_a_valid_list_and_keeps_every_original(
    session: list[list[Step]], spec: CompactionStrategy, fate: Fate, chunk: int
) -> None:
    stored = Stored()
    made: list[str] = []
    for run, steps in enumerate(session):
        asyncio.run(one_run(stored, run, steps, spec, fate))
        made += [m.message_id for m in stored.originals() if m.message_id.startswith(f"r{run}:")]

        loaded, compacted = stored.load()
        assert_valid_provider_list(loaded)
        ids = [m.message_id for m in loaded]
        assert len(ids) == len(set(ids)), "a message loaded twice"
        markers = [e for e in stored.entries if isinstance(e, HistoryCompaction)]
        assert compacted == bool(markers)
        if markers:
            assert not set(ids) & set(markers[-1].excluded_message_ids)

    markers = [e for e in stored.entries if isinstance(e, HistoryCompaction)]
    event(f"persisted compactions: {min(len(markers), 3)}{'+' if len(markers) > 3 else ''}")
    originals = stored.originals()
    assert [m.message_id for m in originals] == made, "an original was lost or duplicated"

    messages, compactions = stored.document()
    assert messages == originals
    again = Stored.imported(messages, compactions, chunk)
    assert again.load() == stored.load()
    assert again.originals() == originals


def test_a_sliding_window_persisted_each_run_keeps_the_loaded_history_bounded() -> None:
    window = SlidingWindowCompaction(trigger=TurnsExceed(turns=3))
    stored = Stored()
    sizes = []
    for run in range(30):
        asyncio.run(one_run(stored, run, ["tools", "tools", "text"], window, "text"))
        loaded, _ = stored.load()
        sizes.append(len(loaded))
    markers = [e for e in stored.entries if isinstance(e, HistoryCompaction)]

    assert max(sizes[5:]) <= 4 * 6  # at most the window of turns and one run more
    assert len(stored.originals()) == 30 * 6
    # One compaction per run that moved the window, not one per model call.
    assert len(markers) == 30 - 3


def test_a_compaction_that_excludes_a_message_of_its_own_run_is_not_persisted() -> None:
    def result(excluded: list[str]) -> CompactResult:
        return CompactResult(
            messages=[INSTRUCTIONS],
            groups=[],
            total_tokens=0,
            compacted=True,
            report=CompactionReport(excluded_message_ids=excluded),
        )

    assert persisted_compaction(result(["r0:in0", "r1:in0"]), "r1") is None
    persisted = persisted_compaction(result(["r0:in0"]), "r1")
    assert persisted is not None
    assert persisted.messages == []  # the instructions are the gateway's, never stored
    assert persisted.excluded_message_ids == ["r0:in0"]
