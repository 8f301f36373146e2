"""The per-node agent: a thin layer over torch.distributed.elastic.

The agent never imports user code; it starts ``python -m elastic_train.worker.fit_worker``.
"""

from elastic_train.agent.api import AgentSpec, Interrupted, run_agent
from elastic_train.agent.failures import failures_of

__all__ = ["AgentSpec", "Interrupted", "failures_of", "run_agent"]
