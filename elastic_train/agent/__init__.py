"""The per-node agent: a thin layer over torch.distributed.elastic.

The agent never imports user code; it starts ``python -m elastic_train.worker``.
"""

from elastic_train.agent.launch import AgentSpec, Interrupted, failures_of, run_agent

__all__ = ["AgentSpec", "Interrupted", "failures_of", "run_agent"]
