"""A test's stand-in for a worker's start: the node's storage settings its plan would give."""

from __future__ import annotations

import pytest

from elastic_train.storage import node_settings
from elastic_train.storage.node_settings import NodeSettings


def use_node_settings(monkeypatch: pytest.MonkeyPatch, **fields: object) -> None:
    """This process's node settings for the test (restored after it)."""
    monkeypatch.setattr(node_settings, "_current", NodeSettings(**fields))
