"""Tools as typed Python functions: schema from the signature, validation like a public API,
paths confined to a root, trusted arguments filled from the run's headers, never from the model.
"""

import asyncio
import contextlib
import contextvars
import inspect
import re
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Final, Literal, TypeVar, get_args, get_origin, get_type_hints

import msgspec
import structlog
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from runbus.headers import RunContext
from runbus.interrupts import Interrupt
from runbus.messages import FunctionResultContent, ToolSpec

from .errors import InvalidArguments, ToolDefinitionError
from .middleware import Middleware

log = structlog.get_logger()
M = TypeVar("M")

TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_RESULT_BYTES: Final = 64 * 1024
MAX_ARGUMENT_BYTES: Final = 64 * 1024
MAX_PATH_LENGTH: Final = 1024

ApprovalRule = Callable[[Mapping[str, Any]], str | None]
"""Given the validated model-visible arguments: why a human must approve, or None."""
Approval = Literal["never", "always"] | ApprovalRule
"""A tool's approval policy."""


@dataclass(frozen=True)
class FromProp:
    """Marks a parameter as injected from the trusted run property `name` (`rb-prop-<name>`).

    `user_id: Annotated[str, FromProp("user_id")]` is hidden from the model's schema; a value
    the model sends for it is discarded.
    """

    name: str


@dataclass(frozen=True)
class UnderRoot:
    """Marks a `Path` parameter as confined to the deployment's tool root (`RUNBUS_TOOL_ROOT`).

    `path: Annotated[Path, UnderRoot()]` is a string relative to the root in the schema; the
    tool receives the resolved absolute `Path`. Absolute paths and paths that leave the root
    (`..`, a symlink pointing out) are refused before the tool runs.
    """


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the run it serves (a parameter of this type is injected)."""

    run_id: str
    session_id: str
    agent: str
    props: dict[str, str]
    call_id: str = ""
    """The model's call id; with `run_id` the call's idempotency key."""
    approved_by: str = ""
    """User id of the human who approved this call, when it needed approval."""


@dataclass(frozen=True)
class Parsed:
    """Arguments that passed validation."""

    arguments: dict[str, Any]
    """The model-visible arguments in JSON form, defaults filled in: what middleware and an
    approver see."""
    values: dict[str, Any]
    """The same as Python values for the function (dates, resolved paths)."""


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
    """Changes the world: calls are recorded by idempotency key and run at most once."""
    timeout: float
    """Seconds a call may run before it is cut (also capped by the run's deadline)."""
    parameters_schema: dict[str, Any] = field(default_factory=dict)
    paths: frozenset[str] = frozenset()
    """Parameters confined to the tool root."""
    approval: Approval = "never"
    idempotent: bool = False
    """Safe to run again if an executor died mid-call (only matters with `side_effect`)."""
    tenants: frozenset[str] | None = None
    """Tenants that may use the tool; None is every tenant."""
    agents: frozenset[str] | None = None
    """Agents that may use the tool; None is every agent."""
    max_result_bytes: int = MAX_RESULT_BYTES
    inline: bool = False
    """A sync function cheap enough to run on the event loop (pure computation, no I/O, well
    under a millisecond): no thread per call. One that blocks would stall this replica."""

    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name, description=self.description, parameters=self.parameters_schema
        )

    def visible_to(self, ctx: RunContext) -> bool:
        """May the run's tenant and agent see and call this tool?"""
        return visible(self.tenants, self.agents, ctx)

    def without_injected(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments minus any the model may not choose (logged: it tried)."""
        forged = sorted(set(arguments) & set(self.injected))
        if forged:
            log.warning("tool_argument_discarded", tool=self.name, arguments=forged)
        return {k: v for k, v in arguments.items() if k not in self.injected}

    def parse(self, arguments: Mapping[str, Any], root: Path | None) -> Parsed:
        """Validate like public API input; raise `InvalidArguments` with text the model reads."""
        size = len(msgspec.json.encode(arguments))
        if size > MAX_ARGUMENT_BYTES:
            raise InvalidArguments(
                f"invalid arguments: {size} bytes, over the {MAX_ARGUMENT_BYTES} byte limit"
            )
        try:
            parsed = msgspec.convert(arguments, self.arguments)
        except msgspec.ValidationError as exc:
            raise InvalidArguments(f"invalid arguments: {exc}") from None
        values = msgspec.structs.asdict(parsed)
        for name in self.paths:
            values[name] = confine(root, name, values[name])
        return Parsed(arguments=msgspec.to_builtins(parsed), values=values)

    def approval_reason(self, arguments: Mapping[str, Any]) -> str | None:
        """Why this call needs a human's approval by the tool's own policy, or None."""
        if self.approval == "never":
            return None
        if self.approval == "always":
            return f"every {self.name} call needs approval"
        return self.approval(arguments)

    async def run(
        self,
        parsed: Parsed,
        ctx: RunContext,
        *,
        call_id: str,
        timeout: float | None = None,
        approved_by: str = "",
    ) -> FunctionResultContent:
        """Inject, run, cap: every failure becomes an error result the model reads."""
        kwargs = dict(parsed.values)
        for parameter, prop in self.injected.items():
            value = ctx.prop(prop)
            if not value:
                return FunctionResultContent(
                    call_id=call_id, error=f"the run has no trusted {prop!r} for this tool"
                )
            kwargs[parameter] = value
        if self.context_parameter:
            kwargs[self.context_parameter] = ToolContext(
                run_id=ctx.run_id,
                session_id=ctx.session_id,
                agent=ctx.agent,
                props=ctx.props,
                call_id=call_id,
                approved_by=approved_by,
            )
        limit = self.timeout if timeout is None else timeout
        scope = asyncio.timeout(limit)
        try:
            async with scope:
                result = await self._call(kwargs)
        except Interrupt:
            if self.side_effect:
                # Asked again after the answer, it would have acted twice.
                return FunctionResultContent(
                    call_id=call_id,
                    error=f"tool {self.name!r} changes things and so cannot ask a question",
                )
            raise
        except Exception as exc:
            return self._failed(call_id, exc, limit if scope.expired() else None)
        return _capped(call_id, self.name, result, self.max_result_bytes)

    def _failed(
        self, call_id: str, exc: Exception, timed_out_after: float | None
    ) -> FunctionResultContent:
        span = trace.get_current_span()
        if timed_out_after is not None:
            log.warning("tool_timed_out", tool=self.name, timeout=timed_out_after)
            span.set_attribute("error.type", "tool_timeout")
            maybe = " It may or may not have taken effect." if self.side_effect else ""
            return FunctionResultContent(
                call_id=call_id,
                error=f"tool {self.name!r} timed out after {timed_out_after:g}s.{maybe}",
            )
        log.error("tool_failed", tool=self.name, exc_info=exc)
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        span.set_attribute("error.type", type(exc).__qualname__)
        return FunctionResultContent(
            call_id=call_id, error=f"tool {self.name!r} failed: {type(exc).__name__}: {exc}"
        )

    async def _call(self, kwargs: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(self.function):
            return await self.function(**kwargs)
        if self.inline:
            return self.function(**kwargs)
        future = _in_thread(self.name, self.function, kwargs)
        try:
            return await future
        except asyncio.CancelledError:
            log.warning("tool_thread_abandoned", tool=self.name)
            raise

    async def invoke(
        self,
        call_id: str,
        arguments: Mapping[str, Any],
        ctx: RunContext,
        *,
        root: Path | None = None,
    ) -> FunctionResultContent:
        """Validate, inject, run, cap — without middleware, approval or idempotency, which
        belong to the executor."""
        try:
            parsed = self.parse(self.without_injected(arguments), root)
        except InvalidArguments as exc:
            return FunctionResultContent(call_id=call_id, error=exc.message)
        return await self.run(parsed, ctx, call_id=call_id)


def _in_thread(name: str, function: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """Run a sync tool in a daemon thread of its own, with this task's context (trace and log
    ids). A thread cannot be stopped: one that outlives its timeout runs on unobserved, and
    being a daemon it never holds up the process's exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def target() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (context.run(function, **kwargs), None)
        except BaseException as exc:
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed while the tool ran
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=target, name=f"tool-{name}", daemon=True).start()
    return future


def visible(
    tenants: Collection[str] | None, agents: Collection[str] | None, ctx: RunContext
) -> bool:
    """A tool limited to some tenants or agents is seen only by runs of those."""
    return (tenants is None or ctx.prop("tenant") in tenants) and (
        agents is None or ctx.agent in agents
    )


def confine(root: Path | None, parameter: str, raw: str) -> Path:
    """`raw` resolved under `root`; anything that would leave it is refused."""
    if root is None:
        raise InvalidArguments(
            f"invalid arguments: `{parameter}`: this deployment allows no file paths"
        )
    relative = PurePosixPath(raw)
    if "\x00" in raw or relative.is_absolute():
        raise InvalidArguments(
            f"invalid arguments: `{parameter}` must be a path relative to the tool's folder"
        )
    base = root.resolve()
    resolved = (base / relative).resolve()
    if not resolved.is_relative_to(base):
        raise InvalidArguments(
            f"invalid arguments: `{parameter}` leaves the tool's folder; use a path inside it"
        )
    return resolved


def _capped(call_id: str, name: str, result: Any, limit: int) -> FunctionResultContent:
    try:
        value = msgspec.to_builtins(result)
    except TypeError as exc:
        return FunctionResultContent(call_id=call_id, error=f"tool {name!r} returned {exc}")
    size = len(msgspec.json.encode(value))
    if size > limit:
        return FunctionResultContent(
            call_id=call_id,
            error=f"tool {name!r} result is {size} bytes, over the {limit} byte cap",
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
    """The tools of one package, and the middleware the package recommends; a tool executor
    serves the registries it is configured with."""

    def __init__(self) -> None:
        self.tools: dict[str, Tool] = {}
        self.middleware: list[Middleware] = []

    def use(self, middleware: Middleware) -> None:
        """Add a function middleware to the package's default chain."""
        self.middleware.append(middleware)

    def tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        side_effect: bool = False,
        timeout: float = 10.0,
        approval: Approval = "never",
        idempotent: bool = False,
        tenants: Iterable[str] | None = None,
        agents: Iterable[str] | None = None,
        max_result_bytes: int = MAX_RESULT_BYTES,
        inline: bool = False,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a typed function as a tool; its docstring is the default description."""

        def register(function: Callable[..., Any]) -> Callable[..., Any]:
            tool = build_tool(
                function,
                name=name or function.__name__,
                description=description or inspect.getdoc(function) or "",
                side_effect=side_effect,
                timeout=timeout,
                approval=approval,
                idempotent=idempotent,
                tenants=None if tenants is None else frozenset(tenants),
                agents=None if agents is None else frozenset(agents),
                max_result_bytes=max_result_bytes,
                inline=inline,
            )
            if tool.name in self.tools:
                raise ToolDefinitionError(f"tool {tool.name!r} is registered twice")
            self.tools[tool.name] = tool
            return function

        return register


_PATH_FIELD: Final = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_PATH_LENGTH,
        description="A path relative to the tool's folder.",
    ),
]


def build_tool(
    function: Callable[..., Any],
    *,
    name: str,
    description: str,
    side_effect: bool,
    timeout: float,
    approval: Approval = "never",
    idempotent: bool = False,
    tenants: frozenset[str] | None = None,
    agents: frozenset[str] | None = None,
    max_result_bytes: int = MAX_RESULT_BYTES,
    inline: bool = False,
) -> Tool:
    if not TOOL_NAME.fullmatch(name):
        raise ToolDefinitionError(f"tool name {name!r} must match {TOOL_NAME.pattern}")
    if not timeout > 0:
        raise ToolDefinitionError(f"{name}: timeout must be positive, not {timeout!r}")
    if approval not in ("never", "always") and not callable(approval):
        raise ToolDefinitionError(f"{name}: approval must be 'never', 'always' or a function")
    hints = get_type_hints(function, include_extras=True)
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    injected: dict[str, str] = {}
    paths: set[str] = set()
    context_parameter: str | None = None
    for parameter in inspect.signature(function).parameters.values():
        annotation = hints.get(parameter.name)
        if annotation is None:
            raise ToolDefinitionError(f"{name}: parameter {parameter.name!r} needs a type")
        if annotation is ToolContext:
            context_parameter = parameter.name
            continue
        marker = _marker(annotation, FromProp)
        if marker is not None:
            injected[parameter.name] = marker.name
            continue
        if _marker(annotation, UnderRoot) is not None:
            if get_args(annotation)[0] is not Path:
                raise ToolDefinitionError(f"{name}: {parameter.name!r} under a root must be a Path")
            paths.add(parameter.name)
            annotation = _PATH_FIELD
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
        paths=frozenset(paths),
        approval=approval,
        idempotent=idempotent,
        tenants=tenants,
        agents=agents,
        max_result_bytes=max_result_bytes,
        inline=inline and not inspect.iscoroutinefunction(function),
    )


def _marker(annotation: Any, kind: type[M]) -> M | None:
    if get_origin(annotation) is Annotated:
        for extra in get_args(annotation)[1:]:
            if isinstance(extra, kind):
                return extra
    return None
