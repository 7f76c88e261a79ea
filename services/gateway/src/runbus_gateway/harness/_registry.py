"""Named, typed plug-ins configured as TOML tables: `{name = "pii", kinds = ["password"]}`.

A plug-in is a msgspec Struct tagged by `name` whose fields are its parameters; a registry maps
names to classes, so an agent file names plug-ins and a typo is a start-up error naming it.
"""

from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

import msgspec

from ..errors import GatewayConfigError

P = TypeVar("P", bound=msgspec.Struct)
C = TypeVar("C", bound=type[msgspec.Struct])


class Registry(Generic[P]):
    def __init__(self, kind: str, base: type[P]) -> None:
        self.kind = kind
        """What the plug-ins are, for error messages (`guardrail`, `evaluator`, …)."""
        self.base = base
        self.types: dict[str, type[P]] = {}

    def register(self, cls: C) -> C:
        """Class decorator: make `cls` available under its tag."""
        name = cls.__struct_config__.tag
        plugin: type[msgspec.Struct] = cls
        if not isinstance(name, str) or not issubclass(plugin, self.base):
            raise TypeError(f"a {self.kind} is a tagged subclass of {self.base.__name__}")
        if name in self.types:
            raise TypeError(f"{self.kind} {name!r} is registered twice")
        self.types[name] = plugin
        return cls

    def build(self, tables: Sequence[Mapping[str, Any]]) -> list[P]:
        """Typed plug-ins from their tables; raises `GatewayConfigError` naming what is wrong."""
        built: list[P] = []
        for index, table in enumerate(tables):
            name = table.get("name")
            if not isinstance(name, str):
                raise GatewayConfigError(f"{self.kind} #{index + 1} has no `name`")
            cls = self.types.get(name)
            if cls is None:
                known = ", ".join(sorted(self.types)) or "none"
                raise GatewayConfigError(f"unknown {self.kind} {name!r} (known: {known})")
            try:
                built.append(msgspec.convert(table, cls))
            except msgspec.ValidationError as exc:
                raise GatewayConfigError(f"{self.kind} {name!r}: {exc}") from None
        return built


def plugin_name(plugin: msgspec.Struct) -> str:
    """The name a plug-in is registered and configured under."""
    return str(type(plugin).__struct_config__.tag)
