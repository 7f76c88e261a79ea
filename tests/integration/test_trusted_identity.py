"""Identity comes from the token, never from what the caller (or the model) claims."""

from nats.aio.client import Client as NATS

from tests.helpers import publish_and_collect, raw_request
from tests.stack import Stack


async def test_tool_sees_the_tokens_identity_even_with_forged_prop_headers(
    stack: Stack, nc: NATS
) -> None:
    events = await publish_and_collect(
        nc,
        "r-forged",
        raw_request("r-forged", "Book me a flight from Melbourne to Sydney on monday"),
        token="dev-carol",
        extra_headers={"rb-prop-user_id": "mallory", "rb-prop-tenant": "acme"},
    )

    assert events[-1]["type"] == "run.completed"
    [booking] = [
        e["result"]["result"]
        for e in events
        if e["type"] == "run.tool_result" and "confirmation" in (e["result"]["result"] or {})
    ]
    assert booking["passenger"] == "carol"
    assert booking["tenant"] == "globex"
    assert "carol" in events[-1]["text"]
