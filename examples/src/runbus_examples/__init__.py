"""Example code the demo and the tests use and a production image never carries: the travel
tools and agent, the refund program agent, and the offline and scripted models.

Services load it only through settings they already have: `RUNBUS_TOOL_MODULES`
(`runbus_examples.travel`), `RUNBUS_AGENTS_DIR` (`AGENTS_DIR`), a program agent's
`module:Class` in its TOML (`runbus_examples.refund:RefundPolicyAgent`) and
`RUNBUS_MODEL_BACKENDS` (`runbus_examples.models`). `runbus up`, `runbus demo` and the test
stacks set them from `settings_env` when this package is installed."""

from collections.abc import Mapping
from pathlib import Path
from typing import Final

AGENTS_DIR: Final = Path(__file__).parent / "agents"
"""The demo agents (`travel`)."""
TOOL_MODULES: Final = "runbus_examples.travel"
MODEL_BACKENDS: Final = "runbus_examples.models"


def settings_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The `RUNBUS_*` variables that point services at the examples, for each one `environ`
    leaves unset."""
    wanted = {
        "RUNBUS_AGENTS_DIR": str(AGENTS_DIR),
        "RUNBUS_TOOL_MODULES": TOOL_MODULES,
        "RUNBUS_MODEL_BACKENDS": MODEL_BACKENDS,
    }
    return {name: value for name, value in wanted.items() if not environ.get(name)}
