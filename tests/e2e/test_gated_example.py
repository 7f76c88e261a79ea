"""examples/gated/README.md as written: the stack with the example's agent, a run that waits
for approval, the approval from another terminal, then the same over curl; every command in
order, each checked against what the page shows it printing."""

from pathlib import Path
from typing import Final

from tests.e2e.test_readme_walkthrough import REPO, Facts, fresh_directory, walk_page
from tests.e2e.walkthrough import Walkthrough

SHOWN_BY_PROSE: Final[Facts] = {
    "curl -N": ["event: run.approval_requested", "event: run.completed", '"approved_by":"alice"'],
    "curl -H": ['"decision":"approved"'],
}


async def test_the_gated_example_waits_for_approval_and_books_once_approved(
    tmp_path: Path,
) -> None:
    walk = Walkthrough(tmp_path, fresh_directory(tmp_path))
    try:
        commands = await walk_page(REPO / "examples" / "gated" / "README.md", walk, SHOWN_BY_PROSE)
    finally:
        stopped = await walk.stop()

    for ran in stopped:
        assert ran.code == 0, f"{ran.step.command!r} did not stop cleanly:\n{ran.printed}"
    # runbus up, run, approve, two curls.
    assert commands == 5
