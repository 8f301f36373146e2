"""Our etcd handler's state comes from etcd, which others can write: whatever a key holds,
the handler follows it (a well-formed value) or stops with a RendezvousStateError naming
the key, which the agent turns into the error that says how to clear it (#24: fuzz what
comes from the network). Never another exception, never a hang.

What the handler reads, and how (``etcd_native``; ``Keys`` in ``etcd_rounds``):
``run/round`` (the round pointer: a decimal number), ``r/<R>/c/seal`` (a round's seal:
JSON) -- decoded; ``r/<R>/c/sealer`` -- only compared with what the handler writes;
``run/closed``, ``r/<R>/c/closed``, ``r/<R>/c/wanted``, the joins ``r/<R>/j/*``, the spares
``r/<R>/s/*`` and ``left/*`` -- only their presence, revisions and count. Each decoded
value is fed at every place the handler reads it: in a join's answer, from a watch
(waiting for a seal, sealing, waiting for the next round) and in a plain read.

The handler is the real one (:class:`EtcdNativeHandler`) over etcd in memory
(tests/support/memory_etcd.py); tests/e2e/test_rendezvous_state_etcd.py feeds a real etcd.
"""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st
from torch.distributed.elastic.rendezvous import (
    RendezvousInfo,
    RendezvousStateError,
    RendezvousTimeoutError,
)

from elastic_train.agent.api import _corrupt_state
from elastic_train.agent.rendezvous.etcd_rounds import Seal
from elastic_train.rendezvous_config import RendezvousConfig
from tests.support.memory_etcd import RUN_LEASE, MemoryKV, keys_of, native_handler

KEYS = keys_of("fuzz")
FUZZ = settings(max_examples=200, deadline=None, database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow])

def _seal_reads(value: bytes) -> bool:
    try:
        Seal.decode(value, 1)
    except RendezvousStateError:
        return False
    return True


# Values: arbitrary bytes; JSON of any shape; seals and round numbers almost right.
scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                           max_leaves=8)
numbers = st.integers(-3, 70000) | st.integers() | st.booleans() | st.floats() \
    | st.text("0123456789-e. ", max_size=6)
seal_like = st.tuples(numbers, st.lists(numbers, max_size=4) | json_values,
                      st.text(max_size=8) | json_values, numbers).map(list)
round_like = st.integers().map(lambda i: b"%d" % i) | st.binary(max_size=0) \
    | st.text("0123456789-+_ .e\n\t", min_size=1, max_size=8).map(str.encode)
values = st.binary(max_size=64) | round_like | (json_values | seal_like).map(
    lambda v: json.dumps(v).encode())
# Well-formed seals too (small revisions: this node's join may be among them).
good_seals = st.builds(lambda first, others, addr, port: Seal(first, others, addr, port).encode(),
                       st.integers(1, 12), st.lists(st.integers(1, 12), unique=True, max_size=4
                                                    ).map(sorted).map(tuple),
                       st.text(min_size=1, max_size=8), st.integers(1, 65535)
                       ).filter(lambda data: _seal_reads(data))
seal_values = values | good_seals



@pytest.fixture(autouse=True, scope="module")
def _no_agent_store():
    """The sealer hosts no TCPStore for the workers (it names a free port instead): creating
    hundreds in one process stalls 5 s every few dozen, in torch."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        yield


AGENT_CONFIG = RendezvousConfig(backend="etcd", endpoint="etcd0:2379", run_id="fuzz", conf={})


def _is_state_error_for(exc: RendezvousStateError, key: bytes, value: bytes) -> None:
    """The handler's error names the key and what it holds; the agent's adds the fix."""
    event("a state error")
    message = str(exc)
    assert key.decode() in message and repr(value[:60]) in message, message
    stopped = str(_corrupt_state(AGENT_CONFIG, exc))
    assert key.decode() in stopped
    assert "etcdctl --endpoints etcd0:2379 del --prefix /elastic_train/rdzv/fuzz/" in stopped


def _formed(info: RendezvousInfo, round_value: bytes) -> bool:
    """Whether the rendezvous formed the round ``round_value`` names as the handler writes
    round numbers (from the prefix of the store it hands the agent,
    ``torch.rendezvous.<run id>.<round>``, as torch's handler)."""
    if not (round_value.isdigit() and round_value == b"%d" % int(round_value)):
        return False
    info.store.set("probe", b"")
    return info.store.underlying_store.check(
        [f"torch.rendezvous.fuzz.{int(round_value)}/probe"])


def _next_round_or_seal_error(handler, value: bytes) -> RendezvousInfo | None:
    """The round ``handler`` forms over a seal holding ``value``, checked to read, or None
    after checking the state error it raised instead names the seal."""
    try:
        info = handler.next_rendezvous()
    except RendezvousStateError as exc:
        _is_state_error_for(exc, KEYS.seal(0), value)
        assert not _seal_reads(value)
        return None
    finally:
        handler.release()
    assert _seal_reads(value)
    return info


@pytest.mark.timeout(120)
@FUZZ
@given(value=values)
@example(value=b"-3")  # each node would follow a round below 0
@example(value=b"007")  # read as 7, but compared as "7" when the round moves on
@example(value=b" 7\n")
def test_any_round_pointer_is_followed_or_a_state_error(value):
    kv = MemoryKV()
    kv.put(KEYS.round, value, RUN_LEASE)
    handler = native_handler(kv, join_timeout=5)
    try:
        info = handler.next_rendezvous()
    except RendezvousStateError as exc:
        _is_state_error_for(exc, KEYS.round, value)
    else:
        event("followed")
        assert isinstance(info, RendezvousInfo) and (info.rank, info.world_size) == (0, 1)
        assert _formed(info, value)
    finally:
        handler.release()


@pytest.mark.timeout(120)
@FUZZ
@given(value=seal_values)
@example(value=b'[1e999, [], "h", 1]')  # OverflowError: an infinite revision
@example(value=b"[" * 5000)  # RecursionError in json
@example(value=b'"1234"')  # a string of four characters unpacks as four fields
@example(value=b'[5, [0], "h", 29500]')  # two members with one revision
@example(value=b'[5, [], "h", 70000]')  # no such port
@example(value=b'[true, [], "h", 1.5]')
def test_any_seal_of_the_current_round_is_followed_or_a_state_error(value):
    """A node arriving at a sealed round: with the seal read, it waits for the next
    round, and opens it itself (no member of the sealed one is alive)."""
    kv = MemoryKV()
    kv.put(KEYS.round, b"0", RUN_LEASE)
    kv.put(KEYS.seal(0), value, RUN_LEASE)
    info = _next_round_or_seal_error(native_handler(kv, join_timeout=5), value)
    if info is not None:
        event("followed")
        assert isinstance(info, RendezvousInfo) and _formed(info, b"1")


@pytest.mark.timeout(120)
@FUZZ
@given(value=seal_values, sealer=st.booleans())
@example(value=b'[1e999, [], "h", 1]', sealer=False)
@example(value=b"[" * 5000, sealer=True)
def test_a_seal_seen_by_a_watch_is_followed_or_a_state_error(value, sealer):
    """The seal arrives while this node waits for it (another node holds the sealer's
    part) or while it seals the round itself (a second node is needed). A well-formed seal
    without this node: it waits for the next round, which another node then opens."""
    kv = MemoryKV()
    other = kv.grant(15)[0]
    if not sealer:
        kv.put(KEYS.round, b"0", RUN_LEASE)
        kv.put(KEYS.sealer(0), b"another-node", other)
    kv.when_watched(KEYS.seal(0), lambda kv: kv.put(KEYS.seal(0), value, RUN_LEASE))

    def next_round(kv: MemoryKV) -> None:  # a member of round 0 re-joins
        kv.put(KEYS.join(1, "another-node"), b"", other)
        kv.put(KEYS.round, b"1", RUN_LEASE)

    kv.when_watched(KEYS.run, next_round)
    handler = native_handler(kv, min_nodes=1 + sealer, max_nodes=1 + sealer, join_timeout=5)
    info = _next_round_or_seal_error(handler, value)
    if info is not None:
        assert _formed(info, b"0") or _formed(info, b"1")
        event(f"followed: round {0 if _formed(info, b'0') else 1}")


@pytest.mark.timeout(120)
@FUZZ
@given(value=values)
@example(value=b"-1")
def test_a_round_pointer_seen_while_waiting_is_followed_or_a_state_error(value):
    """A node that came late waits for the next round and follows the round pointer's
    changes: here another client writes it. The sealed round has room for it (max 2), so
    it waits counted, bounded by the join timeout (a spare would wait for as long as the
    job runs)."""
    kv = MemoryKV()
    member = kv.grant(15)[0]
    joined = kv.put(KEYS.join(0, "member"), b"", member)
    kv.put(KEYS.round, b"0", RUN_LEASE)
    kv.put(KEYS.seal(0), Seal(joined, (), "127.0.0.1", 29500).encode(), RUN_LEASE)
    kv.when_watched(KEYS.run, lambda kv: kv.put(KEYS.round, value, RUN_LEASE))
    handler = native_handler(kv, max_nodes=2, join_timeout=0.3)
    try:
        info = handler.next_rendezvous()
    except RendezvousStateError as exc:
        _is_state_error_for(exc, KEYS.round, value)
    except RendezvousTimeoutError:  # pointed back at the sealed round, whose member lives
        event("followed back to the sealed round")
        assert value == b"0"
    else:
        event("followed")
        assert _formed(info, value) and value != b"0"
    finally:
        handler.release()


@FUZZ
@given(wanted=values, round_value=values, closed=values)
def test_values_only_compared_or_present_never_raise(wanted, round_value, closed):
    """What a member reads between rounds: whether a node wants the next round (only the
    presence of ``r/1/c/wanted`` counts; ``run/round`` moved alone counts for nothing) and
    ``run/closed``."""
    kv = MemoryKV()
    handler = native_handler(kv, run_id=f"fuzz-{uuid.uuid4().hex[:6]}", join_timeout=5)
    keys = keys_of(handler.get_run_id())
    try:
        handler.next_rendezvous()
        kv.put(keys.round, round_value, RUN_LEASE)
        assert handler.num_nodes_waiting() == 0
        kv.put(keys.wanted(1), wanted, RUN_LEASE)
        assert handler.num_nodes_waiting() == 1
        kv.put(keys.closed, closed, RUN_LEASE)
        assert handler.is_closed()
    finally:
        handler.release()
