"""The example model routes, served by the model router through `RUNBUS_MODEL_BACKENDS`:
`offline` (the demo's rule-based stand-in) and `scripted/<name>` for each script in
`RUNBUS_MODEL_SCRIPTS`."""

from pathlib import Path

from runbus.settings import Settings
from runbus_model_router.backends import ModelBackend

from .offline import OfflineModel
from .scripted import ScriptedModel, Scripts, load_scripts


def routes(settings: Settings) -> dict[str, ModelBackend]:
    """The router's plug-in entry point."""
    scripts = load_scripts(Path(settings.model_scripts)) if settings.model_scripts else {}
    return default_routes(scripts)


def default_routes(scripts: Scripts) -> dict[str, ModelBackend]:
    """`offline` plus `scripted/<name>` for each script."""
    found: dict[str, ModelBackend] = {"offline": OfflineModel()}
    for name, replies in scripts.items():
        found[f"scripted/{name}"] = ScriptedModel(name, replies)
    return found
