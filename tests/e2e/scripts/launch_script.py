"""A torchrun-style training script for ``elastic-train launch`` tests.

    launch_script.py OUT_DIR EPOCHS [--crash-at EPOCH] [--refused-at EPOCH] [--sleep S]
                     [--slow-below-world N] [--slow-until-world N] [--forget-optimizer]
                     [--context-on-rank0-first]
                     [--restartable] [--crash-how raise|exit|sigkill] [--crash-always]
                     [--crash-before-checkpoint] [--crash-file PATH] [--crash-times N]
                     [--slow-rank R:S] [--slow-node N:S]

It initialises its own process group (as under torchrun), uses
elastic_train.get_checkpoint()/report() for resume, and records each start
(epoch and world size) in OUT_DIR/starts, and every rank's (rank, world size,
pid, ET_TEST_NODE) in OUT_DIR/ranks; rank 0 prints the final digest.
With --restartable its main function is wrapped by @elastic_train.restart_in_process.
"""

import argparse
import hashlib
import os
import signal
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import elastic_train as et


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("epochs", type=int)
    parser.add_argument("--crash-at", type=int, default=-1)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--slow-below-world", type=int, default=0,
                        help="epochs take 1 s longer while the world is smaller than this "
                             "(a shrunk job stays running until a returning node joins)")
    parser.add_argument("--slow-until-world", type=int, default=0,
                        help="epochs take 1 s longer until the job has started once with "
                             "this many workers (a node that missed the first round, on a "
                             "loaded machine, joins before the job ends)")
    parser.add_argument("--forget-optimizer", action="store_true",
                        help="a resume bug on purpose: do not restore the optimizer state")
    parser.add_argument("--refused-at", type=int, default=-1,
                        help="rank 0 raises ConnectionRefusedError at this epoch in every "
                             "attempt (e.g. a storage outage that outlasts every restart)")
    parser.add_argument("--context-on-rank0-first", action="store_true",
                        help="rank 0 alone calls get_context() before any other session call")
    parser.add_argument("--restartable", action="store_true")
    parser.add_argument("--crash-how", choices=("raise", "exit", "sigkill"), default="raise")
    parser.add_argument("--crash-always", action="store_true",
                        help="crash at --crash-at in every attempt, not only the first")
    parser.add_argument("--crash-before-checkpoint", action="store_true",
                        help="every rank calls get_context(), then the last rank raises "
                             "before get_checkpoint() (its session never joined), once")
    parser.add_argument("--crash-file", default=None,
                        help="once PATH exists and holds this node's ET_TEST_NODE, the node's "
                             "worker raises at its next epoch, once (OUT/crashed: its rank)")
    parser.add_argument("--crash-times", type=int, default=1,
                        help="with --crash-file: the node's worker raises this many times, "
                             "once per attempt (OUT/crashed: a line per crash)")
    parser.add_argument("--slow-rank", default=None, metavar="RANK:SECONDS",
                        help="rank RANK sleeps SECONDS more each epoch (a straggler)")
    parser.add_argument("--slow-node", default=None, metavar="NODE:SECONDS",
                        help="the workers on the node whose ET_TEST_NODE is NODE sleep "
                             "SECONDS more each epoch, whatever their rank (a slow machine)")
    return parser.parse_args()


def _skew_clock() -> None:
    """ET_TEST_CLOCK_SKEW_S: this node's clock runs so many seconds ahead (time.time)."""
    skew = float(os.environ.get("ET_TEST_CLOCK_SKEW_S", "0"))
    if skew:
        real = time.time
        time.time = lambda: real() + skew


def _crash_here(crash_file: str, marker: str, times: int) -> bool:
    """Whether the test asked this node (``ET_TEST_NODE``) to crash, and it has crashed
    fewer than ``times`` times."""
    try:
        with open(crash_file) as f:
            node = f.read().strip()
    except FileNotFoundError:
        return False
    if node != os.environ.get("ET_TEST_NODE"):
        return False
    try:
        with open(marker) as f:
            return len(f.read().splitlines()) < times
    except FileNotFoundError:
        return True


def _straggling(slow_rank: str | None, slow_node: str | None, rank: int) -> float:
    """The extra sleep of ``rank`` per epoch that ``--slow-rank RANK:SECONDS`` and
    ``--slow-node NODE:SECONDS`` ask for."""
    extra = 0.0
    if slow_rank:
        slow, seconds = slow_rank.split(":")
        extra += float(seconds) if int(slow) == rank else 0.0
    if slow_node:
        node, seconds = slow_node.rsplit(":", 1)
        extra += float(seconds) if node == os.environ.get("ET_TEST_NODE") else 0.0
    return extra


def main() -> None:
    _skew_clock()
    args = _args()
    # With --context-on-rank0-first a short timeout: a collective that only rank 0 enters
    # then fails the test within seconds instead of hanging it for the default 30 minutes.
    dist.init_process_group("gloo", timeout=timedelta(seconds=20)
                            if args.context_on_rank0_first else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.crash_before_checkpoint:
        et.get_context()
        marker = os.path.join(args.out, "crashed")
        if rank == world - 1 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("crash before get_checkpoint")
    if args.context_on_rank0_first and rank == 0:
        print("CONTEXT", et.get_context().get_experiment_name(), flush=True)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    checkpoint = et.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        model.module.load_state_dict(state["model"])
        if not args.forget_optimizer:
            optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1
    full = os.path.join(args.out, "full-world")
    if rank == 0:
        with open(os.path.join(args.out, "starts"), "a") as f:
            f.write(f"{start} {world}\n")
        if args.slow_until_world and world >= args.slow_until_world:
            open(full, "w").close()
    with open(os.path.join(args.out, f"pid-{os.getpid()}"), "w") as f:
        f.write(str(os.getpid()))
    with open(os.path.join(args.out, "ranks"), "a") as f:
        f.write(f"{rank} {world} {os.getpid()} {os.environ.get('ET_TEST_NODE', '-')}\n")
    for epoch in range(start, args.epochs):
        gen = torch.Generator().manual_seed(epoch)
        x = torch.randn(8, 4, generator=gen)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        marker = os.path.join(args.out, "crashed")
        if epoch == args.crash_at and rank == world - 1 and (
                args.crash_always or not os.path.exists(marker)):
            open(marker, "w").close()
            if args.crash_how == "exit":
                os._exit(3)
            if args.crash_how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"crash at epoch {epoch}")
        if args.crash_file and _crash_here(args.crash_file, marker, args.crash_times):
            with open(marker, "a") as f:
                f.write(f"{rank}\n")
            raise RuntimeError(f"crash on node {os.environ['ET_TEST_NODE']} (rank {rank}) "
                               f"at epoch {epoch}")
        if epoch == args.refused_at and rank == 0:
            raise ConnectionRefusedError(111, "Connection refused")
        slow = world < args.slow_below_world or (
            world < args.slow_until_world and not os.path.exists(full))
        time.sleep(args.sleep + (1.0 if slow else 0.0)
                   + _straggling(args.slow_rank, args.slow_node, rank))
        with tempfile.TemporaryDirectory() as d:
            ckpt = None
            if rank == 0:
                torch.save({"model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict(), "epoch": epoch},
                           os.path.join(d, "state.pt"))
                ckpt = et.Checkpoint.from_directory(d)
            et.report({"loss": loss.item(), "epoch": epoch, "world_size": world},
                      checkpoint=ckpt, checkpoint_upload_mode="SYNC")
    if rank == 0:
        digest = hashlib.sha256(b"".join(
            t.detach().numpy().tobytes() for t in model.module.state_dict().values()))
        print("DIGEST", digest.hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    (et.restart_in_process(main) if "--restartable" in sys.argv else main)()
