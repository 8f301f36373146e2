"""The per-node agent: a thin layer over torch.distributed.elastic.

The agent never imports user code; it starts ``python -m elastic_train.worker``.
"""

from elastic_train.agent.failures import failures_of
from elastic_train.agent.launch import AgentSpec, Interrupted, run_agent

__all__ = ["AgentSpec", "Interrupted", "failures_of", "run_agent"]
