"""One stack per data dir: the lock names its holder and is free again once released."""

import os
from pathlib import Path

from runbus.embedded import DataDirLock


def test_a_second_lock_on_the_same_data_dir_is_refused_and_names_the_holder(
    tmp_path: Path,
) -> None:
    first, second = DataDirLock(tmp_path / "data"), DataDirLock(tmp_path / "data")

    assert first.acquire()
    try:
        assert not second.acquire()
        assert second.holder() == os.getpid()
        assert DataDirLock(tmp_path / "other").acquire()
    finally:
        first.release()

    assert second.acquire()
    second.release()
