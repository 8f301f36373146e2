"""Helpers every layer shares, and no part of the public API.

The bottom layer: its modules import only the standard library, third-party packages
and the public top-level modules (``errors``, ``stragglers``), never ``agent/``,
``driver/``, ``cli/``, ``worker/``, ``storage/`` or ``torch/``. Runs saved before
these modules moved here still load: see :mod:`elastic_train._internal.moved_modules`.
"""
