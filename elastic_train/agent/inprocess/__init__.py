"""In-process restarts, the agent's side (the worker's: :mod:`elastic_train.worker.inprocess`).

- :mod:`.restarts`: the steps of one in-process restart (detect, interrupt, recover,
  go; or give up) over the workers' records.
- :mod:`.agent_mixin`: the agent's part (budget, hang watch, preemption notices).
- :mod:`.attempt_store`: how the agents of a multi-node job agree on an attempt.

Importing this package imports nothing.
"""
