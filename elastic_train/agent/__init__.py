"""The per-node agent: a thin layer over torch.distributed.elastic (runs in the driver's
process, or in ``elastic-train launch``'s).

- :mod:`.api`: :class:`~.api.AgentSpec` and :func:`~.api.run_agent`, what the driver calls.
- :mod:`.local_agent`: torch's ``LocalElasticAgent`` with our numbered departures.
- :mod:`.restart_budget`: which budget a failed attempt spends, and whether to restart.
- :mod:`.failures`: torch's run result as :class:`~elastic_train.errors.WorkerFailure` records.
- :mod:`.hang_watch`: stops workers that make no progress.
- :mod:`.zygote` / :mod:`.zygote_client`: workers forked from a process that imported torch.
- :mod:`.rendezvous`: the backends table, their settings, our etcd v3 backend.

The agent never imports user code: it starts the worker entry points of
:mod:`elastic_train.worker`. Importing this package imports nothing (not torch):
``RendezvousConfig``, a public type, lives below it.
"""
