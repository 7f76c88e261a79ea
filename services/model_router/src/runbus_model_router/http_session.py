"""The HTTP client of an OpenAI-compatible backend: one aiohttp session per backend.

aiohttp rather than `httpx2` (the openai SDK's transport): its response parser is in C and its
pool hands a call the last idle connection without looking at the others, while httpcore's
pool looks at every connection and queued request on each request and each response (and
polls each idle socket), so its CPU per call grew with the calls in flight. A backend's call
against a loopback server, side by side: 0.8 ms of CPU instead of 1.7 one call at a time
after a 300 ms wait, 0.2 ms instead of 1.6 with 256 in flight and 2.2 with 1000.

What the `httpx2` client did is kept: its trust store (the system's CAs, or `SSL_CERT_FILE` /
`SSL_CERT_DIR`), the proxy `HTTPS_PROXY` / `HTTP_PROXY` / `ALL_PROXY` name unless `NO_PROXY`
exempts the host (read once, when the backend is opened, as httpx read it when its client was
made), no redirects followed, up to 1000 connections to a server.
"""

import urllib.request
from dataclasses import dataclass
from typing import Final

import aiohttp
import httpx2
from yarl import URL

MAX_CONNECTIONS: Final = 1000
"""Connections open to one backend at once (the openai SDK's limit): a gateway may have a
thousand runs waiting on one provider; more calls wait for a connection."""
KEEPALIVE_SECONDS: Final = 5.0
"""How long an idle connection is kept for the next call (httpx's default: shorter than the
keep-alive of the common servers, so a server seldom closes one just as it is reused)."""


@dataclass(frozen=True)
class Proxy:
    """Where requests to a server go through, if anywhere."""

    url: URL | None = None
    authorization: str | None = None
    """`Proxy-Authorization` from the proxy URL's own `user:password` (not left in its URL)."""

    def headers(self, https: bool) -> tuple[dict[str, str], dict[str, str] | None]:
        """Its credential as headers: (added to each request, sent with the CONNECT). Over
        plain http the proxy reads the request itself; for https it only sees the CONNECT."""
        if self.authorization is None:
            return {}, None
        header = {"Proxy-Authorization": self.authorization}
        return ({}, header) if https else (header, None)


def env_proxy(url: str) -> Proxy:
    """The proxy the environment names for `url`: the variable of its scheme, else
    `ALL_PROXY`, unless `NO_PROXY` names its host."""
    target = URL(url)
    if target.host is None or urllib.request.proxy_bypass(target.host):
        return Proxy()
    named = urllib.request.getproxies()
    found = named.get(target.scheme) or named.get("all")
    if not found:
        return Proxy()
    proxy = URL(found)
    if proxy.user is None:
        return Proxy(proxy)
    return Proxy(proxy.with_user(None), aiohttp.encode_basic_auth(proxy.user, proxy.password or ""))


def open_session() -> aiohttp.ClientSession:
    """A backend's session; open it in the event loop that uses it. It has no default headers:
    aiohttp would send those to a proxy too (the credential in the CONNECT of every https
    request), so each request passes its own."""
    connector = aiohttp.TCPConnector(
        limit=MAX_CONNECTIONS,
        limit_per_host=0,
        keepalive_timeout=KEEPALIVE_SECONDS,
        ssl=httpx2.create_ssl_context(),
    )
    # trust_env stays off: the proxy is read once (`env_proxy`), not in a thread per request,
    # and credentials are the backend's own headers, never a netrc entry.
    return aiohttp.ClientSession(connector=connector, trust_env=False)
