"""The etcd v3 calls the native rendezvous makes: transactions, ranges, leases and watches.

Through etcd's HTTP/JSON gateway on the ``requests`` session of an ``etcd3gw``
client (built by :func:`elastic_train.agent.rendezvous.etcd_v3.create_client`,
which brings TLS, auth and waiting out a restarting server), so no gRPC or
protobuf is needed. A watch is one streaming HTTP request; :class:`Watch` reads
it in the calling thread until the first events or a timeout, and can be
cancelled from another thread.
"""

from __future__ import annotations

import base64
import json
import logging
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import etcd3gw
import requests
import urllib3
from etcd3gw.exceptions import Etcd3Exception
from requests.adapters import HTTPAdapter
from torch.distributed.elastic.rendezvous import RendezvousConnectionError

from elastic_train.agent.rendezvous.etcd_outage import Outage, PatientAdapter

log = logging.getLogger(__name__)

_TOO_DEEP = ("etcd answered with JSON nested too deeply to read, which etcd v3's gateway "
             "never sends; is the rendezvous endpoint an etcd v3 server?")


_TLS_HINT = ("; it was asked over TLS (--rdzv-conf protocol=https), and the handshake "
             "failed or was cut: an etcd that serves plain HTTP answers TLS so. If it does, "
             "drop protocol=https; if it serves TLS, check ca_cert=, cert= and key=")


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps: its cause or context, and the exceptions in its args
    (urllib3's ProtocolError carries the reset connection's error there)."""
    seen, todo = set(), [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [e for e in (current.__cause__, current.__context__, *current.args)
                 if isinstance(e, BaseException)]


def _tls_hint(exc: BaseException) -> str:
    """For a request over https that met a TLS error or a reset connection: the hint that
    the etcd there may serve plain HTTP (a reset is all a user sees of that mistake)."""
    causes = list(_causes(exc))  # etcd3gw wraps requests' error (which has the URL)
    urls = [str(getattr(getattr(e, "request", None), "url", "") or "") for e in causes]
    tls = (ssl.SSLError, requests.exceptions.SSLError, ConnectionResetError)
    return _TLS_HINT if any(url.startswith("https://") for url in urls) \
        and any(isinstance(e, tls) for e in causes) else ""


@contextmanager
def connection_errors() -> Iterator[None]:
    """Turns etcd and HTTP failures into torch's RendezvousConnectionError, and an answer
    whose JSON is nested too deeply to decode (json raises RecursionError inside etcd3gw)
    into one that says the endpoint is no etcd."""
    try:
        yield
    except (Etcd3Exception, requests.RequestException, urllib3.exceptions.HTTPError) as exc:
        detail = getattr(exc, "detail_text", None) or exc
        raise RendezvousConnectionError(
            f"The etcd request failed: {detail}{_tls_hint(exc)}") from exc
    except RecursionError:
        raise RendezvousConnectionError(_TOO_DEEP) from None


@contextmanager
def etcd_answer(what: str, answer: object = None) -> Iterator[None]:
    """Reading etcd's ``answer`` to ``what``: one not shaped as etcd v3's gateway answers
    (a KeyError, TypeError, ... while reading it) is a RendezvousConnectionError naming it,
    as for a server that cannot be reached -- whatever listens there is no etcd v3."""
    try:
        yield
    except RecursionError:
        raise RendezvousConnectionError(_TOO_DEEP) from None
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        shown = "" if answer is None else f" with {str(answer)[:200]}"
        raise RendezvousConnectionError(
            f"etcd answered {what}{shown}, not as etcd v3's gateway does ({type(exc).__name__}: "
            f"{exc}); is the rendezvous endpoint an etcd v3 server?") from None


def b64(data: bytes) -> str:
    """Base64, as etcd's JSON gateway wants keys and values."""
    return base64.b64encode(data).decode()


def prefix_end(prefix: bytes) -> bytes:
    """The end of the key range that holds every key starting with ``prefix``."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


@dataclass(frozen=True)
class KeyValue:
    """One key as etcd returns it."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int

    @staticmethod
    def of(kv: dict[str, Any]) -> KeyValue:
        return KeyValue(base64.b64decode(kv["key"], validate=True),
                        base64.b64decode(kv.get("value", ""), validate=True),
                        int(kv.get("create_revision", 0)), int(kv.get("mod_revision", 0)),
                        int(kv.get("lease", 0)))


@dataclass(frozen=True)
class Event:
    """A change seen by a watch: a put (with the new value) or a delete."""

    deleted: bool
    kv: KeyValue


# Request operations and comparisons of a transaction, in the gateway's JSON form.
def put(key: bytes, value: bytes, lease: int = 0) -> dict[str, Any]:
    return {"request_put": {"key": b64(key), "value": b64(value), "lease": str(lease)}}


def get(key: bytes, prefix: bool = False, count_only: bool = False,
        keys_only: bool = False) -> dict[str, Any]:
    request: dict[str, Any] = {"key": b64(key)}
    if prefix:
        request["range_end"] = b64(prefix_end(key))
    if count_only:
        request["count_only"] = True
    if keys_only:
        request["keys_only"] = True
    return {"request_range": request}


def delete(key: bytes, prefix: bool = False) -> dict[str, Any]:
    request = {"key": b64(key)}
    if prefix:
        request["range_end"] = b64(prefix_end(key))
    return {"request_delete_range": request}


def txn(compare: list[dict[str, Any]], success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A transaction nested in another one's operations (etcd 3.3 and later)."""
    return {"request_txn": {"compare": compare, "success": success, "failure": failure or []}}


def absent(key: bytes) -> dict[str, Any]:
    """Compares true when ``key`` does not exist."""
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}


def value_is(key: bytes, value: bytes) -> dict[str, Any]:
    """Compares true when ``key`` holds ``value``."""
    return {"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(value)}


@dataclass(frozen=True)
class TxnResult:
    """Whether the comparisons held, the revision after the transaction, and what the
    range operations of the branch taken returned (one list of keys per operation,
    in order; a count-only range gives its count in :attr:`counts`)."""

    succeeded: bool
    revision: int
    ranges: list[list[KeyValue]]
    counts: list[int]
    nested: list[bool]  # whether each nested transaction's comparisons held


class _Direct:
    """POSTs to etcd's gateway on the connection pool of a plain ``requests.Session`` --
    its adapter's TLS settings and its wait for an unreachable etcd (``etcd_outage``) --
    without requests' layers around each call (preparing the request, merging the
    session's settings, cookies, hooks). Those cost more CPU than the call itself: at
    1,024 simulated nodes a re-form spent a quarter less client CPU and about 0.3 s
    less without them (bench figure 9). A session that logs in to etcd adds its token
    to each call itself, so its calls keep going through it (:meth:`of` gives None).
    """

    _HEADERS = {"Content-Type": "application/json"}

    def __init__(self, session: requests.Session, adapter: HTTPAdapter, url: str,
                 timeout: float) -> None:
        prepared = requests.Request("POST", url).prepare()
        self._pool = adapter.get_connection_with_tls_context(prepared, session.verify,
                                                             cert=session.cert)
        adapter.cert_verify(self._pool, url, session.verify, session.cert)
        self._retries = adapter.max_retries
        self._outage = adapter.outage if isinstance(adapter, PatientAdapter) else Outage(0)
        self._timeout = timeout

    @staticmethod
    def of(session: object, url: str, timeout: float) -> _Direct | None:
        """The direct path for ``session``'s calls to ``url``'s server, or None where
        they must go through the session (a subclass, another adapter, requests < 2.32)."""
        if type(session) is not requests.Session:
            return None
        adapter = session.get_adapter(url)
        if type(adapter) not in (HTTPAdapter, PatientAdapter) or not hasattr(
                adapter, "get_connection_with_tls_context"):
            return None
        return _Direct(session, adapter, url, timeout)

    def post(self, url: str, body: bytes) -> bytes:
        """The answer's body; Etcd3Exception with etcd's error for any status but 200."""
        response = self._outage.call(self._timeout, lambda connect: self._pool.urlopen(
            "POST", urllib3.util.parse_url(url).request_uri, body=body, headers=self._HEADERS,
            retries=self._retries, timeout=urllib3.Timeout(connect=connect, read=self._timeout),
            redirect=False, assert_same_host=False, preload_content=True))
        if response.status != 200:
            raise Etcd3Exception(response.data.decode(errors="replace"), response.reason)
        return response.data


class EtcdKV:
    """Transactions, ranges and leases on one etcd server (or cluster endpoint)."""

    def __init__(self, client: etcd3gw.Etcd3Client) -> None:
        self.client = client
        with connection_errors():  # asks etcd for its version, to pick the API path
            self._urls = {name: client.get_url(path) for name, path in (
                ("txn", "/kv/txn"), ("grant", "/lease/grant"),
                ("keepalive", "/lease/keepalive"), ("revoke", "/lease/revoke"),
                ("watch", "/watch"))}
        self._direct = _Direct.of(client.session, self._urls["txn"], float(client.timeout))

    def _post(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        with connection_errors():
            if self._direct is None:
                return self.client.post(self._urls[name], json=body)
            answer = self._direct.post(self._urls[name], json.dumps(body).encode())
            try:
                return json.loads(answer)
            except ValueError:  # as etcd3gw's client, through requests, says it
                raise Etcd3Exception(f"etcd answered {answer[:200]!r}, not JSON") from None

    def txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]],
            failure: list[dict[str, Any]] | None = None) -> TxnResult:
        """Runs one transaction: ``success`` if every comparison holds, else ``failure``."""
        result = self._post("txn", {"compare": compare, "success": success,
                                    "failure": failure or []})
        with etcd_answer("a transaction", result):
            ranges, counts, nested = [], [], []
            for response in result.get("responses", []):
                found = response.get("response_range")
                if found is not None:
                    ranges.append([KeyValue.of(kv) for kv in found.get("kvs", [])])
                    counts.append(int(found.get("count", 0)))
                if "response_txn" in response:
                    nested.append(bool(response["response_txn"].get("succeeded")))
            return TxnResult(bool(result.get("succeeded")), int(result["header"]["revision"]),
                             ranges, counts, nested)

    def read(self, *ops: dict[str, Any]) -> TxnResult:
        """Several ranges read at one revision (a transaction without comparisons)."""
        return self.txn([], list(ops))

    def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease of ``ttl`` seconds (etcd may raise it to its minimum): (id, ttl)."""
        result = self._post("grant", {"TTL": ttl, "ID": 0})
        with etcd_answer("a lease grant", result):
            return int(result["ID"]), int(result["TTL"])

    def keep_alive(self, leases: list[int]) -> dict[int, int]:
        """Refreshes the leases in one call; returns each one's TTL (0: it has expired).

        etcd's keep-alive is a stream; through the gateway one request body may carry
        several requests, answered line by line. etcd 3.5's gateway may end the answer
        before the last lines, so a lease without an answer is missing from the result
        (the caller tries it again).
        """
        body = "\n".join(json.dumps({"ID": str(lease)}) for lease in leases).encode()
        with connection_errors():
            if self._direct is None:
                response = self.client.session.post(
                    self._urls["keepalive"], data=body, timeout=self.client.timeout,
                    headers={"Content-Type": "application/json"})
                response.raise_for_status()
                text = response.text
            else:
                text = self._direct.post(self._urls["keepalive"], body).decode(errors="replace")
        ttls = {}
        with etcd_answer("a lease keep-alive", text):
            for line in text.splitlines():
                result = json.loads(line).get("result", {}) if line.strip() else {}
                if "ID" in result:
                    ttls[int(result["ID"])] = int(result.get("TTL", 0))
        return ttls

    def revoke(self, lease: int) -> None:
        """Ends the lease now, deleting its keys; a lease already gone is fine."""
        try:
            self._post("revoke", {"ID": str(lease)})
        except RendezvousConnectionError as exc:  # only "not found" is ignored
            if "lease not found" not in str(exc):
                raise

    def watch(self, key: bytes, start_revision: int, prefix: bool = True) -> Watch:
        """A watch on ``key`` (or every key under it) from ``start_revision`` on; 0: from
        the moment etcd creates it (see :meth:`Watch.start`)."""
        return Watch(self, key, start_revision, prefix)


class Watch:
    """One watch stream, read by a thread of its own into a queue; :meth:`next` waits for
    the next events, a timeout, or :meth:`cancel` (from any thread). No event is lost
    between calls, and a stream that broke is opened again from the revision after the
    last event seen.

    A watch from a revision etcd has passed starts *unsynced*: etcd replays the history
    to it from a loop that runs every 100 ms and serves at most 512 such watches a turn,
    reading every change since the oldest one's revision. A thousand nodes that each
    watched for a round's seal from their own join's revision were all served so. A
    watch opened from now on (``start_revision`` 0, then :meth:`start`) is *synced*:
    each change reaches it as it is written.
    """

    def __init__(self, kv: EtcdKV, key: bytes, start_revision: int, prefix: bool) -> None:
        self._kv = kv
        self._key = key
        self._prefix = prefix
        self.revision = start_revision  # the first revision not yet seen
        # (the stream it came from, what): a stream replaced by restart() hands nothing on
        self._events: queue.Queue[tuple[int | None, list[Event] | Exception | None]] = \
            queue.Queue()
        self._stream_number = 0
        self._response: requests.Response | None = None
        self._reader: threading.Thread | None = None
        self._cancelled = False
        self._opened_at = 0.0
        self._lock = threading.Lock()
        self._created = threading.Event()
        self._follower: threading.Thread | None = None

    def start(self, timeout: float | None = None) -> None:
        """Opens the stream now and returns once etcd has created the watch, so that no
        change written after this returns is missed (a watch from revision 0 starts at
        its creation); RendezvousConnectionError if etcd did not within ``timeout`` s
        (the client's request timeout by default; the stream is then closed, and opened
        again by the next call). A watch already open is left as is."""
        if self._reader is None:
            self._open()
        if timeout is None:
            timeout = float(self._kv.client.timeout)
        reader, deadline = self._reader, time.monotonic() + timeout
        while reader is not None and not self._created.wait(0.05):
            if not reader.is_alive() or time.monotonic() >= deadline:
                self._end_stream()
                raise RendezvousConnectionError(
                    f"etcd did not create a watch on {self._key!r} within {timeout:g} s"
                    + (" (its stream ended)." if not reader.is_alive() else "."))

    def next(self, timeout: float) -> list[Event] | None:
        """The next events (at least one), or None if none came within ``timeout`` s or
        the watch was cancelled ([] if :meth:`unfollow` woke it). A stream that broke is
        opened again (from the first revision not seen); one that breaks right after
        opening raises RendezvousConnectionError."""
        deadline = time.monotonic() + timeout
        while True:
            if self._reader is None:
                self._open()
            try:
                number, item = self._events.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                return None
            if number is not None and number != self._stream_number:
                continue
            if not isinstance(item, Exception):
                if item:
                    self.revision = max(e.kv.mod_revision for e in item) + 1
                return item
            self._reader = None
            if time.monotonic() - self._opened_at < 1.0:
                with connection_errors():
                    raise item

    def follow(self, on_events: Callable[[list[Event]], None],
               check: Callable[[Exception | None], list[Event]], every: float) -> None:
        """Calls ``on_events`` from a daemon thread for every change, until :meth:`cancel` or
        :meth:`unfollow` (what an open stream queued already comes first). A stream that
        broke (etcd restarting) is opened again from where it stopped. ``check`` is asked
        for the changes the stream did not bring: with the error when it broke and cannot
        be opened there again (etcd compacted that history; ``check`` may :meth:`restart`
        it), and with None after ``every`` seconds without a change (a stream that died
        silently looks just like an idle one). A check that failed makes the watch count
        as broken: its check is tried again each second until it succeeds."""
        def run() -> None:
            broken: Exception | None = None
            while self._follower is threading.current_thread() and not self._cancelled:
                try:
                    if broken is None:
                        events = self.next(every)
                        if events is None and not self._cancelled:
                            events = check(None)
                    else:
                        events, broken = check(broken), None
                except RendezvousConnectionError as exc:
                    if broken is not None:
                        log.warning("An etcd watch broke (%s) and could not be checked "
                                    "(%s); trying again.", broken, exc)
                        time.sleep(1.0)
                    broken = broken or exc
                    continue
                if events:  # even after unfollow(): what was taken is handed on
                    on_events(events)

        self._follower = threading.Thread(target=run, daemon=True, name="etcd-watch-follow")
        self._follower.start()

    def unfollow(self) -> None:
        """Stops :meth:`follow`'s thread, once it handed on what it took; the changes after
        those stay queued for :meth:`next`."""
        follower, self._follower = self._follower, None
        if follower is not None:
            self._events.put((None, []))  # wakes it; next() hands [] on as no change
            follower.join()

    def restart(self, timeout: float | None = None) -> None:
        """Ends the stream and watches anew from now (as :meth:`start`): for a stream that
        cannot resume where it stopped, or that died silently. What the old stream brought
        and was not taken yet is dropped: the caller reads what the keys hold now."""
        self._end_stream()
        self.revision = 0
        self._created.clear()
        self.start(timeout)

    def _end_stream(self) -> None:
        """Closes the stream; nothing it brought is handed on any more."""
        with self._lock:
            self._stream_number += 1
            response, self._response = self._response, None
        _shut(response)
        self._reader = None

    def _open(self) -> None:
        response = self._connect()
        if response is None:
            return
        self._opened_at = time.monotonic()
        self._reader = threading.Thread(target=self._read, args=(response, self._stream_number),
                                        daemon=True, name="etcd-watch")
        self._reader.start()

    def _connect(self) -> requests.Response | None:
        """Opens the stream from :attr:`revision` (None once cancelled)."""
        with self._lock:
            if self._cancelled:
                return None
            request: dict[str, Any] = {"key": b64(self._key)}
            if self.revision:
                request["start_revision"] = str(self.revision)
            if self._prefix:
                request["range_end"] = b64(prefix_end(self._key))
            with connection_errors():
                response = self._kv.client.session.post(
                    self._kv._urls["watch"], json={"create_request": request}, stream=True,
                    timeout=(self._kv.client.timeout, None))
                response.raise_for_status()
            self._response = response
            return response

    def _stream(self, response: requests.Response | None, number: int) -> Iterator[list[Event]]:
        """The changes of stream ``number``, one list per message; raises when it ends.
        etcd's first message says the watch was created, at which revision (:meth:`start`)."""
        if response is None:
            return
        try:
            for line in response.iter_lines():
                if not line.strip():
                    continue
                with etcd_answer("a watch", line):
                    result = json.loads(line).get("result", {})
                    if result.get("created") and number == self._stream_number \
                            and not self._created.is_set():
                        if not self.revision:
                            self.revision = int(result["header"]["revision"]) + 1
                        self._created.set()
                    canceled = result.get("canceled")
                    events = [] if canceled else [
                        Event(e.get("type") == "DELETE", KeyValue.of(e["kv"]))
                        for e in result.get("events", [])]
                if canceled:  # e.g. compacted past our revision
                    raise requests.ConnectionError(f"etcd cancelled the watch: {result}")
                if events:
                    yield events
            raise requests.ConnectionError("etcd closed the watch stream")
        finally:
            response.close()

    def _read(self, response: requests.Response, number: int) -> None:
        """The reader thread of :meth:`next`: queues the changes of stream ``number``."""
        try:
            for events in self._stream(response, number):
                self._events.put((number, events))
        except Exception as exc:  # handed to the waiting thread, which decides
            if not self._cancelled:
                self._events.put((number, exc))

    def cancel(self) -> None:
        """Ends the watch; a :meth:`next` waiting in another thread returns None."""
        with self._lock:
            self._cancelled = True
            response = self._response
        self._events.put((None, None))
        _shut(response)


def _shut(response: requests.Response | None) -> None:
    """Shuts a watch stream's socket down, which wakes its reader blocked in recv."""
    raw = getattr(response, "raw", None)
    connection = getattr(raw, "_connection", None) or getattr(raw, "connection", None)
    sock = getattr(connection, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
