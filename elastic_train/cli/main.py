"""The ``elastic-train`` command: run, list, show and continue runs.

    elastic-train ls [STORAGE_PATH]        runs under a storage path (~/elastic_train_results)
    elastic-train show RUN_PATH [--json]   a run's status, failures and checkpoints
    elastic-train restore RUN_PATH [--start-over]   continue an interrupted or failed run
    elastic-train launch [torchrun flags] SCRIPT [ARGS]   run a script on this node, as torchrun
    elastic-train verify-resume [--nproc-per-node N] SCRIPT [ARGS]   does it resume exactly?

This module parses and dispatches: the commands are in :mod:`.commands`,
launch's flags in :mod:`.launch_args`, the text they print in :mod:`.render`.
"""

from __future__ import annotations

import argparse
import sys

from elastic_train import __version__
from elastic_train.cli import commands
from elastic_train.cli.launch_args import EXIT_CODES, add_launch_parser, flag
from elastic_train.config import DEFAULT_STORAGE_PATH
from elastic_train.errors import ConfigError, StorageError


def _add_restore_parser(sub: argparse._SubParsersAction) -> None:
    """``elastic-train restore RUN_PATH``."""
    restore = sub.add_parser("restore", help="continue an interrupted or failed run",
                             epilog="example: elastic-train restore "
                                    "~/elastic_train_results/run1\n" + EXIT_CODES,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    restore.add_argument("run_path")
    restore.add_argument("--start-over", action="store_true",
                         help="train a finished run (or one that cannot be continued) again "
                              "from scratch with its stored settings, after moving it aside "
                              "to <run_path>.<status>-<UTC time> (nothing is deleted)")
    restore.add_argument("--trust-command", action="store_true",
                         help="run a launch run's stored command even when it is a "
                              "--no-python program or a -m module (check it first: restore "
                              "prints it; it is read from the run directory)")
    restore.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                         help="an fsspec option of the storage (repeatable); credentials "
                              "are never stored, so pass them again here or in the "
                              "environment")
    restore.set_defaults(func=commands.cmd_restore)


def build_parser() -> argparse.ArgumentParser:
    """Every command's parser; each sets ``func``, the command to run."""
    parser = argparse.ArgumentParser(
        prog="elastic-train", epilog=EXIT_CODES,
        description="Fault-tolerant, elastic PyTorch training with Ray Train's API: run a "
                    "script like torchrun (launch), list and inspect runs (ls, show), "
                    "continue one (restore), check that a script resumes exactly "
                    "(verify-resume).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"elastic-train {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("ls", help="list runs under a storage path",
                        epilog="examples:\n  elastic-train ls\n  elastic-train ls "
                               "s3://bucket/experiments --json\n" + EXIT_CODES,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ls.add_argument("storage_path", nargs="?", default=DEFAULT_STORAGE_PATH)
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=commands.cmd_ls)
    show = sub.add_parser("show", help="show one run",
                          epilog="examples:\n  elastic-train show "
                                 "~/elastic_train_results/digits\n  elastic-train show "
                                 "s3://bucket/experiments/resnet --json\n" + EXIT_CODES,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    show.add_argument("run_path")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=commands.cmd_show)
    _add_restore_parser(sub)
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
    flag(verify, "nproc-per-node", type=int, default=2)
    flag(verify, "fail-at-report", type=int, default=2,
          help="kill a worker right after this report() (default 2)")
    flag(verify, "workdir", default=None,
          help="where both runs are stored (default: a new temporary directory)")
    verify.add_argument("script")
    verify.add_argument("script_args", nargs=argparse.REMAINDER)
    verify.set_defaults(func=commands.cmd_verify_resume)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.launch_argv = argv[argv.index("launch") + 1:] if args.command == "launch" else []
    try:
        return args.func(args)
    except (StorageError, ConfigError) as exc:
        print(f"elastic-train: {exc}", file=sys.stderr)
        return 2

