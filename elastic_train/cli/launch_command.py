"""``elastic-train launch`` as a command: resolve the command line, then run, or report.

Parsing (torch's torchrun parser plus our flags, each value with its source)
is :mod:`.launch_parser`'s; the rules that turn the values into the Python
API's configs are :class:`~elastic_train.driver.launch.LaunchSettings`';
``--dry-run`` prints :func:`~elastic_train.driver.launch_run.report` instead of
running. Nothing here imports torch until ``launch`` runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from elastic_train.cli.errors import guarded

if TYPE_CHECKING:
    from elastic_train.driver.launch_settings import LaunchSettings

# Flags of the command line that are not launch settings.
_COMMAND_ONLY = ("dry_run", "debug", "print_completion")


def main_launch(argv: list[str], env: Mapping[str, str] | None = None) -> int:
    """``elastic-train launch ARGV`` (also what ``restore`` relaunches): exit code 2 and
    one line on bad input, whatever source (flag, ``PET_*``, ``SLURM_*``) gave it."""
    return guarded(lambda: _launch(argv, os.environ if env is None else env),
                   debug="--debug" in argv, flags=True)


def launch_settings(argv: list[str], env: Mapping[str, str]) -> tuple[LaunchSettings, bool]:
    """The checked settings of ``elastic-train launch ARGV`` (a ConfigError names a bad
    value and its source; nothing is started or written), and whether it is a dry run."""
    from elastic_train.cli.launch_parser import parse
    from elastic_train.driver.launch_settings import LaunchSettings

    parsed = parse(argv, env)
    values = {k: v for k, v in parsed.values.items() if k not in _COMMAND_ONLY}
    return LaunchSettings(target=parsed.target, target_args=parsed.target_args,
                          sources=parsed.sources, **values), parsed.values["dry_run"]


def _launch(argv: list[str], env: Mapping[str, str]) -> int:
    from elastic_train.driver.launch_run import launch, report

    settings, dry_run = launch_settings(argv, env)
    if dry_run:
        print(json.dumps(report(settings), indent=2))
        return 0
    return launch(settings, argv)
