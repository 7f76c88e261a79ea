"""Model backends from other packages: each module named in `RUNBUS_MODEL_BACKENDS` has a
`routes(settings)` function returning route name → backend, served as one all-capable target
each (the demo's `offline` and the tests' `scripted/<name>` come from `runbus_examples.models`).
The router itself ships no such route."""

import importlib
from collections.abc import Callable

from runbus.settings import Settings

from .backends import ModelBackend
from .config import RouteConfigError

WHERE = "RUNBUS_MODEL_BACKENDS"
RoutesFactory = Callable[[Settings], dict[str, ModelBackend]]


def load_backends(settings: Settings) -> dict[str, ModelBackend]:
    """The routes of every comma-separated module in `settings.model_backends`; a missing
    module, a missing `routes` function or a name given twice fails the start."""
    found: dict[str, ModelBackend] = {}
    for name in filter(None, (m.strip() for m in settings.model_backends.split(","))):
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise RouteConfigError(WHERE, f"cannot import {name!r}: {exc}") from None
        factory: RoutesFactory | None = getattr(module, "routes", None)
        if not callable(factory):
            raise RouteConfigError(WHERE, f"module {name!r} has no `routes`")
        for route, backend in factory(settings).items():
            if route in found:
                raise RouteConfigError(WHERE, f"route {route!r} given twice")
            found[route] = backend
    return found
