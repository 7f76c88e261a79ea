"""Choosing the route and the targets for a call: rules, hints, run properties, capabilities,
re-routing, the placeholder policy, and refusing what no target can take."""

from pathlib import Path

import msgspec
import pytest

from runbus.headers import RunContext
from runbus.messages import (
    ChatMessage,
    DataContent,
    ModelRequest,
    TextContent,
    ToolSpec,
    UriContent,
)
from runbus_examples.models import default_routes
from runbus_examples.scripted import ScriptedModel, ScriptedReply
from runbus_model_router.config import RouteConfigError, TargetConfig, load_config, parse_config
from runbus_model_router.errors import InvalidToolSchema, UnknownRoute, UnsupportedRequest
from runbus_model_router.features import check_tools, estimate_tokens, features_of
from runbus_model_router.routing import RouteTable, Target, build_table

ROUTES = """
[backends.local]
base_url = "http://127.0.0.1:9/v1"

[routes.cheap]
reroute = ["vision"]
[[routes.cheap.targets]]
backend = "local"
model = "small"
max_context = 1000

[routes.vision]
[[routes.vision.targets]]
backend = "local"
model = "eyes"
images = true

[routes.strong]
[[routes.strong.targets]]
backend = "local"
model = "no-tools"
tools = false
[[routes.strong.targets]]
backend = "local"
model = "big"
max_context = 200000

[routes.mixed]
[[routes.mixed.targets]]
backend = "local"
model = "small"
max_context = 1000
[[routes.mixed.targets]]
backend = "local"
model = "big"
max_context = 200000

[routes.text_only]
unsupported = "placeholder"
[[routes.text_only.targets]]
backend = "local"
model = "small"

[[rules]]
props = { tier = "gold" }
route = "cheap"
use = "strong"

[[rules]]
route = "cheap"
min_tokens = 5000
use = "strong"
"""

ALICE = RunContext(run_id="r-1", agent="travel", props={"tenant": "acme", "user_id": "alice"})
GOLD = RunContext(run_id="r-2", agent="travel", props={"tenant": "acme", "tier": "gold"})
PNG = DataContent(data=b"\x89PNG" * 10, media_type="image/png")
WEATHER = ToolSpec(
    name="get_weather",
    description="Weather",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def fake_target(route: str, target: TargetConfig) -> Target:
    """A configured target whose backend is a script naming the model, so no network."""
    backend = ScriptedModel(target.model, [ScriptedReply(text=target.model)])
    return Target(f"{target.backend}/{target.model}", backend, target.model, "local", target)


def table(text: str = ROUTES) -> RouteTable:
    return build_table(default_routes({}), parse_config(text), fake_target)


def request(
    *parts: TextContent | DataContent | UriContent,
    route: str = "cheap",
    hint: str = "",
    tools: list[ToolSpec] | None = None,
) -> ModelRequest:
    contents = list(parts) or [TextContent(text="hello")]
    return ModelRequest(
        route=route,
        hint=hint,
        messages=[ChatMessage(role="user", contents=contents)],  # type: ignore[arg-type]
        tools=tools or [],
    )


def models(plan_table: RouteTable, req: ModelRequest, ctx: RunContext = ALICE) -> list[str]:
    return [t.model for t, _ in plan_table.plan(req, ctx).attempts]


def test_without_a_routes_file_the_routes_are_offline_and_the_scripts() -> None:
    scripts = {"hello": [ScriptedReply(text="hi")]}

    plain = build_table(default_routes(scripts), parse_config(""), fake_target)

    assert sorted(plain.routes) == ["offline", "scripted/hello"]
    assert plain.rules == []
    (target,) = plain.routes["offline"].targets
    assert (target.config.images, target.config.audio, target.config.tools) == (True,) * 3
    assert (target.config.concurrency, target.config.max_context) == (None, None)


def test_a_plain_request_uses_its_own_route() -> None:
    plan = table().plan(request(), ALICE)

    assert plan.route.name == "cheap"
    assert [t.model for t, _ in plan.attempts] == ["small"]


def test_a_cheap_by_default_request_with_an_image_is_rerouted_to_vision() -> None:
    plan = table().plan(request(TextContent(text="What is this?"), PNG), ALICE)

    assert plan.route.name == "vision"
    assert [t.model for t, _ in plan.attempts] == ["eyes"]
    assert plan.attempts[0][1].messages[0].contents[1] == PNG


def test_a_rule_on_the_images_feature_chooses_the_route_before_any_capability_check() -> None:
    rules = ROUTES + '\n[[rules]]\nhas_images = true\nuse = "vision"\n'
    routing = table(rules.replace('reroute = ["vision"]', ""))

    assert routing.plan(request(PNG), ALICE).route.name == "vision"


def test_an_image_uri_counts_as_an_image() -> None:
    image = UriContent(uri="https://example.com/cat.webp")

    assert table().plan(request(image), ALICE).route.name == "vision"


def test_a_gold_tier_tenant_is_sent_to_the_strong_route() -> None:
    assert table().plan(request(), GOLD).route.name == "strong"


def test_a_hint_naming_a_route_is_followed_and_an_unknown_hint_ignored() -> None:
    assert table().plan(request(hint="strong"), ALICE).route.name == "strong"
    assert table().plan(request(hint="turbo"), ALICE).route.name == "cheap"


def test_a_target_without_tools_is_skipped_when_tools_are_offered() -> None:
    assert models(table(), request(route="strong")) == ["no-tools", "big"]
    assert models(table(), request(route="strong", tools=[WEATHER])) == ["big"]


def test_a_prompt_beyond_a_targets_window_skips_that_target() -> None:
    long_text = TextContent(text="word " * 1000)

    assert estimate_tokens(request(long_text)) > 1000
    assert models(table(), request(route="mixed")) == ["small", "big"]
    assert models(table(), request(long_text, route="mixed")) == ["big"]


def test_the_room_asked_for_the_answer_counts_against_the_window() -> None:
    short = msgspec.structs.replace(request(route="mixed"), max_output_tokens=2000)

    assert models(table(), short) == ["big"]


def test_a_rule_on_estimated_tokens_sends_a_long_prompt_to_the_strong_route() -> None:
    long_text = TextContent(text="word " * 8000)

    assert table().plan(request(long_text), ALICE).route.name == "strong"


def test_with_no_capable_target_the_placeholder_policy_names_the_image_it_replaced() -> None:
    plan = table().plan(request(TextContent(text="Look:"), PNG, route="text_only"), ALICE)

    ((target, sent),) = plan.attempts
    assert target.model == "small"
    parts = sent.messages[0].contents
    assert parts[0] == TextContent(text="Look:")
    assert isinstance(parts[1], TextContent)
    assert "image omitted" in parts[1].text
    assert "image/png" in parts[1].text
    assert "40 bytes" in parts[1].text
    assert not features_of(sent).has_images


def test_with_no_capable_target_and_no_policy_the_request_is_refused_naming_what_it_needs() -> None:
    strict = ROUTES.replace('reroute = ["vision"]', "")

    with pytest.raises(UnsupportedRequest) as raised:
        table(strict).plan(request(PNG, tools=[WEATHER]), ALICE)

    assert raised.value.code == "unsupported_request"
    assert raised.value.route == "cheap"
    assert "images" in raised.value.needs
    assert "tools" in raised.value.needs


def test_an_unknown_route_is_refused_with_the_known_ones() -> None:
    with pytest.raises(UnknownRoute) as raised:
        table().plan(request(route="gpt-9"), ALICE)

    assert raised.value.code == "unknown_route"
    assert "cheap" in raised.value.message
    assert "offline" in raised.value.message


def test_a_configured_route_may_use_the_builtin_backends() -> None:
    text = '[routes.demo]\n[[routes.demo.targets]]\nbackend = "offline"\n'

    routing = build_table(default_routes({}), parse_config(text), fake_target)

    (target,) = routing.routes["demo"].targets
    assert target.key == "offline"
    assert target.backend is routing.routes["offline"].targets[0].backend


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[routes.a]\n[[routes.a.targets]]\nbackend = "nowhere"\nmodel = "m"\n', "nowhere"),
        ('[routes.a]\n[[routes.a.targets]]\nbackend = "offline"\nimages = "yes"\n', "images"),
        ('[routes.a]\n[[routes.a.targets]]\nbackend = "offline"\nmodelname = "m"\n', "modelname"),
        ("[routes.a]\ntargets = []\n", "no targets"),
        ('[[rules]]\nuse = "nowhere"\n', "nowhere"),
        ('[routes.a]\nreroute = ["b"]\n[[routes.a.targets]]\nbackend = "offline"\n', "'b'"),
        ('[audit]\nredact = ["("]\n', "audit.redact"),
        ("[routes.a\n", "Expected"),
    ],
)
def test_a_bad_routes_file_fails_at_start_naming_the_problem(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "routes.toml"
    path.write_text(text)

    with pytest.raises(RouteConfigError) as raised:
        load_config(path)

    assert str(path) in str(raised.value)
    assert problem in str(raised.value)


@pytest.mark.parametrize(
    ("tool", "problem"),
    [
        (ToolSpec(name="get weather", description="", parameters={}), "name"),
        (ToolSpec(name="f", description="", parameters={"type": "string"}), "object schema"),
        (ToolSpec(name="f", description="", parameters={"properties": []}), "'properties'"),
        (
            ToolSpec(name="f", description="", parameters={"properties": {"a": "string"}}),
            "property 'a'",
        ),
        (
            ToolSpec(name="f", description="", parameters={"properties": {}, "required": ["a"]}),
            "required",
        ),
    ],
)
def test_a_malformed_tool_schema_is_refused_naming_the_tool(tool: ToolSpec, problem: str) -> None:
    with pytest.raises(InvalidToolSchema) as raised:
        check_tools([tool])

    assert raised.value.code == "invalid_tool_schema"
    assert raised.value.tool == tool.name
    assert problem in raised.value.problem


def test_the_same_tool_offered_twice_is_refused() -> None:
    with pytest.raises(InvalidToolSchema, match="twice"):
        check_tools([WEATHER, WEATHER])


def test_well_formed_tools_pass_the_check() -> None:
    check_tools([WEATHER, ToolSpec(name="no_args", description="", parameters={})])


def test_the_example_routes_file_is_valid() -> None:
    example = Path(__file__).parents[2] / "services/model_router/routes.example.toml"

    config = load_config(example)

    routing = build_table(default_routes({}), config, fake_target)
    assert {"cheap", "strong", "vision", "offline"} <= set(routing.routes)
    assert routing.plan(request(), GOLD).route.name == "strong"
