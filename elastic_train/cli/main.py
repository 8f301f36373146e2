"""The ``elastic-train`` command: run, list, show and continue runs.

    elastic-train ls [STORAGE_PATH]        runs under a storage path (~/elastic_train_results)
    elastic-train show RUN_PATH [--json] [--plot FILE.png]   a run's status, failures and
                                           checkpoints (and a picture of it)
    elastic-train restore RUN_PATH [--start-over]   continue an interrupted or failed run
    elastic-train launch [torchrun flags] SCRIPT [ARGS]   run a script on this node, as torchrun
    elastic-train verify-resume [--nproc-per-node N] SCRIPT [ARGS]   does it resume exactly?

This module parses and dispatches: the commands are in :mod:`.browse` (ls,
show) and :mod:`.commands`,
``launch`` (torchrun's own parser, with torch imported only then) in
:mod:`.launch_command`, the text they print in :mod:`.render`. Every error ends
in one line and exit code 2 (see :mod:`.errors`); ``--debug`` adds tracebacks.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from elastic_train import __version__
from elastic_train.cli import browse, commands
from elastic_train.cli.errors import guarded
from elastic_train.cli.launch_command import main_launch
from elastic_train.cli.launch_flags import EXIT_CODES, flag
from elastic_train.config import DEFAULT_STORAGE_PATH
from elastic_train.errors import ConfigError

STORAGE_OPTION_HELP = ("an fsspec option of the storage, e.g. endpoint_url=http://minio:9000 "
                       "(repeatable); credentials are never stored, so pass them here or "
                       "in the environment")

RUN_PATH_HELP = ("a run's directory: its storage path and name, as `elastic-train ls` lists "
                 "them (e.g. ~/elastic_train_results/run1 or s3://bucket/experiments/run1)")


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (see :mod:`.errors`)."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message}; see {self.prog} --help")


def _common(parser: argparse.ArgumentParser, storage: bool = True) -> None:
    if storage:
        flag(parser, "storage-option", action="append", default=[], metavar="KEY=VALUE",
             help=STORAGE_OPTION_HELP)
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks of errors")


def _add_browse(sub: argparse._SubParsersAction) -> None:
    """``ls`` and ``show`` (:mod:`.browse`)."""
    ls = sub.add_parser("ls", help="list runs under a storage path",
                        epilog="examples:\n  elastic-train ls\n  elastic-train ls "
                               "s3://bucket/experiments --json\n" + EXIT_CODES,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ls.add_argument("storage_path", nargs="?", default=DEFAULT_STORAGE_PATH,
                    help="the directory that holds the runs: a local path or a URL such as "
                         f"s3://bucket/experiments (default {DEFAULT_STORAGE_PATH})")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    _common(ls)
    ls.set_defaults(func=browse.cmd_ls)
    show = sub.add_parser("show", help="show one run",
                          epilog="examples:\n  elastic-train show "
                                 "~/elastic_train_results/digits\n  elastic-train show "
                                 "s3://bucket/experiments/resnet --json\n  elastic-train show "
                                 "~/elastic_train_results/digits --plot digits.png\n"
                                 + EXIT_CODES,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    show.add_argument("run_path", help=RUN_PATH_HELP)
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.add_argument("--plot", metavar="FILE.png", default=None,
                      help="also draw the run into FILE.png (or .svg, .pdf, ...: the suffix "
                           "names the format): metrics, world size, each fault's recovery, "
                           "checkpoints, time by cause (needs elastic-train[plot])")
    _common(show)
    show.set_defaults(func=browse.cmd_show)


def build_parser() -> argparse.ArgumentParser:
    """Every command's parser; each sets ``func``, the command to run (``launch``'s is
    torchrun's, built only when it runs: see :func:`main`)."""
    parser = _Parser(
        prog="elastic-train", epilog=EXIT_CODES,
        description="Fault-tolerant, elastic PyTorch training with Ray Train's API: run a "
                    "script like torchrun on this node (launch; inside Slurm or a Kubeflow "
                    "PyTorchJob with no flags), list and inspect runs (ls, show), continue "
                    "one (restore), check that a script resumes exactly (verify-resume). "
                    "`elastic-train COMMAND --help` describes each.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"elastic-train {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_browse(sub)
    restore = sub.add_parser("restore", help="continue an interrupted or failed run",
                             epilog="example: elastic-train restore "
                                    "~/elastic_train_results/run1\n" + EXIT_CODES,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    restore.add_argument("run_path", help=RUN_PATH_HELP)
    restore.add_argument("--start-over", action="store_true",
                         help="train a finished run (or one that cannot be continued) again "
                              "from scratch with its stored settings, after moving it aside "
                              "to <run_path>.<status>-<UTC time> (nothing is deleted)")
    restore.add_argument("--trust-command", action="store_true",
                         help="run a launch run's stored command even when it is a "
                              "--no-python program or a -m module (check it first: restore "
                              "prints it; it is read from the run directory)")
    _common(restore)
    restore.set_defaults(func=commands.cmd_restore)
    sub.add_parser("launch", add_help=False,
                   help="run a training script on this node, as torchrun (its flags and "
                        "PET_* variables; Slurm and Kubeflow need none); --dry-run shows the "
                        "settings")
    verify = sub.add_parser(
        "verify-resume", help="check that a launch script resumes bit-identically",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Runs SCRIPT twice with elastic-train launch: straight through, and with "
                    "a worker killed after its K-th report() and restarted from the latest "
                    "checkpoint; then compares the final checkpoints file by file.",
        epilog="example:\n  elastic-train verify-resume --nproc-per-node 2 --fail-at-report 3 "
               "train.py --epochs 5\nexit codes: 0 identical, 1 different or inconclusive, "
               "2 bad usage")
    flag(verify, "nproc-per-node", type=int, default=2,
         help="workers of each run (default 2)")
    flag(verify, "fail-at-report", type=int, default=2,
          help="kill a worker right after this report() (default 2)")
    flag(verify, "workdir", default=None,
          help="where both runs are stored (default: a new temporary directory)")
    _common(verify, storage=False)
    verify.add_argument("script", help="the launch script to check")
    verify.add_argument("script_args", nargs=argparse.REMAINDER,
                        help="the script's own arguments")
    verify.set_defaults(func=commands.cmd_verify_resume)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The ``elastic-train`` command; returns its exit code."""
    argv = sys.argv[1:] if argv is None else argv
    if "launch" in argv:  # torchrun's parser, built only now (it imports torch)
        at = argv.index("launch")
        if all(arg == "--debug" for arg in argv[:at]):
            return main_launch([*argv[:at], *argv[at + 1:]])
    return guarded(lambda: _run(argv), debug="--debug" in argv)


def _run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
