"""Reading the etcd handler's state, and the error for a state nobody can read."""

from __future__ import annotations

import pytest
from torch.distributed.elastic.rendezvous import RendezvousStateError

from elastic_train.agent.rendezvous.etcd_kv import KeyValue
from elastic_train.agent.rendezvous.etcd_rounds import Seal, round_number
from elastic_train.agent.rendezvous.etcd_v3 import run_prefix
from elastic_train.errors import RendezvousLostError


def test_a_seal_reads_back_what_its_sealer_wrote():
    seal = Seal(7, (9, 12, 40), "10.0.0.1", 29500)
    assert Seal.decode(seal.encode(), 3) == Seal(7, (9, 12, 40), "10.0.0.1", 29500, 3)


@pytest.mark.parametrize("data", [b"%%%", b"[1, 2]", b"7", b'[1, ["x"], "h", 1]', b""])
def test_a_seal_nobody_wrote_is_a_state_error(data):
    with pytest.raises(RendezvousStateError, match="seal holds"):
        Seal.decode(data, 1)


def test_a_round_pointer_that_is_not_a_number_is_a_state_error():
    kv = KeyValue(b"/elastic_train/rdzv/job/native/run/round", b"garbage", 1, 2, 0)
    assert round_number(KeyValue(kv.key, b"12", 1, 2, 0)) == 12
    with pytest.raises(RendezvousStateError, match=r"run/round holds b'garbage'"):
        round_number(kv)


def test_the_error_for_a_corrupt_state_says_where_it_lives_and_what_to_do():
    cause = RendezvousStateError("The state object is corrupt.")
    c10d = str(RendezvousLostError.corrupt_state("c10d", "node0:29400", "job", cause))
    assert "rendezvous id job, c10d at node0:29400" in c10d
    assert "checkpoints are intact" in c10d and "Start every node again" in c10d
    etcd = str(RendezvousLostError.corrupt_state(
        "etcd", "https://user:secret@etcd:2379", "my job", cause,
        etcd_prefix=run_prefix("my job")))
    assert "del --prefix /elastic_train/rdzv/my%20job/" in etcd and "--rdzv-id" in etcd
    assert "secret" not in etcd
