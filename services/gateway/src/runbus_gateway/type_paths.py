"""`module:Name` paths in agent config: the one loader for program agents and output types."""

import importlib
import re
from typing import Final

from .errors import GatewayConfigError

TYPE_PATH: Final = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")


def load_type(path: str, what: str) -> type:
    """The class named by `path` (`module:Name`); `GatewayConfigError`, opening with `what`
    and the path, says whether the path, the import or the name is wrong."""
    if not TYPE_PATH.match(path):
        raise GatewayConfigError(f"{what} {path!r} is not `module:Name`")
    module_name, name = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise GatewayConfigError(f"{what} {path!r}: cannot import {module_name!r}: {exc}") from None
    found = getattr(module, name, None)
    if not isinstance(found, type):
        raise GatewayConfigError(f"{what} {path!r}: {module_name!r} has no class {name!r}")
    return found
