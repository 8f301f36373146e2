"""The worker of the rendezvous figure (``stamp`` with ``--no-python``, ``train`` as a script).

    rdzv_worker.py OUT_DIR stamp   append this start's time.time() to OUT_DIR/starts, exit
    rdzv_worker.py OUT_DIR train   join the gloo group and all-reduce until OUT_DIR/stop
                                   exists; rank 0 appends "<time> <world size>" to
                                   OUT_DIR/starts when its process starts and to
                                   OUT_DIR/steps after its first all-reduce, at every
                                   (re)start; every process appends "<pid> <node>" to
                                   OUT_DIR/pids (the node: $BENCH_RDZV_NODE, which the
                                   harness gives each agent)
    rdzv_worker.py OUT_DIR restartable
                                   ``train`` in a main function wrapped by
                                   ``@elastic_train.restart_in_process``: rank 0's
                                   "starts" line is written as each attempt starts

``stamp`` imports nothing heavy, so the time to form the job is the agents' own;
``train`` notices a lost peer the way training does, in a collective.
"""

from __future__ import annotations

import os
import sys
import time

NODE_VARIABLE = "BENCH_RDZV_NODE"


def _append(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def train(out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    first = True
    while True:
        stop = torch.tensor([float(os.path.exists(os.path.join(out_dir, "stop")))])
        dist.all_reduce(stop)
        if first and dist.get_rank() == 0:
            _append(os.path.join(out_dir, "steps"), f"{time.time()} {dist.get_world_size()}")
        first = False
        if stop.item() > 0:
            break
        time.sleep(0.05)
    dist.destroy_process_group()


def _pid(out_dir: str) -> None:
    _append(os.path.join(out_dir, "pids"), f"{os.getpid()} {os.environ.get(NODE_VARIABLE, '-')}")


def _started(out_dir: str) -> None:
    if os.environ.get("RANK") == "0":
        _append(os.path.join(out_dir, "starts"), f"{time.time()} {os.environ['WORLD_SIZE']}")


if __name__ == "__main__":
    out, mode = sys.argv[1:3]
    if mode == "stamp":
        _append(os.path.join(out, "starts"), str(time.time()))
    elif mode == "restartable":
        import elastic_train

        _pid(out)

        @elastic_train.restart_in_process
        def main() -> None:
            _started(out)  # each attempt: the survivors' processes run on
            train(out)

        main()
    else:
        _pid(out)
        _started(out)  # before importing torch
        train(out)
