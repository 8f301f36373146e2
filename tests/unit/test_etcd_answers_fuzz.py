"""What etcd's HTTP gateway answers comes from the network: whatever shape an answer has,
our etcd calls read it or raise RendezvousConnectionError naming it (as for a server that
cannot be reached), never a KeyError, TypeError, ... (#24: fuzz what comes from the
network). The answers read: a transaction's (every read and write of both etcd handlers),
a lease grant, a lease keep-alive (lines of JSON), a watch (a stream of lines), and
etcd3gw's reads, deletions and lease refreshes for the run's keyspace.

A fake etcd3gw client answers with the fuzzed value; no server.
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
from types import SimpleNamespace

import etcd3gw
import pytest
import requests
import urllib3
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st
from torch.distributed.elastic.rendezvous import RendezvousConnectionError, RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import handler_registry

from elastic_train._internal.rendezvous_backends import lookup
from elastic_train.agent.rendezvous.etcd_kv import (
    EtcdKV,
    Event,
    KeyValue,
    TxnResult,
    Watch,
    connection_errors,
)
from elastic_train.agent.rendezvous.etcd_v3 import EtcdV3Keyspace, EtcdValue
from elastic_train.agent.rendezvous.registry import register

FUZZ = settings(max_examples=300, deadline=None, database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow])

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                           max_leaves=10)
numbers = st.integers(0, 99).map(str) | scalars
b64s = st.binary(max_size=8).map(lambda b: base64.b64encode(b).decode()) | scalars
kvs = st.fixed_dictionaries({}, optional={"key": b64s, "value": b64s,
                                          "create_revision": numbers,
                                          "mod_revision": numbers, "lease": numbers})
responses = st.fixed_dictionaries({}, optional={
    "response_range": st.fixed_dictionaries({}, optional={
        "kvs": st.lists(kvs, max_size=2) | json_values, "count": numbers}) | json_values,
    "response_txn": st.fixed_dictionaries({}, optional={"succeeded": scalars}) | json_values})
# Answers shaped almost as etcd's, and anything.
txn_answers = st.fixed_dictionaries({}, optional={
    "header": st.fixed_dictionaries({}, optional={"revision": numbers}) | json_values,
    "succeeded": scalars, "responses": st.lists(responses, max_size=3) | json_values}) \
    | json_values
grant_answers = st.fixed_dictionaries({}, optional={"ID": numbers, "TTL": numbers}) \
    | json_values
lines = st.lists(st.fixed_dictionaries({}, optional={
    "result": st.fixed_dictionaries({}, optional={
        "ID": numbers, "TTL": numbers, "canceled": scalars,
        "events": st.lists(st.fixed_dictionaries({}, optional={
            "type": st.sampled_from(["PUT", "DELETE"]) | scalars, "kv": kvs | json_values}),
            max_size=2) | json_values}) | json_values}) | json_values, max_size=3).map(
    lambda items: "\n".join(json.dumps(i) for i in items)) | st.text(max_size=30)


class Answering:
    """A requests session for etcd3gw's client whose every request answers ``answer`` (as
    JSON) or ``text`` (the lines of a keep-alive or a watch)."""

    def __init__(self, answer: object = None, text: str = "") -> None:
        self.answer, self.text = answer, text

    def post(self, url: str, *args, **kwargs) -> SimpleNamespace:
        return SimpleNamespace(status_code=200, reason="OK", text=self.text,
                               json=lambda: self.answer, raise_for_status=lambda: None,
                               iter_lines=lambda: iter(self.text.encode().splitlines()),
                               close=lambda: None)


def client(session: Answering) -> etcd3gw.Etcd3Client:
    return etcd3gw.Etcd3Client(host="etcd0", port=2379, session=session, api_path="/v3/",
                               timeout=1)


def _named(exc: RendezvousConnectionError, what: str) -> None:
    event("a connection error")
    assert f"etcd answered {what}" in str(exc) and "etcd v3" in str(exc), exc


@FUZZ
@given(answer=txn_answers)
@example(answer={})  # was KeyError: 'header'
@example(answer=[])  # was AttributeError
@example(answer={"header": {"revision": "7"}, "responses": [
    {"response_range": {"kvs": [{"key": "!!"}]}}]})  # was read as the key b""
def test_any_transaction_answer_reads_or_is_a_connection_error(answer):
    try:
        result = EtcdKV(client(Answering(answer))).txn([], [])
    except RendezvousConnectionError as exc:
        _named(exc, "a transaction")
    else:
        event("read")
        assert isinstance(result, TxnResult) and isinstance(result.revision, int)
        assert all(isinstance(kv, KeyValue) for found in result.ranges for kv in found)


@FUZZ
@given(answer=grant_answers)
@example(answer={"ID": "x", "TTL": 5})  # was ValueError
def test_any_lease_grant_answer_reads_or_is_a_connection_error(answer):
    try:
        lease, ttl = EtcdKV(client(Answering(answer))).grant(5)
    except RendezvousConnectionError as exc:
        _named(exc, "a lease grant")
    else:
        event("read")
        assert isinstance(lease, int) and isinstance(ttl, int)


@FUZZ
@given(text=lines)
@example(text='{"result": 5}')  # was TypeError
@example(text="not json")  # was a JSONDecodeError
def test_any_keep_alive_answer_reads_or_is_a_connection_error(text):
    try:
        ttls = EtcdKV(client(Answering(text=text))).keep_alive([1, 2])
    except RendezvousConnectionError as exc:
        _named(exc, "a lease keep-alive")
    else:
        event("read")
        assert all(isinstance(k, int) and isinstance(v, int) for k, v in ttls.items())


@FUZZ
@given(text=lines)
@example(text='{"result": {"events": [{}]}}')  # was KeyError: 'kv'
@example(text='{"result": {"created": true, "header": {}}}')  # a watch from now: no revision
def test_any_watch_stream_reads_or_is_a_connection_error(text):
    watch = Watch(EtcdKV(client(Answering())), b"k", 0, prefix=True)
    try:
        for events in watch._stream(Answering(text=text).post("/v3/watch"), 0):
            assert all(isinstance(e, Event) and isinstance(e.kv, KeyValue) for e in events)
    except RendezvousConnectionError as exc:
        _named(exc, "a watch")
    except requests.ConnectionError:  # the stream ended (or etcd cancelled it): reopened
        event("read to its end")


@FUZZ
@given(answer=json_values | st.fixed_dictionaries({}, optional={
    "succeeded": scalars, "header": st.fixed_dictionaries({"revision": numbers}),
    "kvs": st.lists(kvs, max_size=2), "deleted": scalars,
    "responses": st.lists(responses, max_size=2), "result": json_values}))
@example(answer={"result": {"TTL": "x"}})
def test_the_run_keyspace_reads_any_answer_or_raises_a_connection_error(answer):
    """EtcdV3Keyspace (both handlers' run keys, etcd-v3's state): its lease refresh, reads,
    writes and deletions, through etcd3gw's client."""
    session = Answering({"result": {"TTL": 5}})
    keyspace = EtcdV3Keyspace(client(session), "fuzz", refresh_thread=False)
    session.answer = answer
    keyspace.refresh()  # logs what it cannot read, never raises: it runs in a thread
    for call, what in ((lambda: keyspace.get(b"k"), "a read of"),
                       (lambda: keyspace.put(b"k", b"v", 3), "a transaction"),
                       (lambda: keyspace.delete(b"k"), "a deletion of")):
        try:
            result = call()
        except RendezvousConnectionError as exc:
            _named(exc, what)
        else:
            event("read")
            assert result is None or isinstance(result, (bool, EtcdValue, tuple))


class _DeepJSON(http.server.BaseHTTPRequestHandler):
    """Whatever is asked, JSON nested deeper than Python's json can read."""

    ANSWER = b"[" * 100_000 + b"]" * 100_000

    def do_GET(self) -> None:  # noqa: N802 -- http.server's name
        self._answer()

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def _answer(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.ANSWER)))
        self.end_headers()
        self.wfile.write(self.ANSWER)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def deep_json_endpoint():
    """A real HTTP server on 127.0.0.1 that is no etcd: it answers deeply nested JSON."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DeepJSON)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["etcd", "etcd-v3"])
def test_an_endpoint_answering_deep_json_is_a_connection_error(deep_json_endpoint, backend):
    """Was a bare RecursionError from inside etcd3gw (stop 24's note): both handlers
    now say that the endpoint answered as no etcd v3 server does."""
    register(lookup(backend, "test"))  # the agent does this before asking torch's registry
    params = RendezvousParameters(backend, deep_json_endpoint, "deep", 1, 1,
                                  local_addr="127.0.0.1", timeout=2, outage_timeout=0)
    with pytest.raises(RendezvousConnectionError, match="nested too deeply.*etcd v3"):
        handler = handler_registry.create_handler(params)
        handler.next_rendezvous()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["etcd", "etcd-v3"])
def test_tls_asked_of_a_plain_http_endpoint_says_so(deep_json_endpoint, backend):
    """protocol=https against a server of plain HTTP: the error hints at the TLS mismatch,
    not only the handshake's own words."""
    register(lookup(backend, "test"))
    params = RendezvousParameters(backend, deep_json_endpoint, "tls", 1, 1,
                                  local_addr="127.0.0.1", timeout=2, outage_timeout=0,
                                  protocol="https")
    with pytest.raises(RendezvousConnectionError, match="asked over TLS.*drop protocol=https"):
        handler = handler_registry.create_handler(params)
        handler.next_rendezvous()


def test_a_connection_reset_over_tls_gets_the_hint_and_over_http_not():
    """What a plain etcd does to a TLS handshake, as users saw it: "Connection reset by
    peer"; the hint is given for https only."""
    def reset(url: str) -> requests.ConnectionError:
        aborted = urllib3.exceptions.ProtocolError(
            "Connection aborted.", ConnectionResetError(104, "Connection reset by peer"))
        return requests.ConnectionError(aborted, request=requests.Request("POST", url).prepare())

    for url, hinted in (("https://10.0.0.1:2379/v3/kv/range", True),
                        ("http://10.0.0.1:2379/v3/kv/range", False)):
        with pytest.raises(RendezvousConnectionError) as info, connection_errors():
            raise reset(url)
        assert "Connection reset by peer" in str(info.value)
        assert ("drop protocol=https" in str(info.value)) is hinted, info.value
