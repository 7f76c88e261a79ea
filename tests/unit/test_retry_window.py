"""How long a run failing `unavailable` keeps being delivered: long enough for a cluster to
elect new leaders, bounded so a run whose gateway keeps dying is dead-lettered."""

from runbus.consumer import backoff
from runbus.settings import Settings
from runbus_gateway.bookkeeping import RETRY_WINDOW, attempts_within


def test_the_shipped_retry_window_outlasts_a_cluster_election() -> None:
    attempts = attempts_within(Settings().run_retry_window)
    waited = sum(backoff(n) for n in range(1, attempts))

    assert Settings().run_retry_window == RETRY_WINDOW == 30.0
    # About 20 s to elect new leaders after a node is lost (measured by tests/cluster).
    assert waited >= 30.0
    assert attempts == 7


def test_no_retry_window_runs_a_run_once_and_a_short_one_as_before() -> None:
    assert attempts_within(0) == 1
    assert attempts_within(3.5) == 4  # 0.5 + 1 + 2 s apart
    assert attempts_within(3.6) == 5
