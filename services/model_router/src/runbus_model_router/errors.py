"""Errors of the model router."""

from runbus.errors import BadRequest, ModelError


class UnknownRoute(BadRequest):
    code = "unknown_route"

    def __init__(self, route: str, known: list[str]) -> None:
        super().__init__(f"no model route {route!r}; known: {', '.join(known) or 'none'}")
        self.route = route


class ScriptExhausted(ModelError):
    def __init__(self, script: str, index: int) -> None:
        super().__init__(f"script {script!r} has no reply number {index + 1}")
        self.script = script
        self.index = index
