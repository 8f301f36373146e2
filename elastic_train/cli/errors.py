"""How the command line ends on an error: one line, ``elastic-train: <what>; <how to fix>``.

A mistake (a bad flag or variable, a missing path, an unreadable run) exits
with code 2 and one line on stderr; anything else exits with code 1 and one
line naming the error. ``--debug`` adds the traceback.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

from elastic_train.cli.render import terminal_safe
from elastic_train.driver.launch_rules import in_flag_terms
from elastic_train.errors import ConfigError, StorageError

USAGE_ERROR = 2


def one_line(message: str) -> str:
    """``message`` on one line, its control characters escaped (it may quote storage)."""
    return terminal_safe(" ".join(message.split()))


def guarded(command: Callable[[], int], debug: bool, flags: bool = False) -> int:
    """Runs ``command``; its errors become one line on stderr and an exit code.
    ``flags``: the command takes launch's flags, so a config field in an error is
    named by its flag (see :func:`elastic_train.driver.launch_rules.in_flag_terms`)."""
    try:
        return command()
    except KeyboardInterrupt:
        return 130
    except (ConfigError, StorageError) as exc:
        if debug:
            traceback.print_exc()
        said = str(exc)
        if flags:
            said = in_flag_terms(said, field=getattr(exc, "field", None))
        print(f"elastic-train: {one_line(said)}", file=sys.stderr)
        return USAGE_ERROR
    except Exception as exc:  # noqa: BLE001 -- a bug or an unforeseen failure: one line too
        if debug:
            raise
        print(f"elastic-train: {one_line(f'{type(exc).__name__}: {exc}')}; rerun with "
              "--debug for the traceback", file=sys.stderr)
        return 1
