"""One node's driver of a ``fit()`` run, set up by one JSON argument (for storage-fault tests).

Usage: python -m tests.e2e.scripts.node_driver '{"storage": ..., "name": ..., "out_dir": ..., ...}'

Keys: ``storage``, ``name``, ``out_dir``, ``epochs``; optional ``rendezvous``
(``{"backend", "endpoint"}``: a multi-node job of ``nodes`` = [MIN, MAX] nodes of
one worker each, run id = name), ``max_failures``, ``fault`` (see
``tests.support.jobs``), ``stale_fs`` (:class:`tests.support.stale_fs.NodeCacheFS`
arguments: the storage seen through a node's NFS caches), and
``hold_after_exception``: ``after_exception`` creates ``OUT_DIR/holding`` and waits
(up to 90 s, as a slow callback would) until ``OUT_DIR/release`` exists;
``storage_options`` (``endpoint_url`` replaced by ``$NODE_STORAGE_ENDPOINT`` when set:
each node through a proxy of its own), ``checkpoint`` (``CheckpointConfig`` arguments)
and ``train`` (more of ``train_mlp``'s config). Rank 0 writes its driver's pid to
``OUT_DIR/rank0.driver``, and rank R its node's local tier to ``OUT_DIR/tier.R``, at every
start;
the driver prints ``DIGEST <hex>`` at the end.
"""

from __future__ import annotations

import json
import os
import sys
import time

import cloudpickle

import elastic_train as et
from elastic_train.storage import node_settings
from elastic_train.torch import TorchTrainer
from tests.support import jobs, stale_fs
from tests.support.peer_faults import NODE_ENDPOINT

cloudpickle.register_pickle_by_value(jobs)


DRIVER_PID = "NODE_DRIVER_PID"  # set by the driver, inherited by its workers


def train(config):
    rank = et.get_context().get_world_rank()
    if rank == 0:
        with open(os.path.join(config["out_dir"], "rank0.driver"), "w") as f:
            f.write(os.environ[DRIVER_PID])
    with open(os.path.join(config["out_dir"], f"tier.{rank}"), "w") as f:  # its node's tier
        f.write(node_settings.current().tier_root or "")
    return jobs.train_mlp(config)


class HoldAfterException(et.UserCallback):
    """``after_exception`` marks that it holds, then waits for the test's release."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir

    def after_exception(self, run_context, worker_exceptions):
        open(os.path.join(self.out_dir, "holding"), "w").close()
        deadline = time.monotonic() + 90
        release = os.path.join(self.out_dir, "release")
        while time.monotonic() < deadline and not os.path.exists(release):
            time.sleep(0.05)
        print("HOLD released", flush=True)


def main(settings: dict) -> None:
    os.environ[DRIVER_PID] = str(os.getpid())
    name, out_dir = settings["name"], settings["out_dir"]
    scaling = et.ScalingConfig(num_workers=2)
    if settings.get("rendezvous"):
        low, high = settings["nodes"]
        scaling = et.ScalingConfig(
            num_workers=(low, high), num_workers_per_node=1,
            rendezvous=et.RendezvousConfig(run_id=name, **settings["rendezvous"]))
    filesystem = stale_fs.NodeCacheFS(**settings["stale_fs"]) if settings.get("stale_fs") \
        else None
    storage = settings["storage"]
    options = settings.get("storage_options")
    if options and os.environ.get(NODE_ENDPOINT):  # this node's way to the store
        options = {**options, "endpoint_url": os.environ[NODE_ENDPOINT]}
    callbacks = [HoldAfterException(out_dir)] if settings.get("hold_after_exception") else []
    result = TorchTrainer(
        train,
        train_loop_config={"epochs": settings["epochs"], "out_dir": out_dir,
                           "step_sleep": settings.get("step_sleep", 0.05),
                           "starts_file": os.path.join(out_dir, "starts"),
                           **({"fault": settings["fault"]} if settings.get("fault") else {}),
                           **settings.get("train", {})},
        scaling_config=scaling,
        run_config=et.RunConfig(
            storage_path=storage, name=name, storage_filesystem=filesystem,
            storage_options=options, callbacks=callbacks,
            checkpoint_config=et.CheckpointConfig(**settings.get("checkpoint", {})),
            failure_config=et.FailureConfig(max_failures=settings.get("max_failures", 1))),
        datasets={"train": jobs.make_dataset()},
    ).fit()
    print("DIGEST", result.return_value["digest"] if result.return_value else None, flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
