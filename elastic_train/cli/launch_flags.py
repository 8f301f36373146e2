"""What ``elastic-train launch`` adds to torchrun's parser: our flags, and our help texts.

Standard library only: torch's parser is built in :mod:`.launch_parser`,
which hands it to the functions here.
"""

from __future__ import annotations

import argparse
from typing import Any

from elastic_train.config import (
    DEFAULT_STORAGE_PATH,
    CheckpointConfig,
    FailureConfig,
    MetricsConfig,
)
from elastic_train.errors import ConfigError
from elastic_train.stragglers import StragglerConfig

START_OVER_HELP = ("if the run stored under --name cannot be continued (it finished, or its "
                   "script or arguments changed), move it aside to <name>.<status>-<UTC "
                   "time> (nothing is deleted) and start a fresh run; a run that can be "
                   "continued is continued")
EXIT_CODES = ("exit codes: 0 success, 1 the run failed, 2 bad usage or not a run, "
              "3 stopped: restarts brought no progress (--max-restarts-without-progress), "
              "128+N stopped by signal N (130: Ctrl-C)")
DESCRIPTION = (
    "Runs SCRIPT on this node under torch.distributed.elastic, like torchrun: every "
    "torchrun flag and PET_* variable means what it means there. Scripts that call "
    "elastic_train.report()/get_checkpoint() also get checkpoints in --storage-path/--name, "
    "retention and resume; relaunching the same command continues an interrupted run. "
    "Inside a Slurm allocation or a Kubeflow PyTorchJob no flag is needed: the nodes, "
    "workers and rendezvous come from the job (see --dry-run).")
EPILOG = (
    "examples:\n"
    "  elastic-train launch --standalone --nproc-per-node 2 train.py --lr 0.1\n"
    "  elastic-train launch --nnodes 2:4 --nproc-per-node 8 --rdzv-backend etcd \\\n"
    "      --rdzv-endpoint etcd-host:2379 --rdzv-id job42 train.py\n"
    "  srun elastic-train launch train.py          # inside sbatch: the allocation's nodes\n"
    "  elastic-train launch --dry-run train.py     # what would run, and why (JSON)\n"
    "precedence: a flag, then PET_<FLAG> (PET_NPROC_PER_NODE=auto), then the platform "
    "(SLURM_*, Kubeflow), then torchrun's default.\n" + EXIT_CODES)
# Our words for torchrun's flags where we add to their meaning.
HELP = {
    "training_script_args": "the script's own arguments",
    "rdzv_backend": "static (torchrun's default: a fixed set of nodes ranked by --node-rank; "
                    "one node alone gets a local c10d store), c10d, etcd (our handler on "
                    "etcd's v3 API: survives the loss of any node) or etcd-v3 (torch's "
                    "dynamic rendezvous over etcd's v3 API); the elastic ones get our "
                    "fast-recovery defaults (see --rdzv-conf)",
    "rdzv_conf": "k1=v1,k2=v2; our defaults fill in what is not given: last_call_timeout=2, "
                 "join_timeout=600, and for c10d and etcd-v3 keep_alive_interval=1, "
                 "keep_alive_max_attempt=3",
    "rdzv_id": "the job's id, the same on every node (default: the Slurm job id, the "
               "Kubeflow job's name, else torchrun's 'none'); also the run's default --name",
    "max_restarts": "restarts after failures (-1: unlimited; default 0)",
    "log_dir": "per-rank logs (default: the run directory's logs/)",
    "shutdown_timeout": "seconds workers get between a stop signal and SIGKILL (our "
                        "--preemption-grace, default 25)",
    "start_method": "as torchrun: used with --run-path only (spawn: a fresh interpreter per "
                    "worker; fork/forkserver: forked from elastic-train's zygote)",
    "logs_specs": "not supported: elastic-train's console and run logs need torch's default "
                  "log layout (ignored, with a message)",
}


def flag(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """A flag under torchrun's both spellings (--nproc-per-node and --nproc_per_node)."""
    names = [f"--{name}"] + ([f"--{name.replace('-', '_')}"] if "-" in name else [])
    parser.add_argument(*names, **kwargs)


def describe(parser: argparse.ArgumentParser) -> None:
    """Our name, description and help texts on torchrun's parser."""
    parser.prog = "elastic-train launch"
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    for action in parser._actions:
        action.help = HELP.get(action.dest, action.help)


class _PrintCompletion(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        raise ConfigError("--print-completion prints torchrun's completion script; "
                          "elastic-train has none: run torchrun --print-completion instead")


def refuse_print_completion(parser: argparse.ArgumentParser) -> None:
    """torchrun's --print-completion writes a script for the ``torchrun`` command: refused."""
    for action in parser._actions:
        if action.dest == "print_completion":
            parser._handle_conflict_resolve(None, [(o, action) for o in action.option_strings])
    flag(parser, "print-completion", action=_PrintCompletion, nargs="?",
         help=argparse.SUPPRESS)


def add_our_flags(parser: argparse.ArgumentParser) -> None:
    """Ours: spares, hangs, in-process restarts, the no-progress guard, preemption, stragglers,
    the console, metrics, storage, checkpoints, starting over, dry run."""
    ours = parser.add_argument_group("elastic-train (every flag with a value can also be "
                                     "set as PET_<FLAG>)")
    _failure_flags(ours)
    _straggler_flags(ours)
    _console_flags(ours)
    _metrics_flags(ours)
    _storage_flags(ours)
    _run_flags(ours)


def _failure_flags(ours: argparse._ArgumentGroup) -> None:
    """Restarts and their budgets: spares, hangs, in-process restarts, the no-progress
    guard, preemption."""
    flag(ours, "max-failures", type=int, default=None,
         help="Ray-style alias of --max-restarts (give one of them)")
    flag(ours, "spares", type=int, default=0, metavar="N",
         help="hot spares: N more nodes than --nnodes' MAX are started with the same "
              "command; they wait parked and take a lost node's place, so the world size is "
              "kept (needs an elastic --rdzv-backend; default 0)")
    flag(ours, "hang-timeout", type=float, default=None,
         help="restart the job when a worker makes no progress (no report or batch) for "
              "this many seconds")
    flag(ours, "no-restart-in-process", action="store_true",
         help="restart the processes after a failure, even for a script whose main is "
              "wrapped by @elastic_train.restart_in_process")
    defaults = FailureConfig()
    flag(ours, "unwind-timeout", type=float, default=defaults.unwind_timeout_s,
         help="with in-process restarts, seconds a surviving worker may take to leave the "
              f"failed attempt before it is killed and replaced (default "
              f"{defaults.unwind_timeout_s:g})")
    flag(ours, "max-restarts-without-progress", type=int,
         default=defaults.max_restarts_without_progress,
         help="stop (exit code 3) after this many consecutive restarts without a new "
              f"checkpoint or report (default {defaults.max_restarts_without_progress}; "
              "-1: never)")
    flag(ours, "preemption-grace", type=float, default=None,
         help="on SIGTERM, seconds the workers get to commit a checkpoint before they are "
              "killed (default: --shutdown-timeout, else 25)")
    flag(ours, "max-preemption-failures", type=int,
         default=defaults.max_preemption_failures,
         help="restarts after preemptions, not charged to --max-restarts (default -1: "
              "unlimited)")


def _straggler_flags(ours: argparse._ArgumentGroup) -> None:
    """Naming slow nodes, and replacing them with spares."""
    stragglers = StragglerConfig()
    flag(ours, "straggler-threshold", type=float, default=stragglers.score_threshold,
         help="name a node a straggler when its slowest rank's step time is at least this "
              f"many times the job's median (default {stragglers.score_threshold:g})")
    flag(ours, "straggler-window", type=int, default=stragglers.window,
         help="how many reports in a row a node must be that slow before it is named "
              f"(default {stragglers.window})")
    flag(ours, "straggler-min-excess", type=float, default=stragglers.min_excess_s,
         help="and by at least this many seconds per step over the median, so that "
              f"millisecond steps name nobody (default {stragglers.min_excess_s:g})")
    flag(ours, "replace-stragglers", action="store_true",
         help="a node named a straggler leaves the job once a spare waits, and the spare "
              "takes its place (needs --spares)")
    flag(ours, "straggler-cool-off", type=float, default=stragglers.cool_off_s,
         help="with --replace-stragglers, seconds a replaced node is not admitted again "
              f"(default {stragglers.cool_off_s:g})")


def _console_flags(ours: argparse._ArgumentGroup) -> None:
    """What the console shows."""
    flag(ours, "quiet", action="store_true", help="no live status line")
    flag(ours, "verbose", action="store_true",
         help="also show torch.distributed.elastic's agent logs")


def _metrics_flags(ours: argparse._ArgumentGroup) -> None:
    """The metric exporters (docs/observability.md)."""
    metrics = MetricsConfig()
    flag(ours, "metrics-port", type=int, default=None,
         help="serve Prometheus metrics at http://<node>:PORT/metrics from each node "
              "(default: off; needs elastic-train[metrics])")
    flag(ours, "metrics-address", default=metrics.address,
         help="the host name or IP address --metrics-port listens on, without a port "
              f"(default {metrics.address})")
    flag(ours, "otlp-endpoint", default=None, metavar="URL",
         help="push the same metrics over OTLP/HTTP to this OpenTelemetry collector, e.g. "
              "http://collector:4318 (default: off; needs elastic-train[otel])")
    flag(ours, "otlp-interval", type=float, default=metrics.otlp_interval_s,
         help=f"seconds between two OTLP pushes (default {metrics.otlp_interval_s:g})")


def _storage_flags(ours: argparse._ArgumentGroup) -> None:
    """Where the run is stored, and which checkpoints it keeps."""
    flag(ours, "storage-path", default=DEFAULT_STORAGE_PATH,
         help=f"where runs are stored: a path, NFS mount or fsspec URL such as s3://bucket/runs "
              f"(default {DEFAULT_STORAGE_PATH})")
    flag(ours, "storage-option", action="append", default=[], metavar="KEY=VALUE",
         help="an fsspec option of the storage, e.g. endpoint_url=http://minio:9000 "
              "(repeatable; credentials are never stored)")
    flag(ours, "name", default=None,
         help="the run's name (default: the job's id -- Slurm's, Kubeflow's, --rdzv-id -- "
              "with several nodes, else a timestamp)")
    flag(ours, "num-to-keep", type=int, default=None,
         help="checkpoints to keep, the best by --checkpoint-score-attribute (default: "
              "all)")
    flag(ours, "checkpoint-score-attribute", default=None, metavar="METRIC",
         help="a reported metric that ranks checkpoints for --num-to-keep (default: "
              "none, the newest are kept)")
    flag(ours, "checkpoint-score-order", default="max", choices=("max", "min"),
         help="whether a higher (max) or lower (min) --checkpoint-score-attribute is "
              "better (default max)")
    flag(ours, "peer-replicas", type=int, default=CheckpointConfig().peer_replicas,
         help="peer nodes that keep a copy of each node's checkpoint files, for a "
              "replacement node to restore from (default 1; 0: none)")


def _run_flags(ours: argparse._ArgumentGroup) -> None:
    """Starting over, a dry run, tracebacks."""
    flag(ours, "start-over", action="store_true", help=START_OVER_HELP)
    flag(ours, "dry-run", action="store_true",
         help="print the settings this launch would use and where each came from (flag, "
              "PET_*, SLURM_*, Kubeflow, default) as JSON, and start nothing")
    flag(ours, "debug", action="store_true", help="show tracebacks of errors")
