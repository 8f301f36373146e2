"""``python -m bench.sharded_run CONFIG_JSON``: one node's driver for figures 10 and 11.

``TorchTrainer(bench.sharded_job.train).fit()`` with the settings in CONFIG_JSON:
``storage``/``options``/``name`` (the run), ``workers`` in all and ``per_node`` on
each node, ``rendezvous`` (``endpoint``, ``run_id``) when there are several nodes,
``max_failures``, ``train`` (the train function's config) and ``env`` (set in this
process, so that its workers inherit it). Prints ``RESULT ok`` or ``RESULT failed``.
"""

from __future__ import annotations

import json
import os
import sys

import cloudpickle

from bench import sharded_job


def main(config: dict) -> int:
    import elastic_train as et
    from elastic_train.torch import TorchTrainer

    os.environ.update(config.get("env", {}))
    cloudpickle.register_pickle_by_value(sharded_job)
    rendezvous = config.get("rendezvous")
    scaling = et.ScalingConfig(num_workers=config["workers"])
    if rendezvous:
        scaling = et.ScalingConfig(
            num_workers=config["workers"], num_workers_per_node=config["per_node"],
            rendezvous=et.RendezvousConfig(backend="c10d", endpoint=rendezvous["endpoint"],
                                           run_id=rendezvous["run_id"]))
    try:
        TorchTrainer(
            sharded_job.train, train_loop_config=config["train"], scaling_config=scaling,
            run_config=et.RunConfig(
                storage_path=config["storage"], storage_options=config["options"] or None,
                name=config["name"], verbose=0,
                failure_config=et.FailureConfig(max_failures=config["max_failures"]),
                checkpoint_config=et.CheckpointConfig(num_to_keep=2)),
        ).fit()
    except et.TrainingFailedError as exc:
        print(f"RESULT failed: {str(exc).splitlines()[0]}", flush=True)
        return 1
    print("RESULT ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
