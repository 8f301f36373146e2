"""The ``elastic-train`` command line (runs on the user's machine or a node).

:mod:`.main` parses the command line and dispatches to the commands.
"""

from elastic_train.cli.main import main

__all__ = ["main"]
