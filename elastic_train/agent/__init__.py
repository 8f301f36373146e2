"""The per-node agent: a thin layer over torch.distributed.elastic (runs in the driver's
process, or in ``elastic-train launch``'s).

- :mod:`.api`: :class:`~.api.AgentSpec` and :func:`~.api.run_agent`, what the driver calls.
- :mod:`.local_agent`: torch's ``LocalElasticAgent`` with our changes, each named.
- :mod:`.restart_budget`: which budget a failed attempt spends, and whether to restart.
- :mod:`.failures`: torch's run result as :class:`~elastic_train.errors.WorkerFailure` records.
- :mod:`.hang_watch`: stops workers that make no progress.
- :mod:`.no_progress_guard`: stops restarting when restarts bring nothing.
- :mod:`.attribution`: which node a multi-node failure is charged to.
- :mod:`.worker_slots`, :mod:`.forked_workers`: one worker replaced in its slot; the
  workers a zygote forked behind their stand-ins.
- :mod:`.torch_compat`: what differs between the supported torch releases.
- :mod:`.zygote`: workers forked from a process that imported torch (its server, the
  client each worker slot runs, the fork from the driver, the preloading).
- :mod:`.inprocess`: in-process restarts, the agent's side (the steps, the agent's
  part of them, the agreement across nodes).
- :mod:`.rendezvous`: the backends table, their settings, our etcd v3 backend.

The agent never imports user code: it starts the worker entry points of
:mod:`elastic_train.worker`. Importing this package imports nothing (not torch):
``RendezvousConfig``, a public type, lives below it.
"""
