"""Hypothesis strategies for fuzzing the bus: request bodies shaped like a wire type but with
hostile values, broken encodings, and hostile headers; plus the helpers that enumerate every
subject a stack answers on and snapshot what it has stored."""

import base64
import json
import typing
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import msgspec.inspect as mi
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from nats.js import JetStreamContext

from runbus import headers as h
from runbus import subjects
from runbus.service import Endpoint, Service
from tests.stack import Stack

Json = Any
MAX_DEPTH: Final = 4
"""Nesting a generated body may reach: compaction strategies and conditions are recursive."""
HUGE: Final = 200_000
"""Characters of a huge string: far over every limit a service sets, under NATS' 1 MB."""

UNSAFE_IDS: Final = (
    "",
    " ",
    "../x",
    "a.b",
    "*",
    ">",
    "a b",
    "a\nb",
    "s1\n",
    "\x00",
    "$SRV",
    "runbus.api.sessions.list",
    "é",
    "🙂",
    "x" * 129,
)
KNOWN: Final[dict[str, tuple[Json, ...]]] = {
    "route": ("offline",),
    "agent": ("travel",),
    "name": ("get_weather", "search_flights", "create_booking", "memory_search"),
    "session_id": ("s1",),
    "role": ("user",),
    "arguments": ({"city": "Sydney"}, {"flight_id": "QF412-20261208"}, {"query": "tea"}),
}
"""Values the stack knows (a route, an agent, tool names, alice's session): a body that uses
them gets past the first lookup and into the code behind it."""
HOSTILE_SCALARS: Final = (None, True, 0, -1, 2**63, -(2**70), 1e308, -0.0, "", "null", "[]")

# ---------------------------------------------------------------------------------------------
# values


def json_values(max_leaves: int = 8) -> st.SearchStrategy[Json]:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**80), max_value=2**80)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=20)
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=max_leaves,
    )


def hostile_strings() -> st.SearchStrategy[str]:
    return (
        st.sampled_from(UNSAFE_IDS)
        | st.integers(min_value=1_000, max_value=HUGE).map(lambda n: "x" * n)
        | st.text(min_size=0, max_size=40)
        | st.just("\ud800".encode("utf-8", "surrogatepass").decode("utf-8", "replace"))
    )


def wrong_values() -> st.SearchStrategy[Json]:
    """A value of the wrong type (or the right type with a hostile value)."""
    return st.sampled_from(HOSTILE_SCALARS) | hostile_strings() | json_values(4)


def value_for(info: mi.Type, depth: int = 0, *, hostile: bool = True) -> st.SearchStrategy[Json]:
    """A value of the shape `info` describes; when `hostile`, sometimes a wrong one."""
    if depth > MAX_DEPTH:
        return wrong_values() if hostile else st.none()
    shaped = _shaped(info, depth, hostile)
    return st.one_of(shaped, shaped, wrong_values()) if hostile else shaped


def _shaped(info: mi.Type, depth: int, hostile: bool) -> st.SearchStrategy[Json]:
    match info:
        case mi.StructType():
            return struct_dicts(info, depth + 1, hostile=hostile)
        case mi.StrType(pattern=str(pattern)):
            ids = st.from_regex(pattern, fullmatch=True)
            return ids | hostile_strings() if hostile else ids
        case mi.StrType(max_length=int(limit)):
            text = st.text(max_size=min(limit, 60))
            return text | st.just("y" * (limit + 1)) if hostile else text
        case mi.StrType():
            return st.text(max_size=60) | hostile_strings() if hostile else st.text(max_size=60)
        case mi.IntType():
            low = info.ge if info.ge is not None else -(2**65)
            high = info.le if info.le is not None else 2**65
            ints = st.integers(min_value=low, max_value=high)
            return ints | st.sampled_from((low - 1, high + 1, 0, -1)) if hostile else ints
        case mi.FloatType():
            return st.floats(allow_nan=False, allow_infinity=False)
        case mi.BoolType():
            return st.booleans()
        case mi.NoneType():
            return st.none()
        case mi.LiteralType():
            values = st.sampled_from(info.values)
            return values | st.text(max_size=12) if hostile else values
        case mi.UnionType():
            return st.one_of([_shaped(t, depth, hostile) for t in info.types])
        case mi.ListType() | mi.SetType() | mi.FrozenSetType() | mi.VarTupleType():
            return st.lists(value_for(info.item_type, depth + 1, hostile=hostile), max_size=3)
        case mi.DictType():
            return st.dictionaries(
                st.text(max_size=10), value_for(info.value_type, depth + 1, hostile=hostile)
            )
        case mi.DateTimeType():
            stamps = st.datetimes().map(lambda d: d.isoformat() + "Z")
            return stamps | st.text(max_size=30) if hostile else stamps
        case mi.BytesType():
            return st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode())
        case _:
            return json_values()


def struct_dicts(
    info: mi.StructType, depth: int = 0, *, hostile: bool = True
) -> st.SearchStrategy[dict[str, Json]]:
    """Dicts shaped like the Struct: its tag, its required fields, some optional ones."""
    fields = {f.encode_name: value_for(f.type, depth, hostile=hostile) for f in info.fields}
    for f in info.fields:
        if f.name in KNOWN:
            known = st.sampled_from(KNOWN[f.name])
            fields[f.encode_name] = st.one_of(known, known, fields[f.encode_name])
    required = {f.encode_name: fields[f.encode_name] for f in info.fields if f.required}
    optional = {f.encode_name: fields[f.encode_name] for f in info.fields if not f.required}
    if info.tag_field is not None:
        required[info.tag_field] = st.just(info.tag)
    return st.fixed_dictionaries(required, optional=optional)


# ---------------------------------------------------------------------------------------------
# bodies and headers


def _encode(value: Json) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


def bodies(request_type: type) -> st.SearchStrategy[bytes]:
    """Request bodies for an endpoint whose body is `request_type`: shaped ones with hostile
    values, truncated JSON, unknown or missing tags, other JSON, non-UTF-8 bytes, huge ones."""
    info = mi.type_info(request_type)
    assert isinstance(info, mi.StructType), request_type
    shaped = struct_dicts(info)
    tag_field = info.tag_field or "type"
    return st.one_of(
        struct_dicts(info, hostile=False).map(_encode),
        struct_dicts(info, hostile=False).map(_encode),
        shaped.map(_encode),
        shaped.map(_encode),
        st.tuples(shaped.map(_encode), st.floats(0, 1)).map(
            lambda p: p[0][: int(len(p[0]) * p[1])]
        ),
        st.tuples(shaped, st.text(max_size=20) | st.sampled_from(("run.request", "error"))).map(
            lambda p: _encode({**p[0], tag_field: p[1]})
        ),
        shaped.map(lambda d: _encode({k: v for k, v in d.items() if k != tag_field})),
        json_values().map(_encode),
        st.binary(max_size=64),
        shaped.map(lambda d: b"\xff\xfe" + _encode(d)),
        st.integers(1_000, HUGE).map(lambda n: _encode({tag_field: info.tag, "x": "x" * n})),
        st.just(b""),
    )


HEADER_TEXT: Final = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40
)
DEADLINES: Final = ("nan", "inf", "-inf", "-1", "0", "1", "1e309", "abc", "", "4102444800")
TRACEPARENTS: Final = (
    "00-00000000000000000000000000000000-0000000000000000-01",
    "00-zz-yy-01",
    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "garbage",
    "",
)
TOKENS: Final = ("dev-alice", "dev-bob", "dev-carol")
ALICE: Final = {"user_id": "alice", "tenant": "acme"}
HEADER_IDS: Final = ("", "../x", "a.b", "*", ">", "a b", "$SRV", "x" * 129, "acme", "alice", "r-1")
"""Unsafe ids that a NATS header can carry (no line breaks or non-ASCII)."""


def headers(*, api: bool) -> st.SearchStrategy[dict[str, str]]:
    """Headers a hostile sender might set: forged identity, bad deadlines and trace context,
    unsafe run ids, random names. API requests mostly carry a real token, so their bodies
    reach the service behind the gateway."""
    ids = st.sampled_from(HEADER_IDS) | HEADER_TEXT
    auth = st.sampled_from([f"Bearer {t}" for t in TOKENS]) | HEADER_TEXT
    fields = {
        "rb-prop-user_id": ids,
        "rb-prop-tenant": ids,
        "rb-prop-memory_scope": ids,
        "rb-prop-memory_limit": st.sampled_from(("-1", "0", "abc", "1e9", "3")),
        "rb-prop-application_id": ids,
        "rb-deadline": st.sampled_from(DEADLINES) | HEADER_TEXT,
        "traceparent": st.sampled_from(TRACEPARENTS) | HEADER_TEXT,
        "tracestate": HEADER_TEXT,
        "rb-run-id": ids,
        "rb-session-id": ids,
        "rb-agent": ids,
        "rb-auth": auth,
        "x-fuzz": HEADER_TEXT,
    }
    required = {"rb-auth": auth} if api else {}
    hostile = st.fixed_dictionaries(
        required, optional={k: v for k, v in fields.items() if k not in required}
    ).map(lambda hs: {k: v.strip() for k, v in hs.items()})
    # Half the requests carry what the gateway would send, so their bodies reach the handler.
    honest = st.just(
        {h.AUTH: "Bearer dev-alice"}
        if api
        else {f"{h.PROP_PREFIX}{k}": v for k, v in ALICE.items()}
    )
    return honest | hostile


Case = tuple[bytes, dict[str, str]]


def draw_cases(request_type: type, count: int, *, api: bool) -> list[Case]:
    """`count` (body, headers) pairs, drawn by a sync `@given` run that only collects: the
    strategies' warnings-free way to get examples outside a test."""
    cases: list[Case] = []

    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    # A fixed seed per body type: the same cases every run, so a failure reproduces.
    @seed(zlib.crc32(f"{request_type.__name__}:{count}:{api}".encode()))
    @given(bodies(request_type), headers(api=api))
    def collect(body: bytes, hs: dict[str, str]) -> None:
        cases.append((body, hs))

    collect()
    return cases[:count]


# ---------------------------------------------------------------------------------------------
# what to fuzz, and what is stored


@dataclass(frozen=True)
class Target:
    """One subject a stack answers on: its body and reply types, and whether it is client API
    (authenticated by `rb-auth`, forwarded by the gateway)."""

    subject: str
    request: type
    reply: type
    api: bool


def _reply_type(endpoint: Endpoint) -> type:
    hint: type = typing.get_type_hints(endpoint.handler)["return"]
    return hint


def targets(stack: Stack, extra: Sequence[Service] = ()) -> list[Target]:
    """Every request/reply endpoint of every service in `stack` (and of `extra` services that
    run beside it), read from the services.

    A gateway API endpoint that forwards raw bytes takes the body and reply types of the
    service endpoint it forwards to.
    """
    endpoints = [e for s in (*stack.services.values(), *extra) for e in s.endpoints()]
    by_subject = {e.subject: e for e in endpoints}
    found = []
    for endpoint in endpoints:
        api = endpoint.subject.startswith(subjects.api(""))
        request, reply = endpoint.decoder.type, _reply_type(endpoint)
        if request is msgspec.Raw:
            internal = by_subject[
                subjects.internal(endpoint.subject.removeprefix(subjects.api("")))
            ]
            request, reply = internal.decoder.type, _reply_type(internal)
        found.append(Target(endpoint.subject, request, reply, api))
    return found


VOLATILE: Final = frozenset({f"KV_{subjects.TOOL_CATALOG_BUCKET}"})
"""Streams that change on their own: every tool executor rewrites its catalog each minute."""

State = dict[str, object]


async def stored_state(js: JetStreamContext, stack: Stack) -> State:
    """What the stack has stored: each stream's message count and last sequence (every KV
    bucket and the object store are streams too) and the ids of every memory."""
    state: State = {
        str(info.config.name): (info.state.messages, info.state.last_seq)
        for info in await js.streams_info()
        if info.config.name not in VOLATILE
    }
    memory = stack.services["memory"]
    records, _ = await memory.memories.store.scroll({}, 100_000)  # type: ignore[attr-defined]
    state["memories"] = tuple(sorted(r.memory_id for r in records))
    return state


def changed(before: State, after: State) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
