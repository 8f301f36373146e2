"""The ``elastic-train`` command: list runs and show one run's state.

    elastic-train ls [STORAGE_PATH]        runs under a storage path (~/elastic_train_results)
    elastic-train show RUN_PATH [--json]   a run's status, failures and checkpoints
    elastic-train restore RUN_PATH [--start-over]   continue an interrupted or failed run
    elastic-train launch [torchrun flags] SCRIPT [ARGS]   run a script on this node, as torchrun

Exit codes: 0 success, 1 the run failed, 2 bad usage or a path that is not a run,
130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shlex
import sys
import time
from typing import Any

from elastic_train import __version__
from elastic_train.cli.run_summary import RunSummary
from elastic_train.config import DEFAULT_STORAGE_PATH, CheckpointConfig
from elastic_train.errors import ConfigError, StorageError, TrainingFailedError
from elastic_train.metric_rows import user_metrics
from elastic_train.storage import RunStorage
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.checkpoint_store import dir_name

START_OVER_HELP = ("if the run stored under --name cannot be continued (it finished, or its "
                   "script or arguments changed), move it aside to <name>.<status>-<UTC "
                   "time> (nothing is deleted) and start a fresh run; a run that can be "
                   "continued is continued")
EXIT_CODES = ("exit codes: 0 success, 1 the run failed, 2 bad usage or not a run, "
              "128+N stopped by signal N (130: Ctrl-C)")


def _when(timestamp: float | None) -> str:
    if not timestamp:
        return "-"
    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def _age(timestamp: float | None, now: float) -> str:
    """``"42s"``, ``"5m"``, ``"3h"``, ``"2d"``: how long ago."""
    if not timestamp:
        return "-"
    seconds = max(0, int(now - timestamp))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _runs(storage_path: str) -> list[tuple[str, RunStorage, dict]]:
    fs, root = fsutil.resolve(storage_path)
    try:
        entries = fs.ls(root, detail=True)
    except FileNotFoundError:
        return []
    runs = []
    for entry in entries:
        if entry["type"] != "directory":
            continue
        storage = RunStorage(fs, entry["name"])
        state = storage.read_run_state()
        if state is not None:
            runs.append((entry["name"].rstrip("/").rsplit("/", 1)[-1], storage, state))
    return sorted(runs, key=lambda r: r[2].get("created", 0))


def cmd_ls(args: argparse.Namespace) -> int:
    runs = [(name, state, RunSummary.read(storage, state))
            for name, storage, state in _runs(args.storage_path)]
    if args.json:
        print(json.dumps([{"name": name, **state, "iterations": summary.iterations,
                           "best_checkpoint": summary.best and dir_name(summary.best.index)}
                          for name, state, summary in runs], indent=2))
        return 0
    if not runs:
        print(f"No runs under {args.storage_path}")
        return 0
    now = time.time()
    print(f"{'NAME':32} {'STATUS':11} {'ITER':>6} {'FAILURES':>8}  {'AGE':>5}  BEST")
    for name, state, summary in runs:
        print(f"{name:32} {state.get('status', '?'):11} {summary.iterations:>6} "
              f"{len(state.get('failures', [])):>8}  {_age(state.get('updated'), now):>5}  "
              f"{summary.best_label()}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    fs, path = fsutil.resolve(args.run_path)
    storage = RunStorage(fs, path)
    state = storage.read_run_state()
    if state is None:
        print(f"{args.run_path} is not a run directory (no run.json).", file=sys.stderr)
        return 2
    summary = RunSummary.read(storage, state)
    best = summary.best.index if summary.best else None
    if args.json:
        print(json.dumps({**state, "iterations": summary.iterations,
                          "goodput": summary.goodput, "recoveries": summary.recoveries,
                          "checkpoints": [
            {"index": c.index, "training_iteration": c.training_iteration,
             "metrics": c.metrics, "best": c.index == best} for c in summary.checkpoints],
            "deleted_checkpoints": summary.deleted}, indent=2))
        return 0
    spec = state.get("spec", {})
    print(f"run:      {storage.display_path}")
    print(f"status:   {state.get('status')}   updated {_when(state.get('updated'))}   "
          f"iteration {summary.iterations}")
    if spec.get("command"):
        print(f"command:  {shlex.join(spec['command'])}")
    if spec.get("train_function"):
        workers = spec.get("scaling_config", {}).get("num_workers")
        print(f"train:    {spec['train_function']} on {workers} worker(s)")
    for key in ("failure_config", "checkpoint_config"):
        if spec.get(key):
            print(f"{key.split('_')[0] + ':':9} {spec[key]}")
    launches = state.get("launches", [])
    print(f"launches: {len(launches)}")
    for launch in launches:
        print(f"  {_when(launch.get('started'))}  {launch.get('host', '?')}  "
              f"pid {launch.get('pid')}  {launch.get('status')}")
    print(f"failures: {len(state.get('failures', []))}")
    for failure, recovery in zip(state.get("failures", []), summary.recoveries, strict=True):
        root = failure["workers"][0]
        how = f"signal {root['signal']}" if root.get("signal") else f"exit code {root['exitcode']}"
        print(f"  {_when(failure['time'])}  [{failure.get('kind', 'failure')}] rank "
              f"{root['rank']} {how}: {root['message'][:100]}")
        print(f"      {_recovery_line(recovery)}")
    if summary.goodput is not None:
        print(f"goodput:  {summary.goodput:.1%}  ({summary.train_s:.1f} s of training kept, "
              f"{summary.wall_s:.1f} s wall clock over all launches, "
              f"{summary.redone_s:.1f} s redone after failures)")
    print(f"checkpoints: {len(summary.checkpoints)} retained, {len(summary.deleted)} deleted "
          "by retention")
    for c in summary.checkpoints:
        shown = user_metrics(c.metrics)
        mark = "*" if c.index == best else " "
        print(f"{mark} {dir_name(c.index)}  iteration {c.training_iteration}  {shown}")
    if best is not None:
        print(f"  (* best: {summary.best_label()})")
    if summary.deleted:
        print(f"  deleted: {', '.join(summary.deleted)}")
    print(f"logs:     {fsutil.display_path(fs, storage.log_dir())}")
    return 0


def _recovery_line(recovery: dict) -> str:
    def sec(key: str) -> str:
        return "?" if recovery[key] is None else f"{recovery[key]:.1f} s"

    redone = ("?" if recovery["recomputed_iterations"] is None else
              f"{recovery['recomputed_iterations']} iteration(s), {sec('recomputed_s')}")
    return (f"recovery: detected in {sec('detect_s')}, rendezvous {sec('rendezvous_s')}, "
            f"ready {sec('restore_s')}; redone {redone}")


def _options(pairs: list[str]) -> dict[str, str] | None:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--storage-option {pair!r}: use KEY=VALUE, e.g. "
                              "--storage-option endpoint_url=http://127.0.0.1:9000")
        options[key] = value
    return options or None


def cmd_restore(args: argparse.Namespace) -> int:
    from elastic_train.torch import TorchTrainer

    options = _options(args.storage_option)
    fs, path = fsutil.resolve(args.run_path, options=options)
    storage = RunStorage(fs, path)
    state = storage.read_run_state() or {}
    finished = state.get("status") == "finished" and not args.start_over
    command = state.get("spec", {}).get("command")
    if command and not finished:  # a run of `elastic-train launch`
        if args.start_over:
            command = [*command[:2], "--start-over", *command[2:]]
        print(f"elastic-train: relaunching {shlex.join(command)}", file=sys.stderr)
        cwd = state["spec"].get("cwd", os.getcwd())
        if os.path.isdir(cwd):
            os.chdir(cwd)
        else:  # another machine: the script's relative path must resolve from here
            print(f"elastic-train: {cwd} does not exist here; relaunching from "
                  f"{os.getcwd()}", file=sys.stderr)
        return main(command[1:])
    if finished or not (state and storage.has_trainable()):
        why = ("its run has already finished: pass --start-over to move it aside and train "
               "it again from scratch" if finished else "it is not a run directory")
        print(f"{args.run_path} cannot be restored: {why} (see `elastic-train show`).",
              file=sys.stderr)
        return 2
    try:
        trainer = TorchTrainer.restore(args.run_path, storage_options=options)
        trainer.run_config = dataclasses.replace(trainer.run_config,
                                                 start_over=args.start_over)
        result = trainer.fit()
    except TrainingFailedError as exc:
        print(f"elastic-train: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print(f"finished: {result.path}  iteration {result.metrics.get('training_iteration')}")
    return 0


def _flag(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """A flag under torchrun's both spellings (--nproc-per-node and --nproc_per_node)."""
    names = [f"--{name}"] + ([f"--{name.replace('-', '_')}"] if "-" in name else [])
    parser.add_argument(*names, **kwargs)


def add_launch_parser(sub: Any) -> None:
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
    env = os.environ.get
    _flag(launch, "nnodes", default=env("PET_NNODES", "1"), help="N or MIN:MAX (default 1)")
    _flag(launch, "nproc-per-node", type=int, default=int(env("PET_NPROC_PER_NODE", "1")))
    _flag(launch, "rdzv-backend", default=env("PET_RDZV_BACKEND", "c10d"),
          help="c10d (default), static, or etcd / etcd-v3 (etcd's v3 API)")
    _flag(launch, "rdzv-endpoint", default=env("PET_RDZV_ENDPOINT", ""))
    _flag(launch, "rdzv-id", default=env("PET_RDZV_ID"),
          help="the job's id, the same on every node (required with several nodes)")
    _flag(launch, "rdzv-conf", default=env("PET_RDZV_CONF", ""), help="k1=v1,k2=v2")
    _flag(launch, "standalone", action="store_true", help="single node, local rendezvous")
    _flag(launch, "max-restarts", type=int, default=int(env("PET_MAX_RESTARTS", "0")),
          help="restarts after failures (-1: unlimited)")
    _flag(launch, "max-failures", type=int, dest="max_restarts",
          help="Ray-style alias of --max-restarts")
    _flag(launch, "hang-timeout", type=float, default=None,
          help="restart the job when a worker makes no progress (no report or batch) for "
               "this many seconds")
    _flag(launch, "preemption-grace", type=float, default=float(env("PET_PREEMPTION_GRACE", "25")),
          help="on SIGTERM, seconds the workers get to commit a checkpoint before they are "
               "killed (default 25)")
    _flag(launch, "max-preemption-failures", type=int,
          default=int(env("PET_MAX_PREEMPTION_FAILURES", "-1")),
          help="restarts after preemptions, not charged to --max-restarts (default -1: "
               "unlimited)")
    _flag(launch, "monitor-interval", type=float,
          default=float(env("PET_MONITOR_INTERVAL", "0.1")))
    _flag(launch, "node-rank", type=int, default=int(env("PET_NODE_RANK", "0")),
          help="this node's rank (static rendezvous)")
    _flag(launch, "master-addr", default=env("PET_MASTER_ADDR", "127.0.0.1"))
    _flag(launch, "master-port", type=int, default=int(env("PET_MASTER_PORT", "29500")))
    _flag(launch, "local-addr", default=env("PET_LOCAL_ADDR"))
    _flag(launch, "log-dir", default=env("PET_LOG_DIR"),
          help="per-rank logs (default: the run directory's logs/)")
    _flag(launch, "local-ranks-filter", default=env("PET_LOCAL_RANKS_FILTER", ""),
          help="show only these local ranks' output on the console, e.g. 0 or 0,1 "
               "(the log files keep every rank's)")
    _flag(launch, "redirects", default=env("PET_REDIRECTS", "0"),
          help="as torchrun: streams to send only to the log files (0 none, 1 stdout, "
               "2 stderr, 3 both)")
    _flag(launch, "tee", default=env("PET_TEE", "3"),
          help="as torchrun: redirected streams also shown on the console (default 3)")
    _flag(launch, "quiet", action="store_true", help="no live status line")
    _flag(launch, "verbose", action="store_true",
          help="also show torch.distributed.elastic's agent logs")
    _flag(launch, "storage-path", default=env("PET_STORAGE_PATH", DEFAULT_STORAGE_PATH))
    _flag(launch, "name", default=env("PET_NAME"),
          help="the run's name (default: the rdzv id with several nodes, else a timestamp)")
    _flag(launch, "num-to-keep", type=int, default=None, help="checkpoints to keep")
    _flag(launch, "checkpoint-score-attribute", default=None)
    _flag(launch, "checkpoint-score-order", default="max", choices=("max", "min"))
    _flag(launch, "start-over", action="store_true", help=START_OVER_HELP)
    launch.add_argument("-m", "--module", action="store_true", help="run SCRIPT as a module")
    _flag(launch, "no-python", action="store_true", help="run SCRIPT as a program")
    launch.add_argument("script")
    launch.add_argument("script_args", nargs=argparse.REMAINDER)
    launch.set_defaults(func=cmd_launch)


_STREAMS = {"0": set(), "1": {"stdout"}, "2": {"stderr"}, "3": {"stdout", "stderr"}}


def console_streams(redirects: str, tee: str) -> frozenset[str]:
    """Streams shown on the console: those not redirected, plus the teed ones."""
    for flag, value in (("--redirects", redirects), ("--tee", tee)):
        if value not in _STREAMS:
            raise ConfigError(f"{flag}={value!r} is invalid: use 0, 1, 2 or 3.")
    shown = {"stdout", "stderr"} - _STREAMS[redirects] | _STREAMS[tee]
    return frozenset(shown)


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
        max_preemption_failures=args.max_preemption_failures,
        storage_path=args.storage_path, name=args.name,
        checkpoint=CheckpointConfig(num_to_keep=args.num_to_keep,
                                    checkpoint_score_attribute=args.checkpoint_score_attribute,
                                    checkpoint_score_order=args.checkpoint_score_order),
        start_over=args.start_over,
    )
    return launch(settings, args.argv[args.argv.index("launch") + 1:])


def cmd_verify_resume(args: argparse.Namespace) -> int:
    from elastic_train.cli.verify_resume import verify

    if args.fail_at_report < 1:
        raise ConfigError(f"--fail-at-report={args.fail_at_report} is invalid: use >= 1.")
    verdict = verify([args.script, *args.script_args], args.nproc_per_node,
                     args.fail_at_report, args.workdir)
    print(verdict.describe())
    return 0 if verdict.identical and verdict.resumed else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elastic-train", description=__doc__.splitlines()[0], epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"elastic-train {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("ls", help="list runs under a storage path",
                        epilog="examples:\n  elastic-train ls\n  elastic-train ls "
                               "s3://bucket/experiments --json\n" + EXIT_CODES,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ls.add_argument("storage_path", nargs="?", default=DEFAULT_STORAGE_PATH)
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=cmd_ls)
    show = sub.add_parser("show", help="show one run",
                          epilog="examples:\n  elastic-train show "
                                 "~/elastic_train_results/digits\n  elastic-train show "
                                 "s3://bucket/experiments/resnet --json\n" + EXIT_CODES,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    show.add_argument("run_path")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=cmd_show)
    restore = sub.add_parser("restore", help="continue an interrupted or failed run",
                             epilog="example: elastic-train restore "
                                    "~/elastic_train_results/run1\n" + EXIT_CODES,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    restore.add_argument("run_path")
    restore.add_argument("--start-over", action="store_true",
                         help="train a finished run (or one that cannot be continued) again "
                              "from scratch with its stored settings, after moving it aside "
                              "to <run_path>.<status>-<UTC time> (nothing is deleted)")
    restore.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                         help="an fsspec option of the storage (repeatable); credentials "
                              "are never stored, so pass them again here or in the "
                              "environment")
    restore.set_defaults(func=cmd_restore)
    add_launch_parser(sub)
    verify = sub.add_parser(
        "verify-resume", help="check that a launch script resumes bit-identically",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Runs SCRIPT twice with elastic-train launch: straight through, and with "
                    "a worker killed after its K-th report() and restarted from the latest "
                    "checkpoint; then compares the final checkpoints file by file.",
        epilog="example:\n  elastic-train verify-resume --nproc-per-node 2 --fail-at-report 3 "
               "train.py --epochs 5\nexit codes: 0 identical, 1 different or inconclusive, "
               "2 bad usage")
    _flag(verify, "nproc-per-node", type=int, default=2)
    _flag(verify, "fail-at-report", type=int, default=2,
          help="kill a worker right after this report() (default 2)")
    _flag(verify, "workdir", default=None,
          help="where both runs are stored (default: a new temporary directory)")
    verify.add_argument("script")
    verify.add_argument("script_args", nargs=argparse.REMAINDER)
    verify.set_defaults(func=cmd_verify_resume)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        return args.func(args)
    except (StorageError, ConfigError) as exc:
        print(f"elastic-train: {exc}", file=sys.stderr)
        return 2

