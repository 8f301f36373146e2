"""What ``elastic-train restore PATH`` runs to continue a run of ``elastic-train launch``.

The command stored in ``run.json`` is data read from storage: whoever can write
the run directory can change it. So :func:`plan_relaunch` checks and rewrites it
before anything runs, and the command is printed first:

* Only an ``elastic-train launch`` is ever run. A launch of a script runs; a
  ``--no-python`` program or a ``-m`` module runs only with ``--trust-command``.
* The run continues at PATH: the stored ``--name``/``--storage-path`` are replaced
  by PATH's (an archived ``job.failed-...`` continues where it is, and a storage
  path that depended on ``~`` or on a directory is not looked up anew).
* It runs in the current directory, never in the stored one: a relative script
  must be here (the error names the directory the run was launched from).
* restore's ``--storage-option`` are passed on, in place of the stored ones; a
  secret the record redacted (``--storage-option key=***``, ``--rdzv-conf
  password=***``) must be given again, with ``--storage-option`` or in
  ``PET_RDZV_CONF``.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

from elastic_train._internal.redaction import REDACTED, redact_argv
from elastic_train.errors import ConfigError
from elastic_train.rendezvous_config import parse_rdzv_conf

TRUST_FLAG = "--trust-command"
_DROPPED = {"--name": 1, "--storage-path": 1, "--storage-option": 1, "--start-over": 0}


@dataclass(frozen=True)
class RunAt:
    """Where restore was told the run is: ``storage_path``/``name`` as launch takes them,
    and the storage options given now."""

    storage_path: str
    name: str
    options: dict[str, str] | None


@dataclass(frozen=True)
class _Stored:
    """What restore checks of a stored launch command."""

    script: str
    script_args: list[str]
    no_python: bool
    module: bool
    storage_option: list[str]


def _parse(argv: list[str]) -> _Stored:
    """launch's arguments as launch parses them; a ConfigError if they are not launch's."""
    from elastic_train.cli.launch_parser import build_parser

    try:
        args = build_parser().parse_args(argv)
    except ConfigError as exc:
        raise ConfigError(f"the stored command is not a valid `elastic-train launch` command "
                          f"({exc}).") from None
    return _Stored(args.training_script, list(args.training_script_args),
                   bool(args.no_python), bool(args.module), list(args.storage_option or []))


def _without(flags: list[str], dropped: dict[str, int]) -> list[str]:
    """``flags`` without the ``dropped`` flags (name -> number of values; both spellings,
    ``--flag VALUE`` and ``--flag=VALUE``)."""
    out, skip = [], 0
    for arg in flags:
        name = arg.split("=", 1)[0].replace("_", "-")
        if skip:
            skip -= 1
        elif name in dropped:
            skip = 0 if "=" in arg else dropped[name]
        else:
            out.append(arg)
    return out


def _stored_secrets(flags: list[str], given: dict[str, str]) -> list[str]:
    """``flags`` with the redacted ``--rdzv-conf`` items filled in from ``given``."""
    out, conf_next = [], False
    for arg in flags:
        name, sep, value = arg.partition("=")
        if conf_next or (sep and name.replace("_", "-") == "--rdzv-conf"):
            text = arg if conf_next else value
            filled = ",".join(_filled(item, given) for item in text.split(","))
            arg = filled if conf_next else f"{name}={filled}"
        out.append(arg)
        conf_next = arg.replace("_", "-") == "--rdzv-conf"
    return out


def _filled(item: str, given: dict[str, str]) -> str:
    key, _, value = item.partition("=")
    if value != REDACTED:
        return item
    if key not in given:
        raise ConfigError(
            f"the run's --rdzv-conf had a secret, {key}, which was not stored: give it "
            f"again in the environment, e.g. PET_RDZV_CONF={key}=... elastic-train restore "
            "PATH.")
    return f"{key}={given[key]}"


def _missing_storage_secrets(stored: _Stored, options: dict[str, str] | None
                             ) -> list[str]:
    return [pair.split("=", 1)[0] for pair in stored.storage_option or []
            if pair.endswith("=" + REDACTED) and pair.split("=", 1)[0] not in (options or {})]


def plan_relaunch(command: list[str], at: RunAt, stored_cwd: str, *, trust: bool,
                  start_over: bool) -> list[str]:
    """launch's arguments that continue the run at ``at``; ConfigError (with the command
    and the way out) when it is not to be run."""
    shown = shlex.join(redact_argv(command))
    if command[:2] != ["elastic-train", "launch"]:
        raise ConfigError(f"its stored command is not an `elastic-train launch`: {shown}. "
                          "Restore runs nothing else; start the run yourself if you trust it.")
    stored = _parse(command[2:])
    target = [stored.script, *stored.script_args]
    flags = command[2:len(command) - len(target)]
    if (stored.no_python or stored.module) and not trust:
        kind = "a --no-python program" if stored.no_python else "a -m module"
        raise ConfigError(f"its stored command runs {kind}, not a script: {shown}. Check it, "
                          f"then run restore again with {TRUST_FLAG} to run it.")
    if not (stored.no_python or stored.module) and not os.path.isfile(stored.script):
        raise ConfigError(
            f"its script {stored.script} does not exist in the current directory "
            f"{os.getcwd()}; the run was launched from {stored_cwd}. Run restore from the "
            "directory that holds the script (restore never changes directory).")
    missing = _missing_storage_secrets(stored, at.options)
    if missing:
        raise ConfigError(f"the run's storage options {', '.join(missing)} were secrets, "
                          "not stored: give them again with --storage-option KEY=VALUE.")
    given = parse_rdzv_conf(os.environ.get("PET_RDZV_CONF", ""), "PET_RDZV_CONF")
    options = [f"--storage-option={k}={v}" for k, v in (at.options or {}).items()]
    return [*_stored_secrets(_without(flags, _DROPPED), {k: str(v) for k, v in given.items()}),
            "--name", at.name, "--storage-path", at.storage_path, *options,
            *(["--start-over"] if start_over else []), *target]
