"""Puts our rendezvous backends into torch's handler registry (the agent's side of the
table in :mod:`elastic_train._internal.rendezvous_backends`, which imports no torch).

Example::

    register(lookup("etcd", "--rdzv-backend"))   # torch's registry now knows "etcd-v3"
"""

from __future__ import annotations

import importlib

from elastic_train._internal.rendezvous_backends import Backend


def register(backend: Backend) -> None:
    """Puts ``backend``'s factory into torch's handler registry under each of its names;
    idempotent. torch registers its own v2 "etcd" handler on import, and its registry
    refuses a taken name, so a name held by another factory is dropped first."""
    if backend.factory is None:
        return
    from torch.distributed.elastic.rendezvous.registry import handler_registry

    module, _, function = backend.factory.partition(":")
    factory = getattr(importlib.import_module(module), function)
    for name in backend.names:
        if handler_registry._registry.get(name) is not factory:
            handler_registry._registry.pop(name, None)
            handler_registry.register(name, factory)
