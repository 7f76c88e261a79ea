"""Plug-in model routes (`RUNBUS_MODEL_BACKENDS`) and how the embedded stack points services at
the examples package."""

from pathlib import Path

import pytest

from runbus.settings import Settings
from runbus.supervisor import examples_env
from runbus_examples import AGENTS_DIR
from runbus_examples.offline import OfflineModel
from runbus_examples.scripted import ScriptedModel
from runbus_model_router.config import RouteConfigError
from runbus_model_router.plugins import load_backends


def test_the_router_serves_no_route_unless_a_module_adds_it() -> None:
    assert load_backends(Settings()) == {}


def test_the_examples_module_adds_offline_and_one_route_per_script(tmp_path: Path) -> None:
    scripts = tmp_path / "scripts.toml"
    scripts.write_text('[[hello]]\ntext = "hi"\n')

    routes = load_backends(
        Settings(model_backends="runbus_examples.models", model_scripts=str(scripts))
    )

    assert sorted(routes) == ["offline", "scripted/hello"]
    assert isinstance(routes["offline"], OfflineModel)
    assert isinstance(routes["scripted/hello"], ScriptedModel)


@pytest.mark.parametrize(
    ("modules", "problem"),
    [
        ("runbus_no_such_module", "cannot import 'runbus_no_such_module'"),
        ("runbus_examples.travel", "module 'runbus_examples.travel' has no `routes`"),
        ("runbus_examples.models, runbus_examples.models", "route 'offline' given twice"),
    ],
)
def test_a_bad_module_list_fails_at_start_naming_the_problem(modules: str, problem: str) -> None:
    with pytest.raises(RouteConfigError) as error:
        load_backends(Settings(model_backends=modules))

    assert error.value.path == "RUNBUS_MODEL_BACKENDS"
    assert error.value.problem.startswith(problem)


def test_the_embedded_stack_points_unset_settings_at_the_examples() -> None:
    assert examples_env({}) == {
        "RUNBUS_AGENTS_DIR": str(AGENTS_DIR),
        "RUNBUS_TOOL_MODULES": "runbus_examples.travel",
        "RUNBUS_MODEL_BACKENDS": "runbus_examples.models",
    }
    assert (AGENTS_DIR / "travel.toml").is_file()


def test_settings_the_operator_gave_win_over_the_examples() -> None:
    given = {"RUNBUS_AGENTS_DIR": "/etc/agents", "RUNBUS_TOOL_MODULES": "my_tools"}

    assert examples_env(given) == {"RUNBUS_MODEL_BACKENDS": "runbus_examples.models"}
