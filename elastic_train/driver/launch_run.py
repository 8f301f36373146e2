"""``elastic-train launch``'s run on this node, and its ``--dry-run`` report.

The node's run is :mod:`.node_run`'s, as for ``fit()``; the workers run the
user's script unchanged, with torchrun's environment. Scripts that call
``elastic_train.report`` / ``get_checkpoint`` get checkpoints, retention and
resume.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from dataclasses import asdict
from typing import Any

from elastic_train._internal.redaction import redact_argv, redacted_options
from elastic_train._internal.rendezvous_backends import lookup
from elastic_train.agent.api import Interrupted
from elastic_train.driver.launch_settings import LaunchSettings
from elastic_train.driver.node_run import FailureHints, NodePlan, NodeRun
from elastic_train.errors import TrainingFailedError, exit_code
from elastic_train.storage import RunStorage
from elastic_train.storage.filesystem import options_from_flags
from elastic_train.worker.worker_plan import GivenStorage

# Flags the command that continues a run leaves out or sets itself.
_ONE_LAUNCH_ONLY = ("--start-over", "--start_over", "--dry-run", "--dry_run")
_SET_AGAIN = ("--name", "--storage-path", "--storage_path", "--storage-option",
              "--storage_option")


def _without(argv: list[str], switches: tuple[str, ...], valued: tuple[str, ...]) -> list[str]:
    """``argv`` without the ``switches`` and without the ``valued`` flags and their values
    (``--name x`` and ``--name=x``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in valued:
            skip = True
        elif arg not in switches and arg.partition("=")[0] not in valued:
            out.append(arg)
    return out


def continuing_command(settings: LaunchSettings, argv: list[str]) -> list[str]:
    """The command that continues this run: the same flags, with the name and storage
    made explicit (once), without --start-over (which applies to one launch only), and
    every secret redacted (it is stored and printed; ``restore`` asks for the redacted
    ones again). The program's own arguments are the user's: kept as given (a resume
    compares them)."""
    own = len(argv) - len(settings.target_args)
    flags = _without(argv[:own], _ONE_LAUNCH_ONLY, _SET_AGAIN)
    options = redacted_options(options_from_flags(settings.storage_option) or {})
    explicit = ["--name", settings.run_config.name, "--storage-path", settings.storage_path]
    for key, value in options.items():
        explicit += ["--storage-option", f"{key}={value}"]
    return ["elastic-train", "launch", *explicit, *redact_argv(flags), *argv[own:]]


def report(settings: LaunchSettings) -> dict[str, Any]:
    """``--dry-run``: the settings this launch would use, each with where it came from."""
    rdzv = settings.rendezvous
    single = rdzv.is_local and not settings.rdzv_endpoint
    static = not rdzv.is_elastic

    def entry(value: Any, source: str) -> dict[str, Any]:
        return {"value": value, "source": source}

    nodes = f"{settings.min_nodes}:{settings.max_nodes}" \
        if settings.min_nodes < settings.max_nodes else settings.min_nodes
    local = "default (one node: a local c10d store, as torchrun)"
    endpoint_source = settings.source("rdzv_endpoint") if settings.rdzv_endpoint or not static \
        else f"{settings.source('master_addr')}, {settings.source('master_port')}"
    return {
        "nnodes": entry(nodes, settings.source("nnodes")),
        "nproc_per_node": {**entry(settings.workers_per_node, settings.source("nproc_per_node")),
                           "given": settings.nproc_per_node},
        "spares": entry(settings.spares, settings.source("spares")),
        "rdzv_backend": entry(rdzv.backend, local if single else settings.source("rdzv_backend")),
        "rdzv_endpoint": entry(rdzv.endpoint, local if single else endpoint_source),
        "rdzv_id": entry(rdzv.run_id, local if single else settings.source("rdzv_id")),
        "rdzv_conf": entry(rdzv.without_secrets().conf, settings.source("rdzv_conf")),
        "node_rank": entry(settings.node_rank, settings.source("node_rank")) if static
        else entry(None, "assigned at each rendezvous"),
        "max_restarts": entry(settings.max_restarts, settings.source("max_restarts")),
        "storage_path": entry(settings.storage_path, settings.source("storage_path")),
        "name": entry(settings.run_config.name, settings.name_source),
        "program": entry(settings.identity(), settings.mode),
        "notes": settings.notes,
    }


def launch(settings: LaunchSettings, argv: list[str]) -> int:
    """Runs this node's part of the job. Returns the process exit code.

    ``argv``: the arguments after ``launch``, stored as the command that continues
    the run.
    """
    for note in settings.notes:
        print(f"elastic-train: {note}", file=sys.stderr)
    command = continuing_command(settings, argv)
    run_config = settings.run_config
    plan = NodePlan(
        storage=RunStorage.for_run(run_config, run_config.name), run_config=run_config,
        scaling=settings.scaling, rendezvous=settings.rendezvous,
        spec={"command": command, "cwd": os.getcwd(), "identity": settings.identity(),
              "launch": settings.flags(), "checkpoint_config": asdict(settings.checkpoint)},
        hints=FailureHints(resume=f"run the same command again: {shlex.join(command)}",
                           retry="pass --max-restarts N (or -1 for unlimited)",
                           no_guard="pass --max-restarts-without-progress -1"),
        view=settings.view, process=settings.process, log_dir=settings.log_dir,
        monitor_interval=settings.monitor_interval, local_addr=settings.local_addr,
        user_code=(os.path.dirname(os.path.abspath(settings.target)),)
        if settings.mode == "script" else ())
    if lookup(settings.rendezvous.backend, "--rdzv-backend").reuses_store:
        # Scripts join their process group through env://; torch's dynamic handler
        # hands every round the same store, which serves stale addresses to a
        # restarted gloo group. Unshared, each incarnation gets a fresh store on rank 0.
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    with NodeRun(plan) as node:
        # The storage as given, with its options: the workers' environment, never stored.
        worker_env = GivenStorage(settings.storage_path, run_config.storage_options).env()
        if settings.workers_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
            worker_env["OMP_NUM_THREADS"] = "1"  # as torchrun does
        try:
            node.run(*settings.worker_command(), worker_env)
        except Interrupted as exc:
            print(f"elastic-train: stopped by {signal.Signals(exc.signum).name}; resume with: "
                  f"{shlex.join(command)}", file=sys.stderr)
            return 128 + exc.signum
        except TrainingFailedError as exc:  # the budget is spent, or the rendezvous lost
            print(f"elastic-train: {exc}", file=sys.stderr)
            return exit_code(exc)
    return 0
