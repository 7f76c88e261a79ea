"""The client's own tools (OpenAI `tools`, AG-UI frontend tools) at the ingress: offered to an
agent that takes them (`client_tools = true`), refused with a typed 400 by any other — never
dropped. A call the model makes of one is handed to the client under the id
`<run_id>:<call_id>`; the client's next request answers it with a `tool` message of that id,
which the ingress writes to the waiting run (`client_tools.answer`, owner-checked by the
gateway) before it follows the same run on."""

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

import msgspec

from runbus import ops
from runbus.client import RunbusClient, SequencedEvent
from runbus.errors import BadRequest
from runbus.messages import RunToolResult, ToolSpec, is_identifier
from runbus.messages.runs import AgentList, ClientToolAnswer


class ClientToolsRefused(BadRequest):
    """The request brings tools of the client's own, and the agent does not take any."""

    def __init__(self, agent: str, field: str, names: list[str]) -> None:
        shown = ", ".join(repr(n[:64]) for n in names[:5]) + (", …" if len(names) > 5 else "")
        super().__init__(
            f"agent {agent[:128]!r} does not accept the client's own tools ({field}: {shown}); "
            f"it runs only its own tools: send the request without {field!r}",
            details={"param": field},
        )
        self.agent = agent
        self.field = field
        self.names = names


async def offered(
    client: RunbusClient, agent: str, field: str, specs: Sequence[ToolSpec]
) -> list[ToolSpec]:
    """`specs`, once the agent is known to take client tools (`ClientToolsRefused` if not). An
    unknown agent is left to the gateway, which answers `unknown_agent`."""
    if not specs:
        return []
    listed = await client.call(ops.API_AGENTS_LIST, AgentList())
    known = next((a for a in listed.agents if a.name == agent), None)
    if known is not None and not known.client_tools:
        raise ClientToolsRefused(agent, field, [s.name for s in specs])
    return list(specs)


def public_call_id(run_id: str, call_id: str) -> str:
    """The id a client gets for a call: it names the run, so its answer finds the run."""
    return f"{run_id}:{call_id}"


def parse_call_id(public: str) -> tuple[str, str]:
    """(run id, call id) of an id `public_call_id` made; `BadRequest` for any other."""
    run_id, colon, call_id = public.partition(":")
    if not colon or not call_id or not is_identifier(run_id):
        raise BadRequest(f"tool_call_id {public[:80]!r} names no call of a runbus run")
    return run_id, call_id


async def answer(
    client: RunbusClient, answers: Sequence[tuple[str, Any]]
) -> tuple[str, set[str]] | None:
    """Write the client's answers (`(tool_call_id, content)`, the request's trailing `tool`
    messages) to the run waiting on them; the run and the call ids answered, None when there
    are none. All must answer calls of one run."""
    if not answers:
        return None
    parsed = [(*parse_call_id(public), content) for public, content in answers]
    runs = {run_id for run_id, _, _ in parsed}
    if len(runs) != 1:
        raise BadRequest("the `tool` messages answer calls of more than one run")
    for run_id, call_id, content in parsed:
        await client.call(
            ops.API_CLIENT_TOOLS_ANSWER,
            ClientToolAnswer(run_id=run_id, call_id=call_id, result=content),
        )
    return runs.pop(), {call_id for _, call_id, _ in parsed}


async def after_answers(
    events: AsyncIterator[SequencedEvent], answered: set[str]
) -> AsyncGenerator[SequencedEvent, None]:
    """The run's events after the results of the answered calls: what the client has not
    seen yet (it got the run's events up to those calls with the previous response)."""
    waiting = set(answered)
    async for item in events:
        if waiting:
            if isinstance(item.event, RunToolResult):
                waiting.discard(item.event.result.call_id)
            continue
        yield item


def arguments_text(arguments: dict[str, Any] | None) -> str:
    """A call's arguments as the JSON text OpenAI clients parse."""
    return msgspec.json.encode(arguments or {}).decode()
