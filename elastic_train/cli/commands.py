"""``elastic-train restore | verify-resume``: what each command does.

``restore`` continues a run the way it was started (``fit()`` through its
stored train function, ``launch`` by relaunching its stored command, checked
and shown first: see :mod:`.relaunch`). ``ls`` and ``show`` are in :mod:`.browse`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys

from elastic_train._internal.redaction import redact_argv
from elastic_train.cli.browse import check_directory
from elastic_train.cli.launch_command import main_launch
from elastic_train.cli.relaunch import RunAt, plan_relaunch
from elastic_train.cli.render import printed
from elastic_train.driver.resume_rules import why_not_restorable
from elastic_train.errors import ConfigError, TrainingFailedError, exit_code
from elastic_train.storage import RunStorage
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.filesystem import options_from_flags as storage_options


def cmd_restore(args: argparse.Namespace) -> int:
    options = storage_options(args.storage_option)
    fs, path = fsutil.resolve(args.run_path, options=options)
    storage = RunStorage(fs, path)
    storage.check_reachable()
    check_directory(fs, path, "a run directory")
    state = storage.read_run_state()
    finished = state is not None and state.is_finished and not args.start_over
    command = state.spec.get("command") if state is not None else None
    if command and not finished:  # a run of `elastic-train launch`
        parent, _, name = path.rstrip("/").rpartition("/")
        return _relaunch(command, state.spec.get("cwd", "?"), args,
                         RunAt(fsutil.display_path(fs, parent), name, options))
    if finished:
        raise ConfigError(f"{args.run_path} cannot be restored: its run has already "
                          "finished: pass --start-over to move it aside and train it again "
                          "from scratch (see `elastic-train show`).")
    why = why_not_restorable(state, state is not None and storage.has_trainable(),
                             args.run_path)
    if why is not None:
        raise ConfigError(why)
    return _refit(args.run_path, options, args.start_over)


def _relaunch(command: list[str], stored_cwd: str, args: argparse.Namespace,
              at: RunAt) -> int:
    """Runs a launch run's stored command again, checked and rewritten by
    :func:`~.relaunch.plan_relaunch`, in the current directory; it is printed first."""
    try:
        argv = plan_relaunch(command, at, stored_cwd, trust=args.trust_command,
                             start_over=args.start_over)
    except ConfigError as exc:
        raise ConfigError(f"{args.run_path} cannot be restored: {exc}") from None
    shown = shlex.join(redact_argv(["elastic-train", "launch", *argv]))
    print(printed([f"elastic-train: restoring {args.run_path}: running {shown} in "
                   f"{os.getcwd()}"]), file=sys.stderr)
    return main_launch(argv)


def _refit(run_path: str, options: dict[str, str] | None, start_over: bool) -> int:
    """Continues a ``fit()`` run through its stored train function."""
    from elastic_train.torch import TorchTrainer

    try:
        trainer = TorchTrainer.restore(run_path, storage_options=options)
        trainer.run_config = dataclasses.replace(trainer.run_config, start_over=start_over)
        result = trainer.fit()
    except TrainingFailedError as exc:
        print(printed(f"elastic-train: {exc}".split("\n")), file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        return 130
    print(f"finished: {result.path}  iteration {result.metrics.get('training_iteration')}")
    return 0


def cmd_verify_resume(args: argparse.Namespace) -> int:
    from elastic_train.cli.verify_resume import verify

    if args.fail_at_report < 1:
        raise ConfigError(f"--fail-at-report={args.fail_at_report} is invalid: use >= 1.")
    verdict = verify([args.script, *args.script_args], args.nproc_per_node,
                     args.fail_at_report, args.workdir)
    print(verdict.describe())
    return 0 if verdict.passed else 1
