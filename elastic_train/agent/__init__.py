"""The per-node agent: a thin layer over torch.distributed.elastic.

The agent never imports user code; it starts ``python -m elastic_train.worker``.
Its names are imported on first use: torch loads our rendezvous entry point
(:mod:`elastic_train.agent.rendezvous`) while importing its own agent, so this
package must not import torch's agent when it is imported itself.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AgentSpec": "elastic_train.agent.launch",
    "Interrupted": "elastic_train.agent.launch",
    "run_agent": "elastic_train.agent.launch",
    "failures_of": "elastic_train.agent.failures",
}

__all__ = ["AgentSpec", "Interrupted", "failures_of", "run_agent"]

if TYPE_CHECKING:
    from elastic_train.agent.failures import failures_of
    from elastic_train.agent.launch import AgentSpec, Interrupted, run_agent


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
