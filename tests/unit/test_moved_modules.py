"""Pickles that name a module's path from before it moved still load
(:mod:`elastic_train._internal.moved_modules`): ``RendezvousConfig`` left ``agent/``, the
internal helpers left the package's top level. The run saved by an older version is
restored end to end in ``tests/e2e/test_restore_old_run.py``."""

from __future__ import annotations

import importlib
import pathlib
import pickle
import pickletools
import sys
import types

import cloudpickle
import pytest

from elastic_train._internal import env_vars, moved_modules
from elastic_train._internal.moved_modules import MOVED
from elastic_train.rendezvous_config import RendezvousConfig

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "elastic_train"


def _pickled_under_old_path(config: RendezvousConfig) -> bytes:
    """``config`` as a run saved before the move pickled it (protocol 2 writes the
    class's module path in a GLOBAL opcode)."""
    data = pickle.dumps(config, protocol=2)
    new, old = b"elastic_train.rendezvous_config", b"elastic_train.agent.rendezvous.config"
    assert new in data
    return data.replace(new, old)


def test_a_config_pickled_under_the_old_module_path_loads_as_todays_class():
    config = RendezvousConfig(backend="c10d", endpoint="node0:29400", run_id="job42",
                              conf={"join_timeout": 60})
    data = _pickled_under_old_path(config)
    ops = [arg for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"]
    assert any("elastic_train.agent.rendezvous.config" in str(arg) for arg in ops)
    loaded = moved_modules.loads(data)
    assert type(loaded) is RendezvousConfig and loaded == config


@pytest.mark.parametrize("old", sorted(MOVED))
def test_each_old_path_is_gone_and_reads_as_its_new_one(old):
    relative = old.split(".", 1)[1].replace(".", "/")
    assert not (PACKAGE / f"{relative}.py").exists(), f"{old} did not move: drop it from MOVED"
    new = importlib.import_module(MOVED[old])
    # GLOBAL "<old> __name__": the attribute is looked up on the module the table names
    assert moved_modules.loads(f"c{old}\n__name__\n.".encode()) == new.__name__


def test_a_function_pickled_by_value_finds_a_module_it_uses_at_its_old_path(monkeypatch):
    """cloudpickle names a module a by-value function uses (``subimport``) by its path."""
    old = types.ModuleType("elastic_train.env_vars")
    monkeypatch.setitem(sys.modules, old.__name__, old)

    def uses_it():
        return old

    data = cloudpickle.dumps(uses_it)
    assert b"elastic_train.env_vars" in data
    monkeypatch.delitem(sys.modules, old.__name__)
    assert moved_modules.loads(data)() is env_vars


def test_a_path_that_never_moved_loads_as_itself():
    assert moved_modules.new_path("elastic_train.config") == "elastic_train.config"
    assert moved_modules.loads(pickle.dumps(RendezvousConfig())) == RendezvousConfig()
