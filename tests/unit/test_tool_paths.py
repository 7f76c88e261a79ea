"""Path parameters are confined to the deployment's tool root: what leaves it is refused before
the tool runs, with an error the model can read and that does not reveal the folder."""

from pathlib import Path
from typing import Annotated

import pytest

from runbus.headers import RunContext
from runbus_tool_executor.documents import tools as documents
from runbus_tool_executor.errors import ToolDefinitionError
from runbus_tool_executor.registry import ToolRegistry, UnderRoot

CTX = RunContext(run_id="r-1", props={"user_id": "alice", "tenant": "acme"})
READ = documents.tools["read_document"]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "files"
    (folder / "policies").mkdir(parents=True)
    (folder / "policies" / "travel.md").write_text("Economy under 3 hours.")
    (tmp_path / "secret.txt").write_text("the outside world")
    return folder


async def test_a_path_inside_the_root_is_read(root: Path) -> None:
    result = await READ.invoke("c1", {"path": "policies/travel.md"}, CTX, root=root)

    assert result.error is None
    assert result.result == {
        "name": "travel.md",
        "text": "Economy under 3 hours.",
        "truncated": False,
    }


async def test_dot_dot_that_stays_inside_the_root_is_allowed(root: Path) -> None:
    result = await READ.invoke("c1", {"path": "policies/../policies/travel.md"}, CTX, root=root)

    assert result.error is None


@pytest.mark.parametrize(
    "path",
    ["../../etc/passwd", "../secret.txt", "policies/../../secret.txt", "/etc/passwd", "a\x00b"],
    ids=["etc-passwd", "parent", "dot-dot-inside-out", "absolute", "nul"],
)
async def test_a_path_that_leaves_the_root_is_an_error_result(root: Path, path: str) -> None:
    result = await READ.invoke("c1", {"path": path}, CTX, root=root)

    assert result.result is None
    assert result.error is not None
    assert result.error.startswith("invalid arguments: `path`")
    assert str(root) not in result.error


async def test_a_symlink_pointing_out_of_the_root_is_refused(root: Path) -> None:
    (root / "escape").symlink_to(root.parent)

    result = await READ.invoke("c1", {"path": "escape/secret.txt"}, CTX, root=root)

    assert result.error is not None
    assert "leaves the tool's folder" in result.error


async def test_without_a_root_no_path_is_accepted(root: Path) -> None:
    result = await READ.invoke("c1", {"path": "policies/travel.md"}, CTX, root=None)

    assert result.error is not None
    assert "allows no file paths" in result.error


async def test_a_missing_document_is_named_without_the_folder(root: Path) -> None:
    result = await READ.invoke("c1", {"path": "policies/none.md"}, CTX, root=root)

    assert result.error is not None
    assert "none.md" in result.error
    assert str(root) not in result.error


@pytest.mark.parametrize("path", ["", "x" * 1025])
async def test_an_empty_or_overlong_path_is_refused_by_the_schema(root: Path, path: str) -> None:
    result = await READ.invoke("c1", {"path": path}, CTX, root=root)

    assert result.error is not None
    assert "path" in result.error


def test_the_schema_shows_a_path_as_a_relative_string() -> None:
    schema = READ.spec().parameters["properties"]["path"]

    assert schema["type"] == "string"
    assert schema["maxLength"] == 1024
    assert "relative" in schema["description"]


def test_only_a_path_parameter_may_be_confined() -> None:
    with pytest.raises(ToolDefinitionError, match="must be a Path"):

        @ToolRegistry().tool()
        def bad(name: Annotated[str, UnderRoot()]) -> str:
            return name
