"""Which proxy a backend's requests go through: the one the environment names for the URL's
scheme (else `ALL_PROXY`), none for a host `NO_PROXY` exempts, the proxy's own credentials
sent to it rather than left in its URL."""

import aiohttp
import pytest
from yarl import URL

from runbus_model_router.http_session import Proxy, env_proxy

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def test_without_proxy_variables_requests_go_straight_to_the_server() -> None:
    assert env_proxy("https://api.openai.com/v1/") == Proxy()


def test_the_proxy_of_the_urls_scheme_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://plain-proxy.internal:8080")

    assert env_proxy("https://api.openai.com/v1/") == Proxy(URL("http://proxy.internal:3128"))
    assert env_proxy("http://10.0.0.5:8000/v1/") == Proxy(URL("http://plain-proxy.internal:8080"))


def test_all_proxy_covers_a_scheme_without_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALL_PROXY", "http://proxy.internal:3128")

    assert env_proxy("https://api.openai.com/v1/").url == URL("http://proxy.internal:3128")


def test_a_host_no_proxy_names_is_reached_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,.corp.example")

    assert env_proxy("http://localhost:8081/v1/") == Proxy()
    assert env_proxy("https://llm.corp.example/v1/") == Proxy()
    assert env_proxy("https://api.openai.com/v1/").url is not None


def test_the_proxys_credentials_go_to_it_as_basic_auth_not_in_its_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://team:s3cret@proxy.internal:3128")

    proxy = env_proxy("https://api.openai.com/v1/")

    assert proxy.url == URL("http://proxy.internal:3128")
    basic = {"Proxy-Authorization": aiohttp.encode_basic_auth("team", "s3cret")}
    # https: the proxy sees only the CONNECT; plain http: it reads every request itself.
    assert proxy.headers(https=True) == ({}, basic)
    assert proxy.headers(https=False) == (basic, None)
    assert Proxy(URL("http://proxy.internal:3128")).headers(https=True) == ({}, None)
