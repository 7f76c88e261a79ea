"""Tools as typed Python functions: schema from the signature, validation like a public API,
trusted arguments filled from the run's headers, never from the model."""

import asyncio
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, get_args, get_origin, get_type_hints

import msgspec
import structlog

from runbus.headers import RunContext
from runbus.messages import FunctionResultContent, ToolSpec

from .errors import ToolDefinitionError

log = structlog.get_logger()

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_RESULT_BYTES = 64 * 1024


@dataclass(frozen=True)
class FromProp:
    """Marks a parameter as injected from the trusted run property `name` (`rb-prop-<name>`).

    `user_id: Annotated[str, FromProp("user_id")]` is hidden from the model's schema; a value
    the model sends for it is discarded.
    """

    name: str


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the run it serves (a parameter of this type is injected)."""

    run_id: str
    session_id: str
    agent: str
    props: dict[str, str]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    function: Callable[..., Any]
    arguments: type[msgspec.Struct]
    """Struct of the model-visible parameters, with their constraints."""
    injected: dict[str, str]
    """Parameter name → run property it is filled from."""
    context_parameter: str | None
    side_effect: bool
    timeout: float
    parameters_schema: dict[str, Any] = field(default_factory=dict)

    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name, description=self.description, parameters=self.parameters_schema
        )

    async def invoke(
        self, call_id: str, arguments: dict[str, Any], ctx: RunContext
    ) -> FunctionResultContent:
        """Validate, inject, run, cap: every failure becomes an error result the model reads."""
        forged = sorted(set(arguments) & set(self.injected))
        if forged:
            log.warning("tool_argument_discarded", tool=self.name, arguments=forged)
            arguments = {k: v for k, v in arguments.items() if k not in self.injected}
        try:
            parsed = msgspec.convert(arguments, self.arguments)
        except msgspec.ValidationError as exc:
            return FunctionResultContent(call_id=call_id, error=f"invalid arguments: {exc}")
        kwargs = msgspec.structs.asdict(parsed)
        for parameter, prop in self.injected.items():
            value = ctx.prop(prop)
            if not value:
                return FunctionResultContent(
                    call_id=call_id, error=f"the run has no trusted {prop!r} for this tool"
                )
            kwargs[parameter] = value
        if self.context_parameter:
            kwargs[self.context_parameter] = ToolContext(
                run_id=ctx.run_id, session_id=ctx.session_id, agent=ctx.agent, props=ctx.props
            )
        try:
            async with asyncio.timeout(self.timeout):
                if inspect.iscoroutinefunction(self.function):
                    result = await self.function(**kwargs)
                else:
                    result = await asyncio.to_thread(self.function, **kwargs)
        except TimeoutError:
            return FunctionResultContent(
                call_id=call_id, error=f"tool {self.name!r} timed out after {self.timeout}s"
            )
        except Exception as exc:
            log.warning("tool_failed", tool=self.name, error=repr(exc))
            return FunctionResultContent(
                call_id=call_id, error=f"tool {self.name!r} failed: {type(exc).__name__}: {exc}"
            )
        return _capped(call_id, self.name, result)


def _capped(call_id: str, name: str, result: Any) -> FunctionResultContent:
    try:
        value = msgspec.to_builtins(result)
    except TypeError as exc:
        return FunctionResultContent(call_id=call_id, error=f"tool {name!r} returned {exc}")
    size = len(msgspec.json.encode(value))
    if size > MAX_RESULT_BYTES:
        return FunctionResultContent(
            call_id=call_id,
            error=f"tool {name!r} result is {size} bytes, over the {MAX_RESULT_BYTES} byte cap",
        )
    return FunctionResultContent(call_id=call_id, result=value)


def _schema(arguments: type[msgspec.Struct]) -> dict[str, Any]:
    (_,), components = msgspec.json.schema_components([arguments], ref_template="#/$defs/{name}")
    schema: dict[str, Any] = components.pop(arguments.__name__)
    schema.pop("title", None)
    if components:
        schema["$defs"] = components
    return schema


class ToolRegistry:
    """The tools of one package; a tool executor serves the registries it is configured with."""

    def __init__(self) -> None:
        self.tools: dict[str, Tool] = {}

    def tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        side_effect: bool = False,
        timeout: float = 10.0,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a typed function as a tool; its docstring is the default description."""

        def register(function: Callable[..., Any]) -> Callable[..., Any]:
            tool = build_tool(
                function,
                name=name or function.__name__,
                description=description or inspect.getdoc(function) or "",
                side_effect=side_effect,
                timeout=timeout,
            )
            if tool.name in self.tools:
                raise ToolDefinitionError(f"tool {tool.name!r} is registered twice")
            self.tools[tool.name] = tool
            return function

        return register


def build_tool(
    function: Callable[..., Any], *, name: str, description: str, side_effect: bool, timeout: float
) -> Tool:
    if not TOOL_NAME.fullmatch(name):
        raise ToolDefinitionError(f"tool name {name!r} must match {TOOL_NAME.pattern}")
    hints = get_type_hints(function, include_extras=True)
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    injected: dict[str, str] = {}
    context_parameter: str | None = None
    for parameter in inspect.signature(function).parameters.values():
        annotation = hints.get(parameter.name)
        if annotation is None:
            raise ToolDefinitionError(f"{name}: parameter {parameter.name!r} needs a type")
        if annotation is ToolContext:
            context_parameter = parameter.name
            continue
        marker = _from_prop(annotation)
        if marker is not None:
            injected[parameter.name] = marker.name
            continue
        if parameter.default is inspect.Parameter.empty:
            fields.append((parameter.name, annotation))
        else:
            fields.append((parameter.name, annotation, parameter.default))
    arguments = msgspec.defstruct(
        f"{name}_arguments", fields, kw_only=True, forbid_unknown_fields=True
    )
    return Tool(
        name=name,
        description=description,
        function=function,
        arguments=arguments,
        injected=injected,
        context_parameter=context_parameter,
        side_effect=side_effect,
        timeout=timeout,
        parameters_schema=_schema(arguments),
    )


def _from_prop(annotation: Any) -> FromProp | None:
    if get_origin(annotation) is Annotated:
        for extra in get_args(annotation)[1:]:
            if isinstance(extra, FromProp):
                return extra
    return None
