"""Choosing where a call goes: rules pick the route, capability checks pick the targets that
can take the request (re-routing or applying the placeholder policy when none can)."""

from collections.abc import Callable
from dataclasses import dataclass

from runbus.headers import RunContext
from runbus.messages import ModelRequest

from .backends import ModelBackend
from .config import RouteConfig, RouterConfig, RuleConfig, TargetConfig, is_builtin
from .errors import UnknownRoute, UnsupportedRequest
from .features import Features, features_of, with_placeholders

BUILTIN_FAMILY = "runbus"
UNLIMITED = TargetConfig(backend="builtin", images=True, audio=True, tools=True)
"""What a built-in backend accepts: anything, with no limits."""


@dataclass(frozen=True)
class Target:
    """One model at one backend, as a route lists it."""

    key: str
    """`<backend>/<model>`: targets with the same key share one guard (cap, buckets, breaker)."""
    backend: ModelBackend
    model: str
    """What `gen_ai.request.model` says."""
    family: str
    """Provider family (`gen_ai.provider.name`); reasoning goes back only to its own family."""
    config: TargetConfig
    reasoning_field: str | None = None
    """Set when the backend sends reasoning of its own family back to the model."""
    server: tuple[str, int] | None = None
    """Address and port of a remote provider."""


@dataclass(frozen=True)
class Route:
    name: str
    targets: list[Target]
    reroute: list[str]
    unsupported: str
    repair_attempts: int


@dataclass(frozen=True)
class Plan:
    """Where one call will be tried, in order, and the request each target gets."""

    route: Route
    attempts: list[tuple[Target, ModelRequest]]
    features: Features


def missing(target: TargetConfig, features: Features) -> list[str]:
    """What `target` lacks to take a request with `features`."""
    lacks = []
    if features.has_images and not target.images:
        lacks.append("images")
    if features.has_audio and not target.audio:
        lacks.append("audio")
    if features.needs_tools and not target.tools:
        lacks.append("tools")
    window = features.tokens + features.max_output_tokens
    if target.max_context is not None and window > target.max_context:
        lacks.append("context")
    return lacks


def _matches(rule: RuleConfig, request: ModelRequest, ctx: RunContext, f: Features) -> bool:
    checks = (
        rule.route is None or rule.route == request.route,
        rule.hint is None or rule.hint == request.hint,
        rule.agent is None or rule.agent == ctx.agent,
        all(ctx.prop(name) == value for name, value in rule.props.items()),
        rule.has_images is None or rule.has_images == f.has_images,
        rule.has_audio is None or rule.has_audio == f.has_audio,
        rule.needs_tools is None or rule.needs_tools == f.needs_tools,
        rule.min_tokens is None or f.tokens >= rule.min_tokens,
    )
    return all(checks)


class RouteTable:
    def __init__(self, routes: dict[str, Route], rules: list[RuleConfig]) -> None:
        self.routes = routes
        self.rules = rules

    def targets(self) -> list[Target]:
        """Every target once per key, first definition first."""
        seen: dict[str, Target] = {}
        for route in self.routes.values():
            for target in route.targets:
                seen.setdefault(target.key, target)
        return list(seen.values())

    def choose(self, request: ModelRequest, ctx: RunContext, features: Features) -> Route:
        """The first matching rule's route, else the hint if it names a route, else the
        request's own route."""
        name = next(
            (r.use for r in self.rules if _matches(r, request, ctx, features)),
            request.hint if request.hint in self.routes else request.route,
        )
        route = self.routes.get(name)
        if route is None:
            raise UnknownRoute(name, sorted(self.routes))
        return route

    def plan(self, request: ModelRequest, ctx: RunContext) -> Plan:
        features = features_of(request)
        route = self.choose(request, ctx, features)
        for candidate in [route, *(self.routes[r] for r in route.reroute)]:
            capable = [t for t in candidate.targets if not missing(t.config, features)]
            if capable:
                return Plan(candidate, [(t, request) for t in capable], features)
        if route.unsupported == "placeholder":
            attempts = []
            for target in route.targets:
                changed = with_placeholders(
                    request, images=not target.config.images, audio=not target.config.audio
                )
                if not missing(target.config, features_of(changed)):
                    attempts.append((target, changed))
            if attempts:
                return Plan(route, attempts, features_of(attempts[0][1]))
        raise UnsupportedRequest(route.name, features.needs())


BackendFactory = Callable[[str, TargetConfig], Target]
"""Builds the target of a configured (non built-in) backend."""


def build_table(
    builtins: dict[str, ModelBackend], config: RouterConfig, factory: BackendFactory
) -> RouteTable:
    """Built-in routes (`offline`, `scripted/<name>`: one all-capable target each) plus the
    configured ones; a configured route of the same name replaces the built-in."""
    routes = {
        name: Route(
            name=name,
            targets=[Target(name, backend, name, BUILTIN_FAMILY, UNLIMITED)],
            reroute=[],
            unsupported="reject",
            repair_attempts=1,
        )
        for name, backend in builtins.items()
    }
    for name, route in config.routes.items():
        routes[name] = _route(name, route, builtins, factory)
    for route in config.routes.values():
        for other in route.reroute:
            if other not in routes:
                raise UnknownRoute(other, sorted(routes))
    for rule in config.rules:
        if rule.use not in routes:
            raise UnknownRoute(rule.use, sorted(routes))
    return RouteTable(routes, config.rules)


def _route(
    name: str,
    route: RouteConfig,
    builtins: dict[str, ModelBackend],
    factory: BackendFactory,
) -> Route:
    targets = []
    for target in route.targets:
        if is_builtin(target.backend):
            backend = builtins.get(target.backend)
            if backend is None:
                raise UnknownRoute(target.backend, sorted(builtins))
            targets.append(Target(target.backend, backend, target.backend, BUILTIN_FAMILY, target))
        else:
            targets.append(factory(name, target))
    return Route(
        name=name,
        targets=targets,
        reroute=route.reroute,
        unsupported=route.unsupported,
        repair_attempts=route.repair_attempts,
    )
