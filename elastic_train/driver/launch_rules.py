"""torchrun's rules for its flags, each a small function of the values given.

:class:`~elastic_train.driver.launch.LaunchSettings` applies them; each
``source`` argument is where the value came from (``"--nnodes"``,
``"PET_NNODES"``, ``"SLURM_JOB_NUM_NODES"``), so a ConfigError names it.
Where torchrun has a rule we keep its rule (the single-node static job gets
a local c10d store; ``--nproc-per-node auto``; ``-r 0:1,1:2``); where we
differ, the docstring says why.

Errors in launch's terms: the configs check every value and name the field at
fault in API terms (``CheckpointConfig.num_to_keep=0 is invalid: use an integer
>= 1, or None to keep every checkpoint``); a ``launch`` user gave a flag, not a
field, and cannot pass None. :data:`FIELD_SETTINGS` is the one table from a config
field to the launch setting that feeds it; :func:`in_flag_terms` rewrites a message
with it: the field becomes the flag (or the variable the value came from),
``XConfig(field=...)`` the flag, and ``None`` "omit the flag"."""

from __future__ import annotations

import importlib.machinery
import os
import re
import shutil
import signal
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from elastic_train._internal import devices
from elastic_train.driver.console import BOTH, ConsoleView
from elastic_train.errors import ConfigError

if TYPE_CHECKING:
    from elastic_train.driver.launch_settings import LaunchSettings

_STREAMS = {"0": frozenset(), "1": frozenset({"stdout"}), "2": frozenset({"stderr"}),
            "3": BOTH}


def parse_nnodes(value: str, source: str) -> tuple[int, int]:
    """``"2"`` -> (2, 2); ``"1:4"`` -> (1, 4)."""
    try:
        low, _, high = value.partition(":")
        bounds = (int(low), int(high or low))
    except ValueError:
        bounds = (0, 0)
    if not 1 <= bounds[0] <= bounds[1]:
        raise ConfigError(f"{source}={value!r} is invalid: use N or MIN:MAX with "
                          "1 <= MIN <= MAX, e.g. --nnodes 2 or --nnodes 1:4.")
    return bounds


def local_world_size(value: str, source: str) -> int:
    """Workers on this node, as torchrun counts them: a number, ``cpu`` (the CPUs this
    process may use), ``gpu`` / ``xpu`` (that many devices; an error without any), or
    ``auto`` (the accelerators if there are any, else the CPUs)."""
    if value.lstrip("-").isdigit():
        if int(value) < 1:
            raise ConfigError(f"{source}={value} is invalid: use >= 1, or auto, cpu, gpu "
                              "or xpu.")
        return int(value)
    if value not in ("auto", "cpu", "gpu", "xpu"):
        raise ConfigError(f"{source}={value!r} is invalid: use a number >= 1, or auto, cpu, "
                          "gpu or xpu.")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    if value == "cpu":
        return cpus
    if value == "auto":
        return devices.count("accelerator") or cpus
    found = devices.count("cuda" if value == "gpu" else "xpu")
    if not found:
        raise ConfigError(f"{source}={value} needs a {value.upper()}, and this node has "
                          "none: use auto, cpu or a number.")
    return found


def _std(value: str, source: str) -> dict[int, frozenset[str]] | frozenset[str]:
    """torchrun's ``-r``/``-t`` value: ``"3"`` for every local rank, or ``"0:1,1:2"``."""
    if value in _STREAMS:
        return _STREAMS[value]
    per_rank: dict[int, frozenset[str]] = {}
    for item in value.split(","):
        rank, _, std = item.partition(":")
        if not rank.strip().isdigit() or std not in _STREAMS:
            raise ConfigError(f"{source}={value!r} is invalid: use 0 (none), 1 (stdout), "
                              "2 (stderr) or 3 (both) for every rank, or LOCAL_RANK:N pairs "
                              "such as 0:1,1:2.")
        per_rank[int(rank)] = _STREAMS[std]
    return per_rank


def _for_rank(std: dict[int, frozenset[str]] | frozenset[str], rank: int) -> frozenset[str]:
    return std.get(rank, frozenset()) if isinstance(std, dict) else std


def local_ranks(value: str, source: str) -> frozenset[int] | None:
    """``--local-ranks-filter 0,1`` -> {0, 1}; empty: every rank."""
    if not value:
        return None
    items = value.split(",")
    if not all(item.strip().isdigit() for item in items):
        raise ConfigError(f"{source}={value!r} is invalid: use local ranks separated by "
                          "commas, e.g. 0 or 0,1.")
    return frozenset(int(item) for item in items)


def console_view(values: Mapping[str, str], sources: Mapping[str, str], role: str,
                 nproc: int) -> ConsoleView:
    """What the console shows: for each local rank, the streams not redirected to the log
    files only (``-r``) plus those teed (``-t``); the ranks ``--local-ranks-filter`` keeps;
    each line prefixed per ``--log-line-prefix-template`` (or
    ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``, as torchrun). Every rank's output is always
    in its log files."""
    redirects = _std(values["redirects"], sources["redirects"])
    tee = _std(values["tee"], sources["tee"])
    shown = {rank: BOTH - _for_rank(redirects, rank) | _for_rank(tee, rank)
             for rank in range(nproc)}
    template = values["log_line_prefix_template"] \
        or os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE") or None
    return ConsoleView(local_ranks=local_ranks(values["local_ranks_filter"],
                                               sources["local_ranks_filter"]),
                       streams_by_rank=shown, prefix_template=template, role=role)


def signal_names(value: str, source: str) -> str:
    """``--signals-to-handle``: signal names separated by commas, each one this system has."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [n for n in names if not isinstance(getattr(signal, n, None), signal.Signals)]
    if unknown or not names:
        raise ConfigError(f"{source}={value!r} is invalid: use signal names separated by "
                          "commas, e.g. SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1.")
    return ",".join(names)


def endpoint_name(endpoint: str) -> str:
    """A run name from a static job's master endpoint (``static-node0-29500``): the one
    thing every node of such a job shares when it was given no id."""
    return "static-" + re.sub(r"[^A-Za-z0-9._-]+", "-", endpoint).strip("-")


def check_program(settings: LaunchSettings) -> None:
    """The program must exist before any process starts (torch would fail later)."""
    s = settings
    if s.module and s.no_python and not s.run_path:  # torchrun refuses it too
        raise ConfigError(f"{s.named('module')} and {s.named('no_python')} cannot be used "
                          "together (-m runs a Python module, --no-python a program): drop "
                          "one of them.")
    if s.mode == "program" and shutil.which(s.target) is None:
        raise ConfigError(f"--no-python program {s.target!r} was not found or is not "
                          "executable: pass a program on PATH or the path of an executable "
                          "file.")
    if s.mode == "script" and os.path.isdir(s.target):
        raise ConfigError(f"The training script {s.target!r} is a directory: pass the script "
                          f"in it ({os.path.join(s.target, 'train.py')}, say), or -m "
                          "MODULE to run a package's __main__.")
    if s.mode == "script" and not os.path.isfile(s.target):
        raise ConfigError(f"The training script {s.target!r} does not exist. Pass a script "
                          "path, or -m MODULE, or --no-python PROGRAM.")
    if s.mode == "script":
        _check_compiles(s.target)
    if s.mode == "module":
        _check_module(s.target)


def _check_compiles(script: str) -> None:
    """A script that Python cannot compile would fail in every worker, each with its
    traceback: said once, before any process starts."""
    try:
        with open(script, "rb") as f:
            compile(f.read(), script, "exec", dont_inherit=True)
    except SyntaxError as exc:  # (an IndentationError is one)
        raise ConfigError(f"The training script {script!r} has a syntax error at line "
                          f"{exc.lineno}: {exc.msg}. Fix it, then launch again.") from None
    except (OSError, ValueError) as exc:  # unreadable, or a null byte
        raise ConfigError(f"The training script {script!r} cannot be read as Python "
                          f"({exc}): pass a Python script, or --no-python PROGRAM.") from None


def _check_module(module: str) -> None:
    """-m MODULE: its top-level package must be importable where the workers look (the
    current directory first, as ``python -m``), without importing anything."""
    top = module.split(".")[0]
    if top and importlib.machinery.PathFinder.find_spec(top, [os.getcwd(), *sys.path]):
        return
    if top in sys.builtin_module_names:
        return
    raise ConfigError(f"-m {module}: no module named {top!r} in {os.getcwd()} or on the "
                      "Python path: run launch from the directory that holds it, or add its "
                      "directory to PYTHONPATH.")


def check_static_job(settings: LaunchSettings) -> None:
    """A static job is a fixed set of ranked nodes (torch's static rendezvous waits for
    MAX nodes and never shrinks, so a MIN:MAX would mislead)."""
    s = settings
    if s.min_nodes < s.max_nodes:
        raise ConfigError(f"{s.named('nnodes')}={s.nnodes!r} is a range, but the static "
                          "rendezvous (torchrun's default backend) needs a fixed number of "
                          "nodes: pass --nnodes N, or --rdzv-backend c10d (or etcd) with "
                          "--rdzv-endpoint and --rdzv-id for an elastic job.")
    if not 0 <= s.node_rank < s.max_nodes:
        raise ConfigError(f"{s.named('node_rank')}={s.node_rank} is invalid: with "
                          f"{s.named('nnodes')}={s.nnodes} use 0 to {s.max_nodes - 1}, "
                          "a different rank on every node.")


def unsupported(settings: LaunchSettings) -> list[str]:
    """One line for each torchrun flag given that we do not honour."""
    s, notes = settings, []
    if s.logs_specs:
        notes.append(f"{s.named('logs_specs')} {s.logs_specs} is not supported (the console "
                     "and run logs need torch's default log layout); ignored.")
    for stream in ("stdout", "stderr"):
        if getattr(s, f"duplicate_{stream}_filters"):
            notes.append(f"{s.named(f'duplicate_{stream}_filters')} is not supported; "
                         f"ignored: every rank's {stream} is in the run's logs/ (grep there).")
    return notes


def standalone_notes(settings: LaunchSettings) -> list[str]:
    """--standalone runs this node alone on a local c10d store, as torchrun's: the
    node count and rendezvous given beside it are ignored, said in one note (its
    --rdzv-conf is kept, as torchrun keeps it)."""
    s = settings
    ignored = [f"{s.named(name)}={getattr(s, name)}" for name in
               ("nnodes", "rdzv_backend", "rdzv_endpoint", "rdzv_id")
               if s.source(name) != "default"]
    if not s.standalone or not ignored:
        return []
    return [f"{s.named('standalone')} runs this node alone on a local c10d store, as "
            f"torchrun: {', '.join(ignored)} ignored (drop --standalone for a job across "
            "nodes)."]


def restart_budget(settings: LaunchSettings) -> tuple[int, str]:
    """The restarts after failures and where they came from: --max-restarts or its
    Ray-style alias --max-failures. Both given with different values are refused
    (argparse would keep the later one silently)."""
    s = settings
    if s.max_failures is None:
        return s.max_restarts, s.source("max_restarts")
    if s.source("max_restarts") != "default" and s.max_restarts != s.max_failures:
        raise ConfigError(f"{s.named('max_restarts')} {s.max_restarts} and "
                          f"{s.named('max_failures')} {s.max_failures} disagree: --max-failures "
                          "is an alias of --max-restarts; give one of them.")
    return s.max_failures, s.source("max_failures")


def verbosity(settings: LaunchSettings) -> int:
    """``RunConfig.verbose``: 0 with --quiet, 2 with --verbose, else 1; both: refused."""
    s = settings
    if s.quiet and s.verbose:
        raise ConfigError("--quiet (no live status line) and --verbose (the agent's logs "
                          "too) contradict each other: give one of them.")
    return 0 if s.quiet else (2 if s.verbose else 1)


# Config field -> the launch setting (its flag: --name-with-dashes) that feeds it.
FIELD_SETTINGS = {
    "ScalingConfig.num_workers_per_node": "nproc_per_node",
    "ScalingConfig.spare_nodes": "spares",
    "FailureConfig.max_failures": "max_restarts",
    "FailureConfig.hang_timeout_s": "hang_timeout",
    "FailureConfig.max_preemption_failures": "max_preemption_failures",
    "FailureConfig.unwind_timeout_s": "unwind_timeout",
    "FailureConfig.max_restarts_without_progress": "max_restarts_without_progress",
    "StragglerConfig.score_threshold": "straggler_threshold",
    "StragglerConfig.window": "straggler_window",
    "StragglerConfig.min_excess_s": "straggler_min_excess",
    "StragglerConfig.replace": "replace_stragglers",
    "StragglerConfig.cool_off_s": "straggler_cool_off",
    "CheckpointConfig.num_to_keep": "num_to_keep",
    "CheckpointConfig.checkpoint_score_attribute": "checkpoint_score_attribute",
    "CheckpointConfig.checkpoint_score_order": "checkpoint_score_order",
    "CheckpointConfig.peer_replicas": "peer_replicas",
    "MetricsConfig.port": "metrics_port",
    "MetricsConfig.address": "metrics_address",
    "MetricsConfig.otlp_endpoint": "otlp_endpoint",
    "MetricsConfig.otlp_interval_s": "otlp_interval",
    "RunConfig.name": "name",
    "RunConfig.storage_path": "storage_path",
    "RendezvousConfig.backend": "rdzv_backend",
}

_FIELD = re.compile(r"\b([A-Z]\w*Config)\.(\w+)")  # FailureConfig.max_failures
_CALL = re.compile(r"\b([A-Z]\w*Config)\(([^()]*)\)")  # RunConfig(name=..., ...)
_ARGUMENT = re.compile(r"(\w+)=('[^']*'|[^,]*)")


def flag_name(setting: str) -> str:
    """A launch setting's flag: ``num_to_keep`` -> ``--num-to-keep``."""
    return "--" + setting.replace("_", "-")


def in_flag_terms(message: str, flags: Mapping[str, str] | None = None,
                  field: str | None = None) -> str:
    """``message`` with the config fields named by their flags: ``flags`` maps a field
    to its flag, or to the variable its value came from (default: :data:`FIELD_SETTINGS`'
    flags). A call such as ``RunConfig(storage_path=...)`` becomes its flags
    (``--storage-path``), one with a value an example (``--name resnet``); ``field``'s
    "None" becomes "omit <flag>". Fields without a flag are left as they are."""
    if flags is None:
        flags = {f: flag_name(setting) for f, setting in FIELD_SETTINGS.items()}
    classes = {key.split(".")[0] for key in flags}

    def field_sub(match: re.Match[str]) -> str:
        return flags.get(f"{match[1]}.{match[2]}", match[0])

    def call_sub(match: re.Match[str]) -> str:
        owner = match[1]
        if owner not in classes:
            return match[0]
        said = []
        for name, value in _ARGUMENT.findall(match[2]):
            name_flag = flags.get(f"{owner}.{name}")
            if name_flag is None:
                return match[0]
            said.append(name_flag if value.strip() in ("...", "") else
                        f"{name_flag} {value.strip().strip(chr(39))}")
        return "/".join(said) if all(" " not in s for s in said) else " ".join(said)

    message = _CALL.sub(call_sub, message)
    message = _FIELD.sub(field_sub, message)
    if field in flags:
        message = re.sub(r"\bNone\b", f"omit {flags[field]}", message)
    # What the message said for launch users apart, now said twice: once.
    message = re.sub(r"(--[\w-]+(?: [^\s,]+)?) or launch \1", r"\1", message)
    return re.sub(r" \(launch: ([^)]*)\)",
                  lambda m: "" if m[1] in message.replace(m[0], "") else m[0], message)
