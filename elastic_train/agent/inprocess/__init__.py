"""In-process restarts, the agent's side (the worker's: :mod:`elastic_train.worker.inprocess`).

- :mod:`.restarts`: the steps of one in-process restart (detect, interrupt, recover,
  go; or give up) over the workers' records.
- :mod:`.controller`: the agent's part, an object it owns with named states
  (:class:`~.controller.RestartState`) and a small interface to it
  (:class:`~.controller.AgentHooks`).
- :mod:`.attempt_store`: how the agents of a multi-node job agree on an attempt.

Importing this package imports nothing.
"""
