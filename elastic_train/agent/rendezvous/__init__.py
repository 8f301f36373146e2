"""How the nodes of a job meet, the agent's side: the handlers torch's registry gets.

The public settings and the table of backends live above the agent, where
``config.py`` and ``launch`` read them without importing it:
:mod:`elastic_train.rendezvous_config` (:class:`~elastic_train.RendezvousConfig`,
torchrun's ``--rdzv-*``) and :mod:`elastic_train._internal.rendezvous_backends` (names,
aliases, defaults, traits, factories; adding a backend is one module here and one
line there).

- :mod:`.registry`: puts the table's factories into torch's handler registry.
- :mod:`.etcd_native` (with :mod:`.etcd_rounds`, :mod:`.etcd_kv`,
  :mod:`.etcd_lease`): our own handler on etcd's v3 API, ``etcd``: per-node
  keys, leases and watches, O(N) work per round.
- :mod:`.etcd_v3` / :mod:`.etcd_handler`: torch's dynamic rendezvous over etcd's
  v3 API, ``etcd-v3``.

Importing this package imports neither torch nor etcd3gw: ``RendezvousConfig``
is a public type that ``elastic-train ls`` loads too, and torch loads
:func:`torchrun_handler` as its ``torchrun.handlers`` entry point while it
imports its own rendezvous package, possibly half way through importing its
agent (e.g. for ``torch.distributed.checkpoint``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def torchrun_handler() -> Callable[[Any], Any]:
    """The ``torchrun.handlers`` entry point (``pyproject.toml``): plain ``torchrun
    --rdzv-backend etcd-v3`` uses our etcd v3 handler too, once the package is installed.
    The handler's module is imported only when torch asks for it."""
    from elastic_train.agent.rendezvous.etcd_handler import create_etcd_v3_handler

    return create_etcd_v3_handler
