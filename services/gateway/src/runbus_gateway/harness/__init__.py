"""The agent harness: what makes an agent finish long tasks and stay inside the rules —
guardrails and output rewriting around the run, the todo list, plan/execute modes, loop mode,
and agents that are Python programs instead of chat models. NATS-free; the run
(`runbus_gateway.run`) draws on it through a toolset and a context provider.
"""

from .config import HarnessConfig, LoopConfig, ModesConfig, TodosConfig
from .runtime import Harness, with_context
from .state import SessionState, StatePort

__all__ = [
    "Harness",
    "HarnessConfig",
    "LoopConfig",
    "ModesConfig",
    "SessionState",
    "StatePort",
    "TodosConfig",
    "with_context",
]
