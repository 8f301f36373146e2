"""In-process restarts, the worker's side (the agent's: :mod:`elastic_train.agent.inprocess`).

- :mod:`.loop`: the attempts' loop a worker runs its train function in (a failed attempt
  unwinds by :class:`~.loop.RestartAttempt`; the next starts in the same process).
- :mod:`.decorator`: ``@elastic_train.restart_in_process`` for scripts under
  ``elastic-train launch``.
- :mod:`.channel`: the files through which a worker and its agent agree on attempts
  (records, verdicts; one writer each).
- :mod:`.group_sockets`: an attempt's process-group connections, cut when it fails.

Importing this package imports nothing.
"""
