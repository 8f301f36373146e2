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


@pytest.mark.parametrize("data", [
    b"%%%", b"[1, 2]", b"7", b'[1, ["x"], "h", 1]', b"",
    b'[1e999, [], "h", 1]',  # was an OverflowError
    b"[" * 5000,  # was a RecursionError
    b'"1234"',  # was read as Seal(1, (2,), "3", 4)
    b'[5, [0], "h", 29500]', b'[5, [2, 0], "h", 29500]',  # two members of one revision
    b'[5, [-1], "h", 29500]', b'[0, [], "h", 29500]',
    b'[5, [], "h", 70000]', b'[5, [], "h", 0]', b'[5, [], "", 29500]', b'[5, [], 7, 29500]',
    b'[true, [], "h", 1]', b'[5, [1.5], "h", 29500]', b'[5, [], "h", "29500"]',
])
def test_a_seal_nobody_wrote_is_a_state_error(data):
    with pytest.raises(RendezvousStateError, match="holds .*, not a seal as a round's sealer"):
        Seal.decode(data, 1)


def test_a_seal_read_from_etcd_names_its_key():
    kv = KeyValue(b"/elastic_train/rdzv/job/native/r/3/c/seal", b"[]", 1, 2, 0)
    with pytest.raises(RendezvousStateError, match=r"etcd key .*/r/3/c/seal holds b'\[\]'"):
        Seal.of(kv)


def test_a_round_pointer_that_is_not_a_number_is_a_state_error():
    kv = KeyValue(b"/elastic_train/rdzv/job/native/run/round", b"garbage", 1, 2, 0)
    assert round_number(KeyValue(kv.key, b"12", 1, 2, 0)) == 12
    with pytest.raises(RendezvousStateError, match=r"run/round holds b'garbage'"):
        round_number(kv)


@pytest.mark.parametrize("value", [b"-3", b"+3", b"007", b" 7", b"7\n", b"1_0", b"", b"9" * 30])
def test_a_round_pointer_only_reads_as_the_handler_writes_it(value):
    """Read as numbers before: a round below 0, or one the handler's own comparisons (made
    with b"%d" % round) never match, so that the round can never move on."""
    with pytest.raises(RendezvousStateError, match="not a round number"):
        round_number(KeyValue(b"run/round", value, 1, 2, 0))


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
