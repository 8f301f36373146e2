"""``RendezvousConfig`` moved out of ``agent/``; runs pickled before still restore."""

from __future__ import annotations

import pickle
import pickletools

from elastic_train.rendezvous_config import RendezvousConfig


def _pickled_under_old_path(config: RendezvousConfig) -> bytes:
    """``config`` as a run saved before the move pickled it (protocol 2 writes the
    class's module path in a GLOBAL opcode)."""
    data = pickle.dumps(config, protocol=2)
    new, old = b"elastic_train.rendezvous_config", b"elastic_train.agent.rendezvous.config"
    assert new in data
    return data.replace(new, old)


def test_a_config_pickled_under_the_old_module_path_unpickles():
    config = RendezvousConfig(backend="c10d", endpoint="node0:29400", run_id="job42",
                              conf={"join_timeout": 60})
    data = _pickled_under_old_path(config)
    ops = [arg for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"]
    assert any("elastic_train.agent.rendezvous.config" in str(arg) for arg in ops)
    assert pickle.loads(data) == config
