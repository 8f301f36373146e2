"""torch's rendezvous state comes from the c10d store (anyone who reaches its port writes
it) or from etcd (etcd-v3): whatever it holds, torch's handler as the agent builds it
reads it or stops with a RendezvousStateError naming where the state is, and never runs
what a pickle names (#24: fuzz what comes from the network).

Found here: torch unpickles the state (``pickle.loads`` in dynamic_rendezvous.py), so a
pickle written to ``torch.rendezvous.<run id>`` ran code on every agent that read it, and
bytes that are no state escaped as EOFError, AttributeError, ... The state is now checked
first (elastic_train/agent/rendezvous/torch_state.py).
"""

from __future__ import annotations

import base64
import os
import pickle
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from unittest import mock

import pytest
import torch.distributed as dist
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st
from torch.distributed.elastic.rendezvous import (
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
    RendezvousStoreInfo,
    c10d_rendezvous_backend,
)
from torch.distributed.elastic.rendezvous import registry as rdzv_registry
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    _NodeDesc,
    _RendezvousState,
)

from elastic_train._internal.rendezvous_backends import lookup
from elastic_train.agent.api import _corrupt_state
from elastic_train.agent.rendezvous import etcd_v3
from elastic_train.agent.rendezvous.etcd_handler import _leave, create_etcd_v3_handler
from elastic_train.agent.rendezvous.etcd_v3 import (
    EtcdV3RendezvousBackend,
    EtcdV3Store,
    EtcdValue,
    _seal_state,
)
from elastic_train.agent.rendezvous.registry import register
from elastic_train.agent.rendezvous.torch_state import check_state
from elastic_train.rendezvous_config import RendezvousConfig

FUZZ = settings(max_examples=200, deadline=None, database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow])
NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def full_state() -> _RendezvousState:
    """A state with every field set, as torch's handler writes one mid-job."""
    a, b, c = _NodeDesc("node-a", 11, 0), _NodeDesc("node-b", 12, 1), _NodeDesc("node-c", 13, 0)
    state = _RendezvousState()
    state.round, state.complete, state.deadline, state.closed = 4, True, NOW, False
    state.participants = {a: 0, b: 1}
    state.wait_list, state.redundancy_list = {c}, {c}
    state.last_heartbeats = {a: NOW, b: NOW - timedelta(seconds=3), c: NOW}
    return state


class RunsCode:
    """A pickle that calls ``os.system`` (here: creates a file) when unpickled."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


# Strategies: states whose fields are of the right or of a wrong kind, pickled; any value
# pickled; arbitrary bytes.
scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
times = st.sampled_from([NOW, NOW.replace(tzinfo=None), NOW.astimezone(
    timezone(timedelta(hours=5)))])
good_nodes = st.builds(_NodeDesc, st.text(max_size=4), st.integers(0, 9), st.integers(0, 3))
nodes = good_nodes | st.builds(_NodeDesc, scalars, scalars, scalars)
any_value = st.recursive(scalars | times | nodes, lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(scalars | nodes, inner, max_size=3)
                         | st.sets(scalars | nodes, max_size=3), max_leaves=6)
GOOD_FIELDS = {
    "round": st.integers(0, 9),
    "complete": st.booleans(),
    "deadline": st.none() | times.filter(lambda t: t.tzinfo is not None),
    "closed": st.booleans(),
    "participants": st.dictionaries(good_nodes, st.integers(0, 3), max_size=3),
    "wait_list": st.sets(good_nodes, max_size=3),
    "redundancy_list": st.sets(good_nodes, max_size=3),
    "last_heartbeats": st.dictionaries(good_nodes, st.just(NOW), max_size=3),
}


def _state_of(fields: dict, wrong: dict, dropped: list[str]) -> _RendezvousState:
    state = _RendezvousState()
    for name, value in {**fields, **wrong}.items():
        setattr(state, name, value)
    for name in dropped:
        delattr(state, name)
    return state


def _pickled(value) -> bytes:
    try:
        return pickle.dumps(value)
    except (TypeError, pickle.PicklingError, RecursionError):  # e.g. a set of dicts
        return pickle.dumps(None)


# Well-formed states, and states with a field of any kind, or one left out.
field_names = st.sampled_from(sorted(GOOD_FIELDS))
good_states = st.builds(_state_of, st.fixed_dictionaries(GOOD_FIELDS), st.just({}),
                        st.just([])).map(_pickled)
bad_states = st.builds(_state_of, st.fixed_dictionaries(GOOD_FIELDS),
                       st.dictionaries(field_names, any_value, min_size=1, max_size=2),
                       st.just([])) \
    | st.builds(_state_of, st.fixed_dictionaries(GOOD_FIELDS), st.just({}),
                st.lists(field_names, min_size=1, max_size=1))
payloads = st.binary(max_size=64) | any_value.map(_pickled) | good_states \
    | bad_states.map(_pickled)


@pytest.mark.compat  # the check knows torch's private state classes: run on every torch
def test_a_state_torch_writes_passes_the_check():
    for state in (_RendezvousState(), full_state()):
        data = pickle.dumps(state)
        assert check_state(data, "here") is data


@pytest.mark.parametrize("data, why", [
    (b"", "EOFError"),
    (pickle.dumps(7), "holds a int"),
    (pickle.dumps({"round": 1}), "holds a dict"),
    (pickle.dumps(RunsCode("/nonexistent/x")), "refers to posix.system"),
])
def test_anything_else_is_a_state_error_saying_where_and_why(data, why):
    with pytest.raises(RendezvousStateError, match=f"the key k of the store holds .*{why}"):
        check_state(data, "the key k of the store")


@pytest.mark.parametrize("field, value", [
    ("round", -1), ("round", "3"), ("complete", 1), ("deadline", NOW.replace(tzinfo=None)),
    ("participants", {_NodeDesc("a", 1, 0): "0"}), ("participants", [1]),
    ("participants", {_NodeDesc(7, 1, 0): 0}), ("wait_list", frozenset()),
    ("wait_list", {_NodeDesc("a", "1", 0)}), ("last_heartbeats", {_NodeDesc("a", 1, 0): 0.5}),
])
def test_a_field_of_the_wrong_kind_is_a_state_error_naming_it(field, value):
    state = full_state()
    setattr(state, field, value)
    with pytest.raises(RendezvousStateError, match=f"its field '{field}' holds"):
        check_state(pickle.dumps(state), "here")
    delattr(state, field)
    with pytest.raises(RendezvousStateError, match=f"its field '{field}' is missing"):
        check_state(pickle.dumps(state), "here")


# --- c10d: torch's handler, as the agent builds it, over a real TCPStore ------------------

@pytest.fixture(scope="module")
def c10d_store():
    """A TCPStore of our own (what the first node of a c10d job hosts) and its endpoint.
    torch's c10d backend connects to it once per handler; here every handler is handed
    this one (connecting stalls for 5 s every 25 connections or so, in torch 2.14 here)."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=10))
    register(lookup("c10d", "test"))  # the agent does this before asking torch's registry
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(c10d_rendezvous_backend, "_create_tcp_store", lambda params: store)
        yield store, f"127.0.0.1:{store.port}"


def _asked(*questions):
    """The handler's answers, asked from a thread of its own: torch records each failure
    with inspect.stack(), which takes 50 ms under pytest's and hypothesis' frames."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(lambda: [ask() for ask in questions]).result()


def _c10d_handler(endpoint: str, run_id: str, **conf):
    params = RendezvousParameters("c10d", endpoint, run_id, 1, 1, is_host=False,
                                  local_addr="127.0.0.1", **conf)
    return rdzv_registry.get_rendezvous_handler(params)


def _surfaces_as_corrupt_state(exc: RendezvousStateError, endpoint: str, run_id: str):
    """The handler's error names the key; the agent's stops the job, saying what to do."""
    assert f"torch.rendezvous.{run_id}" in str(exc), exc
    config = RendezvousConfig(backend="c10d", endpoint=endpoint, run_id=run_id, conf={})
    stopped = str(_corrupt_state(config, exc))
    assert f"torch.rendezvous.{run_id} of the c10d store" in stopped
    assert "Start every node again" in stopped


def test_a_pickle_in_the_c10d_store_is_refused_and_never_run(c10d_store, tmp_path):
    store, endpoint = c10d_store
    marker = tmp_path / "ran"
    run_id = f"payload-{uuid.uuid4().hex[:8]}"
    store.set(f"torch.rendezvous.{run_id}", base64.b64encode(pickle.dumps(RunsCode(marker))))
    handler = _c10d_handler(endpoint, run_id, join_timeout=5)
    for ask in (handler.num_nodes_waiting, handler.is_closed, handler.next_rendezvous):
        with pytest.raises(RendezvousStateError, match="refers to posix.system") as raised:
            ask()
        _surfaces_as_corrupt_state(raised.value, endpoint, run_id)
    assert not marker.exists(), "the pickle ran code on this agent"


@pytest.mark.timeout(120)
@FUZZ
@given(data=payloads, encoded=st.booleans())
@example(data=b"", encoded=True)  # read as no state (torch's sentinel)
@example(data=b"\x80\x04K\x05.", encoded=True)  # 5: was an AttributeError
@example(data=pickle.dumps(full_state()), encoded=True)
@example(data=b"%%% not a rendezvous state %%%", encoded=False)  # not base64
def test_any_c10d_state_is_read_or_a_state_error(c10d_store, data, encoded):
    """``encoded``: the bytes as torch's backend stores a state (base64), else raw."""
    store, endpoint = c10d_store
    run_id = f"fuzz-{uuid.uuid4().hex[:8]}"
    store.set(f"torch.rendezvous.{run_id}", base64.b64encode(data) if encoded else data)
    handler = _c10d_handler(endpoint, run_id)
    try:
        waiting, closed = _asked(handler.num_nodes_waiting, handler.is_closed)
    except RendezvousStateError as exc:
        event("a state error")
        _surfaces_as_corrupt_state(exc, endpoint, run_id)
    else:
        event("read")
        assert isinstance(waiting, int) and isinstance(closed, bool)


# --- etcd-v3: torch's handler over our etcd backend -------------------------------------

class MemoryKeyspace:
    """The one key an EtcdV3RendezvousBackend reads and writes, in memory."""

    prefix = b"/elastic_train/rdzv/fuzz/"

    def __init__(self, stored: bytes) -> None:
        self.value = EtcdValue(stored, 5)

    def get(self, key: bytes) -> EtcdValue | None:
        return self.value

    def put(self, key: bytes, data: bytes, mod_revision: int | None = None):
        if mod_revision not in (None, self.value.mod_revision):
            return self.value, False
        self.value = EtcdValue(data, self.value.mod_revision + 1)
        return self.value, True

    def close(self) -> None:
        pass


@pytest.mark.timeout(120)
@FUZZ
@given(data=payloads, framed=st.booleans())
@example(data=pickle.dumps(RunsCode("/nonexistent/etcd-v3")), framed=True)
def test_any_etcd_v3_state_is_read_or_a_state_error(data, framed):
    """``framed``: with the marker and checksum our backend writes (a checksum is no
    signature: anyone who may write the key can compute it)."""
    backend = EtcdV3RendezvousBackend(MemoryKeyspace(_seal_state(data) if framed else data),
                                      "etcd-v3")
    params = RendezvousParameters("etcd-v3", "etcd0:2379", "fuzz", 1, 1, local_addr="127.0.0.1")
    with mock.patch.object(etcd_v3, "create_backend", lambda params: (backend, dist.HashStore())):
        handler = create_etcd_v3_handler(params)
    try:
        waiting, closed = _asked(handler.num_nodes_waiting, handler.is_closed)
    except RendezvousStateError as exc:
        event("a state error")
        assert "etcd key /elastic_train/rdzv/fuzz/state" in str(exc)
        config = RendezvousConfig(backend="etcd-v3", endpoint="etcd0:2379", run_id="fuzz",
                                  conf={})
        assert "del --prefix /elastic_train/rdzv/fuzz/" in str(_corrupt_state(config, exc))
    else:
        event("read")
        assert isinstance(waiting, int) and isinstance(closed, bool)


# --- etcd-v3: the count of nodes that left, in the run's store -------------------------

@FUZZ
@given(data=st.binary(max_size=24) | st.integers().map(lambda i: b"%d" % i))
@example(data=b"not a count")
def test_a_count_in_the_etcd_store_adds_up_or_is_a_store_error(data):
    """EtcdV3Store.add (the nodes counting themselves out of the last round) on whatever
    the key holds: a sum, or DistStoreError naming the key (a TCPStore fails too)."""
    keyspace = MemoryKeyspace(data)
    try:
        total = EtcdV3Store(keyspace).add("elastic_train/nodes_left", 1)
    except dist.DistStoreError as exc:
        event("a store error")
        assert "/elastic_train/rdzv/fuzz/store/elastic_train/nodes_left holds" in str(exc)
    else:
        event("added")
        assert total == int(data) + 1 and keyspace.value.data == b"%d" % total


def test_a_node_counting_itself_out_of_an_etcd_v3_job_logs_a_count_nobody_wrote(caplog):
    """What the handler's shutdown does after the job (etcd_handler._leave): it raised a
    ValueError there, after the job had succeeded."""
    keyspace = MemoryKeyspace(b"%%% garbage")
    backend = EtcdV3RendezvousBackend(keyspace, "etcd-v3")
    etcd_store = EtcdV3Store(keyspace)  # kept: the PrefixStore does not keep it alive
    store = dist.PrefixStore("torch.rendezvous.fuzz.0", etcd_store)
    _leave(RendezvousInfo(store, 0, 1, RendezvousStoreInfo("127.0.0.1", 29500)), backend)
    assert "Could not delete the run's etcd keys" in caplog.text
    assert "holds b'%%% garbage'" in caplog.text
