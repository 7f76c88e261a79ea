"""The provider examples of docs/services/model_router.md, each run as written (only the
address points at a loopback server) and checked at the wire: the path, the credential header
and the body each provider's dialect expects."""

import re
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from runbus.messages import ToolSpec
from tests.integration.model_provider import answer, ask, loopback, router
from tests.stack import SecuredNats

DOC = Path(__file__).resolve().parents[2] / "docs" / "services" / "model_router.md"
KEYS = {"OPENAI_API_KEY": "sk-openai-test", "AZURE_OPENAI_API_KEY": "azure-test-key"}
WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


def provider_examples() -> dict[str, str]:
    """Backend name → the example's TOML, from the doc's "Providers" section."""
    text = DOC.read_text()
    section = text[text.index("## Providers") : text.index("## Tools without native")]
    blocks = re.findall(r"```toml\n(.*?)```", section, re.S)
    return {re.search(r"\[backends\.(\w+)\]", b).group(1): b for b in blocks}  # type: ignore[union-attr]


def at(example: str, name: str, port: int) -> str:
    """The example with its server replaced by the loopback one (path and query kept)."""
    local = f"http://127.0.0.1:{port}"
    if "base_url" in example:
        return re.sub(r'base_url = "https?://[^/"]+', f'base_url = "{local}', example)
    return example.replace(f"[backends.{name}]\n", f'[backends.{name}]\nbase_url = "{local}/v1"\n')


EXPECTED: dict[str, dict[str, Any]] = {
    "openai": {
        "path": "/v1/chat/completions",
        "auth": ("authorization", "Bearer sk-openai-test"),
        "body": {"model": "gpt-4o-mini", "max_completion_tokens": 50, "stream": True},
        "native_tools": True,
    },
    "azure": {
        "path": "/openai/deployments/my-gpt-4o-mini-deployment/chat/completions"
        "?api-version=2024-10-21",
        "auth": ("api-key", "azure-test-key"),
        "body": {"max_completion_tokens": 50, "stream": True},
        "native_tools": True,
    },
    "vllm": {
        "path": "/v1/chat/completions",
        "auth": None,
        "body": {"model": "Qwen/Qwen2.5-7B-Instruct", "max_tokens": 50},
        "native_tools": True,
    },
    "ollama": {
        "path": "/v1/chat/completions",
        "auth": None,
        "body": {"model": "llama3.2:3b", "max_tokens": 50},
        "native_tools": True,
    },
    "llamacpp": {
        "path": "/v1/chat/completions",
        "auth": None,
        "body": {"model": "smollm2-135m", "max_tokens": 50, "temperature": 0.2},
        "native_tools": False,
    },
}


def test_the_doc_shows_one_example_per_provider() -> None:
    assert sorted(provider_examples()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_each_documented_provider_example_speaks_its_dialect_at_the_wire(
    name: str, nats_server: SecuredNats, nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable, value in KEYS.items():
        monkeypatch.setenv(variable, value)
    expected = EXPECTED[name]
    async with loopback() as provider:
        routes = at(provider_examples()[name], name, provider.port)
        async with router(nats_server.url, routes):
            reply = await answer(
                nc, ask("Weather in Rome?", route="default", tools=[WEATHER], max_output_tokens=50)
            )
    assert reply.message.text == "Hello from the loopback provider."
    [path], [headers], [body] = provider.paths, provider.headers, provider.requests
    assert path == expected["path"]
    if expected["auth"] is not None:
        header, value = expected["auth"]
        assert headers[header] == value
    assert expected["body"].items() <= body.items()
    if expected["native_tools"]:
        assert body["tools"][0]["function"]["name"] == "get_weather"
        assert "response_format" not in body
    else:
        assert "tools" not in body
        assert body["response_format"]["type"] == "json_schema"
