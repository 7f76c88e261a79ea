"""Every request/reply operation is declared once in `runbus.ops`, on a subject `subjects`
declares, and every endpoint a service exposes serves one of them."""

import re
from typing import Any

import msgspec
import nkeys
import pytest
from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue

from runbus import ops, subjects
from runbus.bus import Bus
from runbus.messages import ToolInvoke
from runbus.service import Endpoint, Service
from runbus.tokens import TokenVerifier
from runbus_auth.service import AuthService
from runbus_compaction.service import CompactionService
from runbus_gateway.api import ClientApi
from runbus_gateway.approvals import Approvals
from runbus_gateway.runs import RunRecords
from runbus_history.service import HistoryService
from runbus_memory.embedder import HashingEmbedder
from runbus_memory.service import MemoryService
from runbus_model_router.service import ModelRouterService
from runbus_tool_executor.registry import ToolRegistry
from runbus_tool_executor.service import ToolExecutorService

DECLARED = {v for k, v in vars(subjects).items() if k.isupper() and isinstance(v, str)}
TEMPLATES = {t for t in DECLARED if "{" in t}
EVERY_OP = [v for v in vars(ops).values() if isinstance(v, ops.Op | ops.NamedOp)]

registry = ToolRegistry()


@registry.tool()
def echo(text: str) -> str:
    """Say it back."""
    return text


def _fills(template: str, subject: str) -> bool:
    pattern = re.escape(template)
    pattern = re.sub(r"\\\{[a-z_]+\\\}", r"[^.]+(?:\\.[^.]+)*", pattern)
    return re.fullmatch(pattern, subject) is not None


def _endpoints() -> dict[str, list[Endpoint]]:
    """The endpoints of every service, built on a connection that is never opened: listing
    them needs no bus."""
    nc = NATS()
    seed = nkeys.encode_seed(bytes(32), nkeys.PREFIX_BYTE_ACCOUNT)
    services: list[Service] = [
        HistoryService(nc),
        MemoryService(nc, embedder=HashingEmbedder()),
        CompactionService(nc),
        ModelRouterService(nc, {}),
        ToolExecutorService(nc, [registry]),
        AuthService(nc, verifier=TokenVerifier.from_file(), issuer_seed=seed),
    ]
    listed = {service.name: service.endpoints() for service in services}
    kv = KeyValue("unused", "KV_unused", "$KV.unused.", nc.jetstream(), direct=False)
    api = ClientApi(
        nc,
        Bus(nc, services[0].tracer),
        TokenVerifier.from_file(),
        RunRecords(kv, nc.jetstream()),
        Approvals(kv),
        agents={},
    )
    listed["gateway"] = api.endpoints()
    return listed


ENDPOINTS = _endpoints()


@pytest.mark.parametrize("op", EVERY_OP, ids=repr)
def test_every_operation_is_on_a_subject_the_subjects_module_declares(op: Any) -> None:
    if isinstance(op, ops.NamedOp):
        assert op.template in TEMPLATES
        assert op.at("echo").subject == subjects.tool_invoke("echo")
        return
    if op.span_subject is None:
        assert op.subject in DECLARED
    else:
        assert op.span_subject in TEMPLATES
        assert _fills(op.span_subject, op.subject), (op.span_subject, op.subject)


def test_the_list_of_operations_holds_every_operation_once() -> None:
    assert sorted(map(id, ops.ALL)) == sorted(map(id, EVERY_OP))
    subjects_of = [op.template if isinstance(op, ops.NamedOp) else op.subject for op in ops.ALL]
    assert len(subjects_of) == len(set(subjects_of))


@pytest.mark.parametrize("service", sorted(ENDPOINTS))
def test_every_endpoint_a_service_exposes_serves_a_declared_operation(service: str) -> None:
    for endpoint in ENDPOINTS[service]:
        op = endpoint.op
        assert op is not None, f"{service} endpoint {endpoint.name!r} serves no operation"
        if endpoint.forwarded:
            # The gateway's client API takes a service operation's body unread and forwards it
            # to that operation; the body is decoded and checked where it arrives.
            assert op in ops.FORWARDED
            api = ops.api_op(op)
            assert (endpoint.subject, endpoint.name) == (api.subject, api.name)
            continue
        family = ops.TOOL_INVOKE.family
        if endpoint.span_subject == ops.TOOL_INVOKE.template:
            assert (op.request, op.reply) == (family.request, family.reply)
            assert endpoint.subject == ops.TOOL_INVOKE.at(endpoint.subject.split(".")[2]).subject
        else:
            assert op in ops.ALL
        assert endpoint.subject == op.subject
        assert endpoint.decoder is op.decode


def test_endpoint_names_subjects_and_span_names_are_as_they_were() -> None:
    """Moving to declared operations changed no subject, endpoint name or span name."""
    seen = {(s, e.name, e.subject, e.span_subject) for s, es in ENDPOINTS.items() for e in es}
    assert ("history", "state-update", "runbus.sessions.state.update", None) in seen
    assert (
        "tool_executor",
        "invoke-echo",
        "runbus.tools.echo.invoke",
        subjects.TOOL_INVOKE_TEMPLATE,
    ) in seen
    assert (
        "memory",
        "invoke-memory_search",
        "runbus.tools.memory_search.invoke",
        subjects.TOOL_INVOKE_TEMPLATE,
    ) in seen
    assert ("gateway", "api-runs-get", "runbus.api.runs.get", subjects.API_TEMPLATE) in seen
    assert (
        "gateway",
        "api-sessions-state-update",
        "runbus.api.sessions.state.update",
        subjects.API_TEMPLATE,
    ) in seen
    assert len({e.subject for es in ENDPOINTS.values() for e in es}) == sum(
        map(len, ENDPOINTS.values())
    )


def test_a_named_operation_shares_its_family_decoders() -> None:
    one, other = ops.TOOL_INVOKE.at("a"), ops.TOOL_INVOKE.at("b")
    assert one.decode is other.decode is ops.TOOL_INVOKE.family.decode
    body = msgspec.json.encode(ToolInvoke(call_id="c", name="a", arguments={}))
    assert one.decode.decode(body).name == "a"
