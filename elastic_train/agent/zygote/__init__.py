"""Workers forked from a warm process that has imported torch (see :mod:`.server`).

- :mod:`.server`: the zygote: a process per driver (or ``launch`` agent) that forks
  each worker; ``python -m elastic_train.agent.zygote.server SOCKET``.
- :mod:`.client`: what each worker slot runs instead of a Python worker (standard
  library only, run by path): it asks the zygote for the worker and stands in for it.
- :mod:`.fork`: whether the zygote may be forked from the driver itself, and the fork.
- :mod:`.preload`: which modules the zygote imports ahead for later workers.

Importing this package imports nothing.
"""
