"""MCP tools without a server: names, schemas, result mapping and caps, and the config."""

import base64
from pathlib import Path
from typing import Any

import mcp_types as types
import msgspec
import pytest

from runbus.messages import UriContent
from runbus_tool_executor.config import load_deployment
from runbus_tool_executor.errors import InvalidArguments, McpToolError, ToolConfigError
from runbus_tool_executor.mcp_servers import McpServerConfig
from runbus_tool_executor.mcp_tools import (
    INLINE_DATA_BYTES,
    McpTool,
    build,
    capped,
    result_value,
    runbus_name,
    schema_problem,
)

PNG = b"\x89PNG\r\n\x1a\n"


async def _never(**arguments: Any) -> Any:
    raise AssertionError("not called")


def _listed(name: str = "lookup", **fields: Any) -> types.Tool:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    return types.Tool(name=name, input_schema=fields.pop("input_schema", schema), **fields)


def _result(*content: Any, **fields: Any) -> types.CallToolResult:
    return types.CallToolResult(content=list(content), **fields)


@pytest.mark.parametrize(
    ("tool", "name"),
    [
        ("get_time", "time__get_time"),
        ("files/read.v2", "time__files_read_v2"),
        ("x" * 80, f"time__{'x' * 49}_"),
    ],
    ids=["plain", "odd-characters", "too-long"],
)
def test_a_servers_tool_gets_a_name_a_model_accepts(tool: str, name: str) -> None:
    got = runbus_name("time", tool)

    assert got is not None
    assert got.startswith(name)
    assert len(got) <= 64


def test_two_long_names_that_share_a_start_stay_apart() -> None:
    assert runbus_name("s", "a" * 70 + "1") != runbus_name("s", "a" * 70 + "2")


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "object", "properties": {"a": {"type": "nonsense"}}}, "not valid JSON Schema"),
        ({"type": "array"}, "not 'object'"),
        ({"type": "object", "properties": {"a": {"$ref": "https://x/y"}}}, "outside itself"),
        ({"type": "object", "description": "x" * 70_000}, "bytes, over"),
    ],
    ids=["invalid", "not-an-object", "remote-ref", "huge"],
)
def test_a_schema_runbus_cannot_offer_a_model_is_named(schema: Any, problem: str) -> None:
    found = schema_problem(schema)

    assert found is not None
    assert problem in found


def test_a_tool_is_side_effecting_unless_the_server_says_it_only_reads() -> None:
    config = McpServerConfig(name="s", command="x")
    hinted = _listed(annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True))

    plain = build(config, _listed(), _never)
    reader = build(config, hinted, _never)

    assert isinstance(plain, McpTool)
    assert isinstance(reader, McpTool)
    assert plain.side_effect
    assert not plain.idempotent
    assert not reader.side_effect
    assert reader.idempotent


def test_a_deployments_read_only_list_overrules_the_servers_hints() -> None:
    config = McpServerConfig(name="s", command="x", read_only=["lookup"])
    hinted = _listed("erase", annotations=types.ToolAnnotations(read_only_hint=True))

    erase = build(config, hinted, _never)
    lookup = build(config, _listed(), _never)

    assert isinstance(erase, McpTool)
    assert isinstance(lookup, McpTool)
    assert erase.side_effect
    assert not lookup.side_effect


def test_an_injected_argument_is_hidden_from_the_model_and_refused_in_its_schema() -> None:
    config = McpServerConfig(name="s", command="x", inject={"q": "user_id"})
    tool = build(config, _listed(), _never)

    assert isinstance(tool, McpTool)
    assert tool.spec().parameters == {"type": "object", "properties": {}}
    assert tool.without_injected({"q": "mallory"}) == {}


def test_arguments_are_checked_against_the_schema_with_a_message_the_model_reads() -> None:
    tool = build(McpServerConfig(name="s", command="x"), _listed(), _never)
    assert isinstance(tool, McpTool)

    with pytest.raises(InvalidArguments, match=r"`q`: 5 is not of type 'string'"):
        tool.parse({"q": 5}, None)
    with pytest.raises(InvalidArguments, match="'q' is a required property"):
        tool.parse({}, None)
    assert tool.parse({"q": "ok"}, None).arguments == {"q": "ok"}


async def test_text_alone_is_the_result_and_structured_content_wins_over_it() -> None:
    text = types.TextContent(text="12:00")

    plain = await result_value(_result(text), limit=1000, store_blob=None)
    structured = await result_value(
        _result(text, structured_content={"time": "12:00"}), limit=1000, store_blob=None
    )

    assert plain == "12:00"
    assert structured == {"time": "12:00"}


async def test_mixed_content_becomes_runbus_content_parts() -> None:
    encoded = base64.b64encode(PNG).decode()

    value = await result_value(
        _result(
            types.TextContent(text="see"),
            types.ImageContent(data=encoded, mime_type="image/png"),
            types.ResourceLink(name="doc", uri="https://example.com/doc", mime_type="text/html"),
            types.EmbeddedResource(
                resource=types.TextResourceContents(uri="file:///a.txt", text="body")
            ),
        ),
        limit=10_000,
        store_blob=None,
    )

    assert value == [
        {"type": "text", "text": "see"},
        {"type": "data", "data": encoded, "media_type": "image/png"},
        {"type": "uri", "uri": "https://example.com/doc", "media_type": "text/html"},
        {"type": "text", "text": "file:///a.txt:\nbody"},
    ]


async def test_a_large_image_is_stored_by_reference_or_else_named_in_a_note() -> None:
    big = base64.b64encode(b"x" * (INLINE_DATA_BYTES + 1)).decode()
    image = types.ImageContent(data=big, mime_type="image/png")
    stored: list[tuple[int, str]] = []

    async def store(data: bytes, media_type: str) -> UriContent:
        stored.append((len(data), media_type))
        return UriContent(uri="runbus-blob://abc", media_type=media_type)

    kept = await result_value(_result(image, image), limit=10_000, store_blob=store)
    noted = await result_value(_result(image, image), limit=10_000, store_blob=None)

    assert kept[0] == {"type": "uri", "uri": "runbus-blob://abc", "media_type": "image/png"}
    assert stored == [(INLINE_DATA_BYTES + 1, "image/png")] * 2
    assert noted[0] == {
        "type": "text",
        "text": f"[image/png, {INLINE_DATA_BYTES + 1} bytes, not shown]",
    }


async def test_an_error_result_raises_with_the_servers_text() -> None:
    with pytest.raises(McpToolError, match="disk full"):
        await result_value(
            _result(types.TextContent(text="disk full"), is_error=True),
            limit=1000,
            store_blob=None,
        )


def test_a_result_over_the_cap_is_cut_with_a_note_and_fits() -> None:
    value = capped({"rows": ["é" * 100] * 100}, 2000)

    assert isinstance(value, str)
    assert len(msgspec.json.encode(value)) <= 2000
    assert value.endswith("over this tool's 2000 byte cap; ask for less]")
    assert capped("short", 2000) == "short"


def test_text_that_json_escapes_longer_is_still_cut_to_fit() -> None:
    value = capped('"\n' * 5000, 1000)

    assert len(msgspec.json.encode(value)) <= 1000
    assert value.startswith('"\n"')


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ('name = "a"', "give `command` (stdio) or `url`"),
        ('name = "a"\ncommand = "x"\nurl = "http://h/mcp"', "give `command` (stdio) or `url`"),
        ('name = "a"\ncommand = "x"\ntoken_env = "T"', "token and headers go with `url`"),
        ('name = "a"\nurl = "http://h/mcp"\nargs = ["-v"]', "args, env and cwd go with `command`"),
        ('name = "a__b"\ncommand = "x"', "name"),
        ('name = "a"\ncommand = "x"\nprogram = "y"', "program"),
    ],
    ids=["neither", "both", "token-on-stdio", "args-on-http", "double-underscore", "unknown-key"],
)
def test_a_bad_mcp_server_entry_fails_at_start_naming_the_file(
    tmp_path: Path, entry: str, says: str
) -> None:
    config = tmp_path / "tools.toml"
    config.write_text(f"[[mcp_servers]]\n{entry}\n")

    with pytest.raises(ToolConfigError, match=str(config)) as raised:
        load_deployment(config)
    assert says in str(raised.value)


def test_two_servers_of_one_name_fail_at_start(tmp_path: Path) -> None:
    config = tmp_path / "tools.toml"
    config.write_text('[[mcp_servers]]\nname = "a"\ncommand = "x"\n' * 2)

    with pytest.raises(ToolConfigError, match="each name once"):
        load_deployment(config)


def test_an_override_may_name_a_tool_an_mcp_server_will_list(tmp_path: Path) -> None:
    config = tmp_path / "tools.toml"
    config.write_text(
        '[[mcp_servers]]\nname = "git"\ncommand = "mcp-server-git"\n'
        '[tools.git__git_commit]\napproval = "always"\n'
    )

    deployment = load_deployment(config)
    tool = build(deployment.mcp_servers[0], _listed("git_commit"), _never)

    assert deployment.apply({}) == {}
    assert isinstance(tool, McpTool)
    assert deployment.override(tool).approval == "always"
