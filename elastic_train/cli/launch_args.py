"""``elastic-train launch``'s command line: torchrun's flags (and ``PET_*`` variables) plus ours.

The flags become :class:`~elastic_train.driver.launch.LaunchSettings`, which
turns them into the Python API's configs; this module only parses.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from elastic_train.config import DEFAULT_STORAGE_PATH
from elastic_train.errors import ConfigError, StorageError

START_OVER_HELP = ("if the run stored under --name cannot be continued (it finished, or its "
                   "script or arguments changed), move it aside to <name>.<status>-<UTC "
                   "time> (nothing is deleted) and start a fresh run; a run that can be "
                   "continued is continued")
EXIT_CODES = ("exit codes: 0 success, 1 the run failed, 2 bad usage or not a run, "
              "3 stopped: restarts brought no progress (--max-restarts-without-progress), "
              "128+N stopped by signal N (130: Ctrl-C)")


def flag(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """A flag under torchrun's both spellings (--nproc-per-node and --nproc_per_node)."""
    names = [f"--{name}"] + ([f"--{name.replace('-', '_')}"] if "-" in name else [])
    parser.add_argument(*names, **kwargs)


def add_launch_parser(sub: Any) -> None:
    """``elastic-train launch``: torchrun's flags, then ours."""
    launch = sub.add_parser(
        "launch", help="run a training script on this node (torchrun's flags)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Runs SCRIPT on --nproc-per-node workers of this node under "
                    "torch.distributed.elastic, like torchrun. Scripts that call "
                    "elastic_train.report()/get_checkpoint() get checkpoints in "
                    "--storage-path/--name, retention and resume; relaunching with the same "
                    "--name continues an interrupted run.",
        epilog="examples:\n"
               "  elastic-train launch --standalone --nproc-per-node 2 train.py --lr 0.1\n"
               "  elastic-train launch --nnodes 2:4 --nproc-per-node 8 --rdzv-backend etcd \\\n"
               "      --rdzv-endpoint etcd-host:2379 --rdzv-id job42 train.py\n"
               "environment: torchrun's flags that take a value, and --storage-path, --name, "
               "--preemption-grace and --max-preemption-failures, can also be set as "
               "PET_<FLAG> (PET_NPROC_PER_NODE=2), as with torchrun.\n" + EXIT_CODES)
    _add_torchrun_flags(launch)
    _add_our_flags(launch)
    launch.add_argument("-m", "--module", action="store_true", help="run SCRIPT as a module")
    flag(launch, "no-python", action="store_true", help="run SCRIPT as a program")
    launch.add_argument("script")
    launch.add_argument("script_args", nargs=argparse.REMAINDER)
    launch.set_defaults(func=cmd_launch)


def _add_torchrun_flags(launch: argparse.ArgumentParser) -> None:
    """torchrun's flags, with torchrun's ``PET_*`` variables as their defaults."""
    env = os.environ.get
    flag(launch, "nnodes", default=env("PET_NNODES", "1"), help="N or MIN:MAX (default 1)")
    flag(launch, "nproc-per-node", type=int, default=int(env("PET_NPROC_PER_NODE", "1")))
    flag(launch, "rdzv-backend", default=env("PET_RDZV_BACKEND", "c10d"),
          help="c10d (default), static, or etcd / etcd-v3 (etcd's v3 API)")
    flag(launch, "rdzv-endpoint", default=env("PET_RDZV_ENDPOINT", ""))
    flag(launch, "rdzv-id", default=env("PET_RDZV_ID"),
          help="the job's id, the same on every node (required with several nodes)")
    flag(launch, "rdzv-conf", default=env("PET_RDZV_CONF", ""), help="k1=v1,k2=v2")
    flag(launch, "standalone", action="store_true", help="single node, local rendezvous")
    flag(launch, "max-restarts", type=int, default=int(env("PET_MAX_RESTARTS", "0")),
          help="restarts after failures (-1: unlimited)")
    flag(launch, "max-failures", type=int, dest="max_restarts",
          help="Ray-style alias of --max-restarts")
    flag(launch, "monitor-interval", type=float,
          default=float(env("PET_MONITOR_INTERVAL", "0.1")))
    flag(launch, "node-rank", type=int, default=int(env("PET_NODE_RANK", "0")),
          help="this node's rank (static rendezvous)")
    flag(launch, "master-addr", default=env("PET_MASTER_ADDR", "127.0.0.1"))
    flag(launch, "master-port", type=int, default=int(env("PET_MASTER_PORT", "29500")))
    flag(launch, "local-addr", default=env("PET_LOCAL_ADDR"))
    flag(launch, "log-dir", default=env("PET_LOG_DIR"),
          help="per-rank logs (default: the run directory's logs/)")
    flag(launch, "local-ranks-filter", default=env("PET_LOCAL_RANKS_FILTER", ""),
          help="show only these local ranks' output on the console, e.g. 0 or 0,1 "
               "(the log files keep every rank's)")
    flag(launch, "redirects", default=env("PET_REDIRECTS", "0"),
          help="as torchrun: streams to send only to the log files (0 none, 1 stdout, "
               "2 stderr, 3 both)")
    flag(launch, "tee", default=env("PET_TEE", "3"),
          help="as torchrun: redirected streams also shown on the console (default 3)")


def _add_our_flags(launch: argparse.ArgumentParser) -> None:
    """Ours: hangs, preemption, the console, storage, checkpoints, starting over."""
    env = os.environ.get
    flag(launch, "hang-timeout", type=float, default=None,
          help="restart the job when a worker makes no progress (no report or batch) for "
               "this many seconds")
    flag(launch, "no-restart-in-process", action="store_true",
          help="restart the processes after a failure, even for a script whose main is "
               "wrapped by @elastic_train.restart_in_process")
    flag(launch, "unwind-timeout", type=float, default=10.0,
          help="with in-process restarts, seconds a surviving worker may take to leave the "
               "failed attempt before it is killed and replaced (default 10)")
    flag(launch, "max-restarts-without-progress", type=int, default=3,
          help="stop (exit code 3) after this many consecutive restarts without a new "
               "checkpoint or report (default 3; -1: never)")
    flag(launch, "preemption-grace", type=float, default=float(env("PET_PREEMPTION_GRACE", "25")),
          help="on SIGTERM, seconds the workers get to commit a checkpoint before they are "
               "killed (default 25)")
    flag(launch, "max-preemption-failures", type=int,
          default=int(env("PET_MAX_PREEMPTION_FAILURES", "-1")),
          help="restarts after preemptions, not charged to --max-restarts (default -1: "
               "unlimited)")
    flag(launch, "quiet", action="store_true", help="no live status line")
    flag(launch, "verbose", action="store_true",
          help="also show torch.distributed.elastic's agent logs")
    flag(launch, "storage-path", default=env("PET_STORAGE_PATH", DEFAULT_STORAGE_PATH))
    flag(launch, "storage-option", action="append", default=[], metavar="KEY=VALUE",
         help="an fsspec option of the storage (repeatable); credentials among them are "
              "never stored")
    flag(launch, "name", default=env("PET_NAME"),
          help="the run's name (default: the rdzv id with several nodes, else a timestamp)")
    flag(launch, "num-to-keep", type=int, default=None, help="checkpoints to keep")
    flag(launch, "checkpoint-score-attribute", default=None)
    flag(launch, "checkpoint-score-order", default="max", choices=("max", "min"))
    flag(launch, "start-over", action="store_true", help=START_OVER_HELP)


_STREAMS = {"0": set(), "1": {"stdout"}, "2": {"stderr"}, "3": {"stdout", "stderr"}}


def console_streams(redirects: str, tee: str) -> frozenset[str]:
    """Streams shown on the console: those not redirected, plus the teed ones."""
    for flag, value in (("--redirects", redirects), ("--tee", tee)):
        if value not in _STREAMS:
            raise ConfigError(f"{flag}={value!r} is invalid: use 0, 1, 2 or 3.")
    shown = {"stdout", "stderr"} - _STREAMS[redirects] | _STREAMS[tee]
    return frozenset(shown)


def storage_options(pairs: list[str]) -> dict[str, str] | None:
    """``--storage-option KEY=VALUE`` flags as fsspec options."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--storage-option {pair!r}: use KEY=VALUE, e.g. "
                              "--storage-option endpoint_url=http://127.0.0.1:9000")
        options[key] = value
    return options or None


def cmd_launch(args: argparse.Namespace) -> int:
    from elastic_train.driver.launch import LaunchSettings, launch

    settings = LaunchSettings(
        target=args.script, target_args=args.script_args, module=args.module,
        no_python=args.no_python, nnodes=args.nnodes, nproc_per_node=args.nproc_per_node,
        rdzv_backend=args.rdzv_backend, rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id, rdzv_conf=args.rdzv_conf, standalone=args.standalone,
        max_restarts=args.max_restarts, monitor_interval=args.monitor_interval,
        node_rank=args.node_rank, master_addr=args.master_addr, master_port=args.master_port,
        local_addr=args.local_addr, log_dir=args.log_dir,
        local_ranks_filter={int(r) for r in args.local_ranks_filter.split(",") if r} or None,
        verbose=0 if args.quiet else (2 if args.verbose else 1),
        console_streams=console_streams(args.redirects, args.tee),
        hang_timeout_s=args.hang_timeout, preemption_grace_s=args.preemption_grace,
        restart_in_process=not args.no_restart_in_process, unwind_timeout_s=args.unwind_timeout,
        max_restarts_without_progress=args.max_restarts_without_progress,
        max_preemption_failures=args.max_preemption_failures,
        storage_path=args.storage_path, name=args.name,
        storage_options=storage_options(args.storage_option),
        num_to_keep=args.num_to_keep, checkpoint_score_attribute=args.checkpoint_score_attribute,
        checkpoint_score_order=args.checkpoint_score_order,
        start_over=args.start_over,
    )
    return launch(settings, args.launch_argv)


def launch_parser() -> argparse.ArgumentParser:
    """A parser of ``launch ARGV`` alone (what ``restore`` checks and relaunches)."""
    parser = argparse.ArgumentParser(prog="elastic-train")
    add_launch_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def main_launch(argv: list[str]) -> int:
    """``elastic-train launch ARGV`` (what ``restore`` relaunches); exit code 2 on bad input."""
    args = launch_parser().parse_args(["launch", *argv])
    args.launch_argv = argv
    try:
        return args.func(args)
    except (StorageError, ConfigError) as exc:
        print(f"elastic-train: {exc}", file=sys.stderr)
        return 2


