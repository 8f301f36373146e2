"""Optional dependencies: the integrations import them on use, and a missing one is
an ``ImportError`` that names the extra to install.

Example::

    transformers = require("transformers", extra="transformers",
                           user="elastic_train.huggingface.transformers")
"""

from __future__ import annotations

import importlib
from types import ModuleType


def missing(package: str, extra: str, user: str) -> ImportError:
    """The error for ``user`` when ``package`` is not installed."""
    return ImportError(
        f"{user} needs the {package!r} package, which is not installed: "
        f"pip install 'elastic-train[{extra}]' (or pip install {package}).")


def require(module: str, extra: str, user: str, package: str | None = None) -> ModuleType:
    """Imports ``module``, or raises :func:`missing` naming ``package`` (default: the
    module's top-level name) and the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != module.split(".")[0]:
            raise  # the package is there but one of its own dependencies is not
        raise missing(package or module.split(".")[0], extra, user) from exc
