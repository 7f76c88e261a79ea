"""The A2A agent card of a runbus agent: one card per agent, at the agent's own URL."""

from importlib.metadata import version
from typing import Any, Final

from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentProvider,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import (
    AGENT_CARD_WELL_KNOWN_PATH,
    PROTOCOL_VERSION_0_3,
    PROTOCOL_VERSION_1_0,
    TransportProtocol,
)

from runbus.messages.runs import AgentSummary

A2A_PREFIX: Final = "/v1/a2a/"
CARD_PATH: Final = AGENT_CARD_WELL_KNOWN_PATH
"""Appended to an agent's URL (`/v1/a2a/{agent}`), where A2A clients look for its card."""
BEARER: Final = "bearer"


def agent_url(base: str, agent: str) -> str:
    """The agent's A2A endpoint under the ingress at `base` (scheme, host and port)."""
    return f"{base.rstrip('/')}{A2A_PREFIX}{agent}"


def agent_card(summary: AgentSummary, base: str) -> AgentCard:
    """JSON-RPC at the agent's URL, A2A 1.0 and 0.3 alike; streaming; the ingress's bearer
    token; text in, text (the answer) and JSON (tool activity) out."""
    url = agent_url(base, summary.name)
    description = summary.description or f"The runbus agent {summary.name}."
    return AgentCard(
        name=summary.name,
        description=description,
        version=version("runbus-ingress"),
        provider=AgentProvider(organization="runbus", url=base.rstrip("/")),
        supported_interfaces=[
            AgentInterface(
                url=url,
                protocol_binding=TransportProtocol.JSONRPC.value,
                protocol_version=protocol,
            )
            for protocol in (PROTOCOL_VERSION_1_0, PROTOCOL_VERSION_0_3)
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        security_schemes={
            BEARER: SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer", description="the runbus token the ingress takes"
                )
            )
        },
        security_requirements=[SecurityRequirement(schemes={BEARER: StringList()})],
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain", "application/json"],
        skills=[
            AgentSkill(
                id=summary.name,
                name=summary.name,
                description=description,
                tags=["runbus"],
            )
        ],
    )


def card_document(card: AgentCard) -> dict[str, Any]:
    """The card as JSON, with the fields A2A 0.3 clients read (`url`, `protocolVersion`)."""
    return agent_card_to_dict(card)
