"""``@elastic_train.restart_in_process``: in-process restarts for a script run by ``launch``.

A script under ``elastic-train launch`` owns its process: it joins its
process group itself and runs top to bottom, so by default a failure restarts
its processes, as under torchrun. Wrapping the script's main function opts in
to what ``fit()`` does by default: after a failure anywhere in the job, the
surviving processes leave ``main`` (a ``RestartAttempt`` exception unwinds
it), and call it again -- it joins a new process group, ``get_checkpoint()``
returns the latest committed checkpoint, and a dead rank gets a new, warm
process. Nothing changes outside ``launch`` or with ``--no-restart-in-process``:
the wrapper then just calls ``main``.

What ``main`` must do to be restartable (as for NVIDIA's in-process restart):
join the process group inside ``main`` from the environment (``env://``, as
torchrun scripts do), resume from ``get_checkpoint()``, let ``BaseException``
through, and keep no process group in module-level state. Connections the
attempt opened are cut when it fails.

Example::

    @elastic_train.restart_in_process
    def main():
        dist.init_process_group("gloo")
        ...  # resume from elastic_train.get_checkpoint(), train, report()
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
"""

from __future__ import annotations

import atexit
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from elastic_train.worker.inprocess import group_sockets
from elastic_train.worker.inprocess import loop as inprocess
from elastic_train.worker.session import current_session, shutdown_session

F = TypeVar("F", bound=Callable[..., Any])


def restart_in_process(main: F) -> F:
    """Makes ``main`` the unit of restart of a launched script (see the module doc)."""

    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not inprocess.enabled():
            return main(*args, **kwargs)

        def attempt() -> Any:
            with group_sockets.recording():
                return main(*args, **kwargs)

        return inprocess.run_attempts(attempt, _release_session)

    return wrapper  # type: ignore[return-value]


def _release_session(finish_s: float) -> None:
    """The failed attempt's session goes (its uploads finished within ``finish_s``, the
    rest dropped); the next attempt's first session call builds a new one."""
    session = current_session()
    if session is not None:
        atexit.unregister(session.finish)
        session.end_failed_attempt(finish_s)
    shutdown_session()
