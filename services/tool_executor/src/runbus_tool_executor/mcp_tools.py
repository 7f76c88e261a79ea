"""MCP tools as runbus tools: namespaced names, input schemas checked once and enforced on every
call, results mapped to runbus content and capped; the source that keeps them in step with
their servers."""

import base64
import binascii
import hashlib
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import jsonschema
import mcp_types as types
import msgspec
import structlog
from opentelemetry import trace

from runbus.messages import DataContent, FunctionResultContent, TextContent, UriContent

from .errors import InvalidArguments, McpCallFailed, McpToolError
from .mcp_servers import MCP_SEPARATOR, McpServer, McpServerConfig
from .registry import MAX_ARGUMENT_BYTES, TOOL_NAME, Parsed, Tool

log = structlog.get_logger()

MAX_SCHEMA_BYTES: Final = 64 * 1024
"""An input schema larger than this is not offered to a model."""
INLINE_DATA_BYTES: Final = 4 * 1024
"""Binary parts up to this size stay in the result; larger ones are stored by reference."""

StoreBlob = Callable[[bytes, str], Awaitable[UriContent]]
"""Stores bytes once and returns their `runbus-blob://` reference (the object store)."""


class McpArguments(msgspec.Struct):
    """Placeholder: an MCP tool's arguments are checked against its JSON Schema instead."""


@dataclass(frozen=True)
class McpTool(Tool):
    """A tool whose function is a `tools/call` over its server's session."""

    server: str = ""
    """The `[[mcp_servers]]` name it comes from."""
    remote_name: str = ""
    """The tool's name on its server."""
    validator: Any = field(default=None, compare=False, repr=False)
    """Compiled validator of the model-visible schema."""

    def parse(self, arguments: Mapping[str, Any], root: Path | None) -> Parsed:
        size = len(msgspec.json.encode(arguments))
        if size > MAX_ARGUMENT_BYTES:
            raise InvalidArguments(
                f"invalid arguments: {size} bytes, over the {MAX_ARGUMENT_BYTES} byte limit"
            )
        error = jsonschema.exceptions.best_match(self.validator.iter_errors(dict(arguments)))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            at = f"`{where}`: " if where else ""
            raise InvalidArguments(f"invalid arguments: {at}{error.message}")
        return Parsed(arguments=dict(arguments), values=dict(arguments))

    def _failed(
        self, call_id: str, exc: Exception, timed_out_after: float | None
    ) -> FunctionResultContent:
        span = trace.get_current_span()
        match exc:
            case McpToolError() if timed_out_after is None:
                span.set_attribute("error.type", "tool_error")
                return FunctionResultContent(call_id=call_id, error=exc.message)
            case McpCallFailed() if timed_out_after is None:
                log.warning("mcp_call_failed", tool=self.name, reason=exc.problem)
                span.set_attribute("error.type", "mcp_call_failed")
                return FunctionResultContent(
                    call_id=call_id, error=f"tool {self.name!r} could not run: {exc.message}"
                )
        return super()._failed(call_id, exc, timed_out_after)


def runbus_name(server: str, tool: str) -> str | None:
    """`server__tool` with characters a model's tool name cannot hold replaced; a name too
    long keeps its start and a digest of the whole, so it stays unique."""
    name = f"{server}{MCP_SEPARATOR}{re.sub(r'[^A-Za-z0-9_-]', '_', tool)}"
    if len(name) > 64:
        name = f"{name[:55]}_{hashlib.sha256(tool.encode()).hexdigest()[:8]}"
    return name if TOOL_NAME.fullmatch(name) else None


def schema_problem(schema: Any) -> str | None:
    """Why runbus cannot offer a tool with this input schema to a model, or None."""
    if not isinstance(schema, dict):
        return "its input schema is not a JSON object"
    if schema.get("type") != "object":
        return f"its input schema has type {schema.get('type')!r}, not 'object'"
    encoded = msgspec.json.encode(schema)
    if len(encoded) > MAX_SCHEMA_BYTES:
        return f"its input schema is {len(encoded)} bytes, over {MAX_SCHEMA_BYTES}"
    if re.search(rb'"\$ref":\s*"(?!#)', encoded):
        return "its input schema refers to a schema outside itself"
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"its input schema is not valid JSON Schema ({exc.message})"
    return None


def _model_schema(schema: dict[str, Any], hidden: Sequence[str]) -> dict[str, Any]:
    """The schema without the injected arguments, which the model never sees."""
    shown = dict(schema)
    shown.pop("title", None)
    if hidden:
        properties = {k: v for k, v in schema.get("properties", {}).items() if k not in hidden}
        shown["properties"] = properties
        required = [r for r in schema.get("required", []) if r not in hidden]
        if required:
            shown["required"] = required
        else:
            shown.pop("required", None)
    return shown


def build(
    config: McpServerConfig, listed: types.Tool, call: Callable[..., Awaitable[Any]]
) -> McpTool | str:
    """The runbus tool for one listed tool, or why it cannot be one."""
    name = runbus_name(config.name, listed.name)
    if name is None:
        return f"no tool name fits {TOOL_NAME.pattern}"
    problem = schema_problem(listed.input_schema)
    if problem is not None:
        return problem
    schema = _model_schema(listed.input_schema, list(config.inject))
    annotations = listed.annotations
    if config.read_only is not None:
        read_only, idempotent = listed.name in config.read_only, False
    else:
        read_only = bool(annotations and annotations.read_only_hint)
        idempotent = bool(annotations and annotations.idempotent_hint)
    return McpTool(
        name=name,
        description=listed.description or (annotations and annotations.title) or listed.name,
        function=call,
        arguments=McpArguments,
        injected=dict(config.inject),
        context_parameter=None,
        side_effect=not read_only,
        timeout=config.timeout,
        parameters_schema=schema,
        approval=config.approval,
        idempotent=idempotent,
        tenants=None if config.tenants is None else frozenset(config.tenants),
        agents=None if config.agents is None else frozenset(config.agents),
        max_result_bytes=config.max_result_bytes,
        server=config.name,
        remote_name=listed.name,
        validator=jsonschema.Draft202012Validator(schema),
    )


async def result_value(
    result: types.CallToolResult, *, limit: int, store_blob: StoreBlob | None
) -> Any:
    """The JSON value the model reads: the structured result if the server gave one, the text
    if that is all there is, else a list of runbus content parts. `isError` raises."""
    if result.is_error:
        text = "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))
        raise McpToolError(text or "the tool reported an error without saying which")
    value: Any
    if result.structured_content is not None:
        value = result.structured_content
    else:
        parts = [await _part(c, store_blob) for c in result.content]
        if len(parts) == 1 and isinstance(parts[0], TextContent):
            value = parts[0].text
        else:
            value = msgspec.to_builtins(parts)
    return capped(value, limit)


async def _part(
    content: types.ContentBlock, store_blob: StoreBlob | None
) -> TextContent | DataContent | UriContent:
    match content:
        case types.TextContent(text=text):
            return TextContent(text=text)
        case (
            types.ImageContent(data=data, mime_type=media_type)
            | types.AudioContent(data=data, mime_type=media_type)
        ):
            return await _binary(data, media_type, store_blob)
        case types.ResourceLink(uri=uri, mime_type=media_type):
            return UriContent(uri=str(uri), media_type=media_type)
        case types.EmbeddedResource(resource=types.TextResourceContents(uri=uri, text=text)):
            return TextContent(text=f"{uri}:\n{text}")
        case types.EmbeddedResource(
            resource=types.BlobResourceContents(blob=blob, mime_type=media_type)
        ):
            return await _binary(blob, media_type or "application/octet-stream", store_blob)
    return TextContent(text=f"[a {getattr(content, 'type', 'content')!s} part runbus cannot show]")


async def _binary(
    encoded: str, media_type: str, store_blob: StoreBlob | None
) -> TextContent | DataContent | UriContent:
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return TextContent(text=f"[{media_type} data that is not valid base64, dropped]")
    if len(data) <= INLINE_DATA_BYTES:
        return DataContent(data=data, media_type=media_type)
    if store_blob is None:
        return TextContent(text=f"[{media_type}, {len(data)} bytes, not shown]")
    return await store_blob(data, media_type)


def capped(value: Any, limit: int) -> Any:
    """`value`, or its JSON text cut to fit `limit` bytes with a note saying so."""
    encoded = msgspec.json.encode(value)
    if len(encoded) <= limit:
        return value
    text = value if isinstance(value, str) else encoded.decode()
    note = (
        f"\n[result cut: it was {len(encoded)} bytes, over this tool's {limit} byte cap; "
        "ask for less]"
    )
    cut = text.encode()[: max(limit - len(note.encode()), 0)].decode(errors="ignore")
    # JSON escapes (quotes, control characters) can make the encoded text several times longer:
    # the longest start of `cut` that fits, by bisection.
    fits, unsure = 0, len(cut)
    while fits < unsure:
        middle = (fits + unsure + 1) // 2
        if len(msgspec.json.encode(cut[:middle] + note)) <= limit:
            fits = middle
        else:
            unsure = middle - 1
    return cut[:fits] + note


ToolsChanged = Callable[[str, dict[str, McpTool]], Awaitable[None]]
"""Called with a server's name and its tools as they are now."""


class McpToolSource:
    """The MCP servers of one replica and the tools they serve."""

    def __init__(
        self,
        configs: Sequence[McpServerConfig],
        on_change: ToolsChanged,
        *,
        store_blob: StoreBlob | None = None,
    ) -> None:
        self.servers = {c.name: McpServer(c, self._listed) for c in configs}
        self.on_change = on_change
        self.store_blob = store_blob

    async def start(self, wait: bool = True) -> None:
        """Start every server; with `wait`, until each is ready or its first attempt failed
        (one that is not ready goes on being retried in the background)."""
        for server in self.servers.values():
            server.start()
        if wait:
            for server in self.servers.values():
                if not await server.wait_tried(server.config.startup_timeout):
                    log.warning(
                        "mcp_server_not_ready", server=server.name, reason=server.last_error
                    )

    async def stop(self) -> None:
        for server in self.servers.values():
            await server.stop()

    async def _listed(self, server: McpServer, listed: list[types.Tool]) -> None:
        config = server.config
        tools: dict[str, McpTool] = {}
        for entry in listed:
            if config.tools is not None and entry.name not in config.tools:
                continue
            built = build(config, entry, self._caller(server, entry.name))
            if isinstance(built, str):
                log.warning("mcp_tool_skipped", server=server.name, tool=entry.name, reason=built)
            elif built.name in tools:
                log.warning("mcp_tool_skipped", server=server.name, tool=entry.name, reason="name")
            else:
                tools[built.name] = built
        log.info("mcp_tools_listed", server=server.name, tools=sorted(tools))
        await self.on_change(server.name, tools)

    def _caller(self, server: McpServer, remote: str) -> Callable[..., Awaitable[Any]]:
        limit = server.config.max_result_bytes

        async def call(**arguments: Any) -> Any:
            result = await server.call_tool(remote, arguments)
            return await result_value(result, limit=limit, store_blob=self.store_blob)

        return call
