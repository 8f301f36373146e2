"""``elastic-train launch``'s command line: torch's own torchrun parser, with our flags added.

The parser is ``torch.distributed.run.get_args_parser()`` (imported here only,
when ``launch`` runs, so ``ls`` and ``show`` never import torch; through
:func:`~elastic_train.agent.torch_compat.torchrun_parser`, which refuses a torch
we do not support), so every torchrun flag and spelling is torch's, and so is every
default but ``--master-port``'s (unset on every version, as from torch 2.12 on).
Each value is then resolved as torchrun resolves it -- the flag, else
``PET_<FLAG>``, else the default -- with one step added before the default: what
the platform implies (:mod:`elastic_train._internal.platforms`: Slurm, Kubeflow). Unlike
torchrun, we keep where each value came from, so that a bad value is reported
with its source (``PET_NPROC_PER_NODE='x' is invalid ...``) and ``--dry-run``
can show it.

Example::

    parsed = parse(["--nnodes", "2", "train.py", "--lr", "0.1"], os.environ)
    parsed.values["nnodes"], parsed.sources["nnodes"]    # ("2", "--nnodes")
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from elastic_train._internal.platforms import Derived, derived_settings
from elastic_train.cli.launch_flags import add_our_flags, describe, refuse_print_completion
from elastic_train.errors import ConfigError

DEFAULT = "default"
_UNSET = object()
_TYPE_WORDS = {int: "a whole number", float: "a number"}


@dataclass
class ParsedLaunch:
    """A launch command line, resolved: each flag's value and where it came from
    (``"--nnodes"``, ``"PET_NNODES"``, ``"SLURM_JOB_NUM_NODES"`` or ``"default"``)."""

    values: dict[str, Any]
    sources: dict[str, str]
    target: str
    target_args: list[str]


@contextlib.contextmanager
def _without_pet_variables() -> Iterator[None]:
    """Hides ``PET_*`` while torch builds its parser: its actions read them as they are
    built (and fail with a bare ValueError on a bad one); we resolve them ourselves."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("PET_")}
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(saved)


def _one_line_error(message: str) -> NoReturn:
    raise ConfigError(f"{message}; see elastic-train launch --help")


def build_parser() -> argparse.ArgumentParser:
    """torchrun's parser, renamed, with our flags; usage errors raise ConfigError."""
    with _without_pet_variables():
        from elastic_train.agent.torch_compat import torchrun_parser

        parser = torchrun_parser()
    parser.error = _one_line_error  # type: ignore[method-assign]
    describe(parser)
    refuse_print_completion(parser)
    add_our_flags(parser)
    return parser


def _env_flag(raw: str, variable: str) -> bool:
    """A switch from the environment, as torchrun reads it (``PET_STANDALONE=1``); an empty
    value counts as set (Kubeflow's operator sets ``PET_STANDALONE=""`` for ``standalone``)."""
    if raw == "":
        return True
    if raw.lstrip("-").isdigit():
        return bool(int(raw))
    raise ConfigError(f"{variable}={raw!r} is invalid: use 1 (on) or 0 (off), or unset it.")


def long_option(action: argparse.Action) -> str:
    """The flag's name as the messages give it (``--nproc-per-node``)."""
    return next(o for o in action.option_strings if o.startswith("--"))


def _converted(action: argparse.Action, raw: str, source: str) -> Any:
    """``raw`` (from the environment or a platform) converted as argparse would convert
    the flag's value; a ConfigError naming ``source`` otherwise."""
    try:
        value = action.type(raw) if callable(action.type) else raw
    except (TypeError, ValueError):
        kind = _TYPE_WORDS.get(action.type, "another value")  # type: ignore[arg-type]
        raise ConfigError(f"{source}={raw!r} is invalid: {long_option(action)} takes {kind}; "
                          f"fix or unset {source}.") from None
    if action.choices is not None and value not in action.choices:
        raise ConfigError(f"{source}={raw!r} is invalid: use one of "
                          f"{', '.join(map(str, action.choices))}.")
    return value


def _fallback(action: argparse.Action, default: Any, env: Mapping[str, str],
              platform: Mapping[str, Derived]) -> tuple[Any, str]:
    """A value not given as a flag: ``PET_<DEST>``, else the platform's, else the default."""
    from torch.distributed.argparse_util import check_env

    variable = f"PET_{action.dest.upper()}"
    raw = env.get(variable)
    if isinstance(action, check_env):  # torchrun's switches (--standalone, -m, ...)
        return (_env_flag(raw, variable), variable) if raw is not None else (False, DEFAULT)
    if action.nargs == 0:
        return default, DEFAULT  # our own switches: flags only
    if raw:
        return _converted(action, raw, variable), variable
    if action.dest in platform:
        derived = platform[action.dest]
        return _converted(action, derived.value, derived.source), derived.source
    if isinstance(default, str) and callable(action.type):
        default = action.type(default)
    return default, DEFAULT


def parse(argv: list[str], env: Mapping[str, str]) -> ParsedLaunch:
    """Resolves a launch command line against ``env`` (see the module docstring)."""
    parser = build_parser()
    defaults = {}
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            defaults.setdefault(action.dest, (action, action.default))  # aliases share one
            if not isinstance(action, argparse._AppendAction):  # it appends to its default
                action.default = _UNSET
    args = parser.parse_args(argv)
    platform = derived_settings(env)
    values, sources = {}, {}
    for dest, (action, default) in defaults.items():
        value = getattr(args, dest)
        if value is _UNSET:
            value, source = _fallback(action, default, env, platform)
        else:
            appended = isinstance(action, argparse._AppendAction)
            source = DEFAULT if appended and not value else long_option(action)
        values[dest], sources[dest] = value, source
    return ParsedLaunch(values, sources, args.training_script, args.training_script_args)
