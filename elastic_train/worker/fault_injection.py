"""Crashes injected on purpose, for ``elastic-train verify-resume``.

Not part of the session API: an after-report hook (:mod:`.after_report`) calls
:func:`maybe_fail_after_report` after every ``report()``, and it does nothing
unless ``ELASTIC_TRAIN_FAIL_AT_REPORT`` is set (by ``verify-resume``'s interrupted
run, see :mod:`elastic_train.cli.verify_resume`).
"""

from __future__ import annotations

import os
import sys

from elastic_train._internal import env_vars

FAIL_EXIT_CODE = 75


def maybe_fail_after_report(iteration: int, rank: int, world_size: int,
                            restart_count: int) -> None:
    """The injected crash: the last rank exits after report number K, first attempt only."""
    at = env_vars.Switches.from_environ().fail_at_report
    if at is not None and restart_count == 0 and iteration == at and rank == world_size - 1:
        sys.stdout.flush()
        os._exit(FAIL_EXIT_CODE)
