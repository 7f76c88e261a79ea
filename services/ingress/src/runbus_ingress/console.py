"""The web console: a page and its assets, shipped in this package (no CDN, works offline).
The page signs in with a bearer token and calls the same routes as any HTTP client."""

from importlib import resources
from typing import Final

from aiohttp import web

from runbus.errors import NotFound

from .context import ingress_of, json_response

ASSETS: Final = resources.files(__package__).joinpath("console")
CONTENT_TYPES: Final = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}
"""Every file the console serves; nothing else under the folder is reachable."""
CONFIG: Final = "config.json"


async def on_index(request: web.Request) -> web.Response:
    return _asset("index.html")


async def on_asset(request: web.Request) -> web.Response:
    name = request.match_info["asset"]
    if name == CONFIG:
        # What the page cannot know by itself: where traces are shown.
        return json_response({"jaeger_url": ingress_of(request).jaeger_url})
    return _asset(name)


def _asset(name: str) -> web.Response:
    content_type = CONTENT_TYPES.get(name)
    if content_type is None:
        raise NotFound(f"no console asset {name!r}")
    body = ASSETS.joinpath(name).read_bytes()
    return web.Response(
        body=body,
        content_type=content_type,
        charset="utf-8",
        headers={"Cache-Control": "no-cache"},
    )
