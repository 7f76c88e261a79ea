from runbus import subjects
from runbus.cancels import RunCancels, parse_cancel
from runbus.owners import Owner

ALICE = Owner("acme", "alice")
MALLORY = Owner("globex", "mallory")


class Work:
    def __init__(self) -> None:
        self.cancels = 0

    def cancel(self) -> None:
        self.cancels += 1


def test_a_cancel_stops_the_work_held_for_that_owners_run_and_no_other() -> None:
    cancels: RunCancels[Work] = RunCancels()
    mine, other_run, same_id_other_owner = Work(), Work(), Work()
    with (
        cancels.holding(ALICE, "r-1", mine),
        cancels.holding(ALICE, "r-2", other_run),
        cancels.holding(MALLORY, "r-1", same_id_other_owner),
    ):
        assert cancels.cancel(ALICE, "r-1") == 1

    assert (mine.cancels, other_run.cancels, same_id_other_owner.cancels) == (1, 0, 0)


def test_every_piece_of_work_of_a_run_is_cancelled_together() -> None:
    cancels: RunCancels[Work] = RunCancels()
    first, second = Work(), Work()
    with cancels.holding(ALICE, "r-1", first), cancels.holding(ALICE, "r-1", second):
        assert cancels.held(ALICE, "r-1") == [first, second]
        assert cancels.cancel(ALICE, "r-1") == 2
    assert (first.cancels, second.cancels) == (1, 1)


def test_work_is_no_longer_held_once_its_block_ends() -> None:
    cancels: RunCancels[Work] = RunCancels()
    work = Work()
    with cancels.holding(ALICE, "r-1", work):
        pass

    assert cancels.held(ALICE, "r-1") == []
    assert cancels.cancel(ALICE, "r-1") == 0
    assert work.cancels == 0


def test_work_of_no_run_is_never_held() -> None:
    cancels: RunCancels[Work] = RunCancels()
    with cancels.holding(ALICE, "", Work()):
        assert cancels.held(ALICE, "") == []


def test_a_cancel_subject_cancels_the_run_it_names() -> None:
    cancels: RunCancels[Work] = RunCancels()
    work = Work()
    with cancels.holding(ALICE, "r-1", work):
        assert cancels.cancel_subject(subjects.run_cancel("acme", "alice", "r-1")) == 1
        assert cancels.cancel_subject(subjects.run_cancel("globex", "mallory", "r-1")) == 0
        assert cancels.cancel_subject("runbus.cancel.acme") == 0
    assert work.cancels == 1


def test_the_last_cancelled_runs_are_remembered_when_asked_to() -> None:
    cancels: RunCancels[Work] = RunCancels(remember=2)
    for run_id in ("r-1", "r-2", "r-3"):
        cancels.cancel(ALICE, run_id)

    assert not cancels.cancelled(ALICE, "r-1")
    assert cancels.cancelled(ALICE, "r-2")
    assert cancels.cancelled(ALICE, "r-3")
    assert not cancels.cancelled(MALLORY, "r-3")
    assert not RunCancels[Work]().cancelled(ALICE, "r-3")


def test_a_cancel_subject_is_read_as_the_owner_and_run_it_names() -> None:
    assert parse_cancel(subjects.run_cancel("acme", "alice", "r-1")) == (ALICE, "r-1")
    assert parse_cancel(subjects.events("acme", "alice", "r-1")) is None
