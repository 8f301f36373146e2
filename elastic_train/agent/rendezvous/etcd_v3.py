"""An etcd v3 rendezvous backend and c10d store for torch.distributed.elastic.

torch's own etcd rendezvous ("etcd", "etcd-v2") speaks etcd's v2 API, which etcd
3.6 removed. This module speaks v3 through etcd's HTTP/JSON gateway with
``etcd3gw`` (no gRPC or protobuf), and plugs into torch's
``DynamicRendezvousHandler`` as a :class:`RendezvousBackend` plus a
:class:`~torch.distributed.Store`.

Keys: everything of a run lives under ``/elastic_train/rdzv/<run id>/`` (run id
percent-quoted, so one run's prefix never contains another's): ``state`` holds
the rendezvous state, ``store/<key>`` the store's keys.

Lease: every key carries the run's lease, whose id is derived from the run's
prefix, so all nodes of a run share one lease and each keeps it alive from a
daemon thread. The keys thus live while any node of the run does and vanish
``lease_ttl`` seconds after the last one closed its backend or died. Closing one
node's backend deliberately does not delete the run's keys: the other nodes still
need the rendezvous state (a closed state is how torch tells them the run is
over) and the store (torch's exit barrier runs on it). Whoever knows the whole
run is over may call :meth:`EtcdV3RendezvousBackend.delete_keys`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import time
import zlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import etcd3gw
import requests
from etcd3gw.exceptions import Etcd3Exception
from etcd3gw.lease import Lease
from torch.distributed import DistStoreError, Store
from torch.distributed.elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousParameters,
    RendezvousStateError,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from elastic_train.agent.rendezvous import etcd_kv as ops
from elastic_train.agent.rendezvous.etcd_kv import EtcdKV, connection_errors, etcd_answer
from elastic_train.agent.rendezvous.etcd_outage import PatientAdapter

log = logging.getLogger(__name__)

KEY_ROOT = "/elastic_train/rdzv"
DEFAULT_LEASE_TTL = 10
DEFAULT_TIMEOUT = 10.0
DEFAULT_OUTAGE_S = 30.0


def run_prefix(run_id: str) -> str:
    """Where a run's rendezvous keys live in etcd (``etcdctl del --prefix`` removes them)."""
    return f"{KEY_ROOT}/{quote(run_id, safe='')}/"


@dataclass(frozen=True)
class EtcdValue:
    """A key's value and the revision that last modified it (the compare-and-set token)."""

    data: bytes
    mod_revision: int


def etcd_error(exc: Etcd3Exception) -> str:
    """The etcd server's own error message (e.g. "etcdserver: lease already exists").

    etcd's gateway maps one error to different HTTP statuses across versions
    ("lease already exists": 412 from 3.4, 400 from 3.5), so errors are recognised
    by the message in the JSON body, never by the HTTP status or exception class.
    """
    text = getattr(exc, "detail_text", None) or ""
    try:
        body = json.loads(text)
    except ValueError:
        return text
    return str(body.get("message") or body.get("error") or text) \
        if isinstance(body, dict) else text


def _b64(data: bytes) -> str:
    """Base64, as etcd's JSON gateway wants keys and values."""
    return base64.b64encode(data).decode()


def _as_bytes(value: str | bytes) -> bytes:
    """Store values arrive as bytes from C++ callers but may be str from Python ones."""
    return value.encode() if isinstance(value, str) else value


class EtcdV3Keyspace:
    """One run's keys on an etcd v3 server, all written with the run's shared lease.

    Starts a daemon thread that refreshes the lease every third of its TTL
    (:attr:`refresh_interval`), and grants it again should it have expired, until
    :meth:`close`; with ``refresh_thread=False`` the owner calls :meth:`refresh`.
    """

    def __init__(
        self, client: etcd3gw.Etcd3Client, run_id: str, lease_ttl: int = DEFAULT_LEASE_TTL,
        refresh_thread: bool = True,
    ) -> None:
        if not run_id:
            raise ValueError("The run id must be a non-empty string.")
        if lease_ttl < 1:
            raise ValueError(f"The lease TTL must be at least 1 second, not {lease_ttl}.")
        self.client = client
        self.prefix = run_prefix(run_id).encode()
        # Lease ids are positive int64s that any node of the run can compute.
        lease_id = int.from_bytes(hashlib.sha256(self.prefix).digest()[:8], "big") >> 1
        self._lease = Lease(lease_id or 1, client)
        self._lease_ttl = lease_ttl
        self._closed = threading.Event()
        with connection_errors():
            self.refresh_interval = self._ensure_lease() / 3
        self._thread = threading.Thread(
            target=self._keep_alive, name=f"etcd-lease-{run_id}", daemon=True)
        if refresh_thread:
            self._thread.start()

    @property
    def lease_id(self) -> int:
        """The id of the run's shared lease, for keys written outside :meth:`put`."""
        return self._lease.id

    def _ensure_lease(self) -> int:
        """Refreshes the run's lease, granting it first if no node holds it; returns its TTL."""
        with etcd_answer("a lease keep-alive"):
            ttl = self._lease.refresh()
        if ttl > 0:
            return ttl
        try:
            grant = {"ID": self._lease.id, "TTL": self._lease_ttl}
            answer = self.client.post(self.client.get_url("/lease/grant"), json=grant)
            with etcd_answer("a lease grant", answer):
                return int(answer["TTL"])
        except Etcd3Exception as exc:
            if "lease already exists" not in etcd_error(exc):
                raise
            with etcd_answer("a lease keep-alive"):
                return self._lease.refresh()  # another node of the run granted it meanwhile

    def _keep_alive(self) -> None:
        """The lease thread's loop."""
        while not self._closed.wait(self.refresh_interval):
            self.refresh()

    def refresh(self) -> None:
        """Refreshes (or grants again) the run's lease; a failure is logged, not raised."""
        try:
            self._ensure_lease()
        except (Etcd3Exception, requests.RequestException, RendezvousConnectionError,
                ValueError) as exc:
            detail = getattr(exc, "detail_text", None) or exc
            log.warning("Refreshing the etcd lease of %s failed: %s", self.prefix, detail)

    def get(self, key: bytes) -> EtcdValue | None:
        """The key's value, or None if it is absent."""
        with connection_errors(), etcd_answer(f"a read of {key!r}"):
            found = self.client.get(key, metadata=True)
            if not found:
                return None
            data, meta = found[0]
            return EtcdValue(data, int(meta["mod_revision"]))

    def put(
        self, key: bytes, data: bytes, mod_revision: int | None = None
    ) -> tuple[EtcdValue | None, bool]:
        """Puts ``data`` under ``key`` in one transaction, returning (value after it, whether put).

        With ``mod_revision`` the put happens only if the key was last modified at
        that revision, 0 meaning only if the key is absent; else it is unconditional.
        A failed put returns the key's current value (None if absent).
        """
        b64_key = _b64(key)
        txn: dict[str, Any] = {
            "compare": [],
            "success": [
                {"request_put": {"key": b64_key, "value": _b64(data), "lease": self._lease.id}}
            ],
            "failure": [{"request_range": {"key": b64_key}}],
        }
        if mod_revision is not None:
            txn["compare"] = [
                {"key": b64_key, "target": "MOD", "result": "EQUAL", "mod_revision": mod_revision}
            ]
        with connection_errors():
            try:
                result = self.client.transaction(txn)
            except Etcd3Exception as exc:
                if "lease not found" not in etcd_error(exc):
                    raise
                # Every node was silent for a whole TTL; the lease (and its keys) expired.
                self._ensure_lease()
                result = self.client.transaction(txn)
        with etcd_answer("a transaction", result):
            if result.get("succeeded"):
                return EtcdValue(data, int(result["header"]["revision"])), True
            kvs = result["responses"][0]["response_range"].get("kvs")
            if not kvs:
                return None, False
            kv = kvs[0]
            return EtcdValue(base64.b64decode(kv.get("value", ""), validate=True),
                             int(kv["mod_revision"])), False

    def delete(self, key: bytes) -> bool:
        """Deletes the key; returns whether it existed."""
        with connection_errors(), etcd_answer(f"a deletion of {key!r}"):
            return self.client.delete(key)

    def delete_all(self) -> None:
        """Deletes every key of the run at once, and revokes the run's lease."""
        with connection_errors():
            self.client.delete_prefix(self.prefix)
            try:
                self._lease.revoke()
            except Etcd3Exception as exc:
                if "lease not found" not in etcd_error(exc):
                    raise

    def close(self) -> None:
        """Stops refreshing the lease (idempotent); the keys expire a TTL after the last node."""
        self._closed.set()
        if self._thread.is_alive():
            self._thread.join()


_STATE_MAGIC = b"elastic_train.rdzv.v1\n"


def _seal_state(state: bytes) -> bytes:
    """The stored form of a state: a format marker, its CRC-32, then the state."""
    return _STATE_MAGIC + zlib.crc32(state).to_bytes(4, "big") + state


def _open_state(stored: bytes) -> bytes:
    """The state inside :func:`_seal_state`'s form; RendezvousStateError if it is not one
    (written by something else, truncated, or altered)."""
    header = len(_STATE_MAGIC) + 4
    state = stored[header:]
    if not stored.startswith(_STATE_MAGIC) or len(stored) < header \
            or zlib.crc32(state).to_bytes(4, "big") != stored[len(_STATE_MAGIC):header]:
        raise RendezvousStateError(
            "The rendezvous state in etcd is corrupt (not written by this backend, or "
            "altered); delete the run's keys or use another --rdzv-id.")
    return state


class EtcdV3RendezvousBackend(RendezvousBackend):
    """Holds torch's rendezvous state under ``<run prefix>state``.

    The fencing token is the state key's ``mod_revision``, so ``set_state`` is a
    single etcd transaction: put if the key's mod_revision still equals the
    token (or, for token None, if the key is absent), else read the key back.
    A token that is not one this backend issues (a positive int) matches no
    state: the current one comes back, as torch's contract wants. The state is
    stored with a checksum, so a corrupt one raises RendezvousStateError.
    """

    def __init__(self, keyspace: EtcdV3Keyspace, name: str = "etcd-v3") -> None:
        self._keyspace = keyspace
        self._key = keyspace.prefix + b"state"
        self._name = name

    @property
    def name(self) -> str:
        """The registry name; torch checks it equals ``RendezvousParameters.backend``."""
        return self._name

    @property
    def state_key(self) -> bytes:
        """The etcd key holding the state."""
        return self._key

    def get_state(self) -> tuple[bytes, Token] | None:
        """See base class."""
        value = self._keyspace.get(self._key)
        return None if value is None else (_open_state(value.data), value.mod_revision)

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        """See base class; returns None only if the state is absent and could not be set."""
        if token is None:
            value, succeeded = self._keyspace.put(self._key, _seal_state(state), 0)
        elif isinstance(token, int) and not isinstance(token, bool) and token > 0:
            value, succeeded = self._keyspace.put(self._key, _seal_state(state), token)
        else:  # never issued by us: nothing to compare with, so nothing is set
            value, succeeded = self._keyspace.get(self._key), False
        return None if value is None else (_open_state(value.data), value.mod_revision, succeeded)

    def close(self) -> None:
        """Stops this node's lease refresh; see the module docstring for why keys stay."""
        self._keyspace.close()

    def delete_keys(self) -> None:
        """Deletes the run's state and store keys now, for when the whole run is over."""
        self._keyspace.delete_all()


class EtcdV3Store(Store):
    """A c10d store over a run's etcd keys (``<run prefix>store/<key>``).

    The rendezvous handlers hand it out, prefixed per round, for torch's agent to
    assign worker ranks, share the master address and run its exit barrier. A read
    of a key not yet there watches that key (no polling), so it returns as soon as
    another node sets it.
    """

    def __init__(self, keyspace: EtcdV3Keyspace, timeout: timedelta | None = None) -> None:
        super().__init__()  # the pybind trampoline requires it
        self._keyspace = keyspace
        self._kv: EtcdKV | None = None
        if timeout is not None:
            self.set_timeout(timeout)

    def _key(self, key: str) -> bytes:
        return self._keyspace.prefix + b"store/" + key.encode()

    def set(self, key: str, value: str | bytes) -> None:
        """Sets the key's value."""
        self._keyspace.put(self._key(key), _as_bytes(value))

    def get(self, key: str) -> bytes:
        """The key's value, waiting up to the store's timeout; raises DistStoreError after."""
        return self._wait([key], self.timeout)[0]

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        """Waits until all keys exist, up to ``timeout`` or the store's; raises DistStoreError."""
        self._wait(keys, self.timeout if timeout is None else timeout)

    def check(self, keys: list[str]) -> bool:
        """Whether all keys exist now."""
        return all(self._keyspace.get(self._key(key)) is not None for key in keys)

    def add(self, key: str, amount: int) -> int:
        """Atomically adds ``amount`` to the key's decimal value (absent: 0); returns the sum.
        DistStoreError if the key holds no number (a TCPStore fails too)."""
        etcd_key = self._key(key)
        current = self._keyspace.get(etcd_key)
        while True:
            try:
                total = amount + (int(current.data) if current else 0)
            except ValueError:
                raise DistStoreError(
                    f"etcd key {etcd_key.decode(errors='replace')} holds {current.data[:60]!r}, "
                    f"not a number to add {amount} to") from None
            revision = current.mod_revision if current else 0
            current, done = self._keyspace.put(etcd_key, str(total).encode(), revision)
            if done:
                return total

    def compare_set(
        self, key: str, expected_value: str | bytes, desired_value: str | bytes
    ) -> bytes:
        """c10d's compare-and-set: sets ``desired_value`` if the key holds ``expected_value``
        (an empty one also matching an absent key); returns the key's value afterwards, or
        ``expected_value`` if the key is absent and was not set (as TCPStore does)."""
        etcd_key = self._key(key)
        expected, desired = _as_bytes(expected_value), _as_bytes(desired_value)
        current = self._keyspace.get(etcd_key)
        while True:
            if current is None and expected:
                return expected
            if current is not None and current.data != expected:
                return current.data
            revision = current.mod_revision if current else 0
            current, done = self._keyspace.put(etcd_key, desired, revision)
            if done:
                return desired

    def delete_key(self, key: str) -> bool:
        """Deletes the key; returns whether it existed."""
        return self._keyspace.delete(self._key(key))

    def _wait(self, keys: list[str], timeout: timedelta) -> list[bytes]:
        """The keys' values once all exist, watching for the missing ones until ``timeout``."""
        deadline = time.monotonic() + timeout.total_seconds()
        if self._kv is None:
            self._kv = EtcdKV(self._keyspace.client)
        wanted = [self._key(key) for key in keys]
        found = self._kv.read(*[ops.get(key) for key in wanted])
        values = {key: kvs[0].value for key, kvs in zip(wanted, found.ranges, strict=True) if kvs}
        for key in wanted:
            if key in values:
                continue
            watch = self._kv.watch(key, found.revision + 1, prefix=False)
            try:
                while key not in values:
                    events = watch.next(deadline - time.monotonic())
                    if events is None:
                        missing = [k.decode() for k in wanted if k not in values]
                        raise DistStoreError(f"Timed out after {timeout} waiting for etcd "
                                             f"keys {missing}")
                    values.update((e.kv.key, e.kv.value) for e in events if not e.deleted)
            finally:
                watch.cancel()
        return [values[key] for key in wanted]


class _AuthSession(requests.Session):
    """A requests session that logs in to etcd (v3 auth) and sends the token on each call.

    etcd3gw has no auth support. The token is fetched on first use and once more
    when etcd answers 401 (expired token); the password is kept for that only and
    is never logged. Calls before ``login_url`` is set (etcd3gw's ``/version``
    probe) and the login itself go without a token.
    """

    def __init__(self, username: str, password: str) -> None:
        super().__init__()
        self.login_url: str | None = None
        self._credentials = {"name": username, "password": password}
        self._token: str | None = None
        self._lock = threading.Lock()

    def request(self, method: Any, url: Any, *args: Any, **kwargs: Any) -> requests.Response:
        """Sends the request with the auth token, logging in again once on a 401."""
        if self.login_url is None or url == self.login_url:
            return super().request(method, url, *args, **kwargs)
        headers = dict(kwargs.pop("headers", None) or {})
        headers["Authorization"] = self._token or self._login(stale=None)
        response = super().request(method, url, *args, headers=headers, **kwargs)
        if response.status_code == 401:
            headers["Authorization"] = self._login(stale=headers["Authorization"])
            response = super().request(method, url, *args, headers=headers, **kwargs)
        return response

    def _login(self, stale: str | None) -> str:
        """A fresh token, unless another thread already replaced the ``stale`` one."""
        with self._lock:
            if self._token is None or self._token == stale:
                assert self.login_url is not None
                response = self.post(
                    self.login_url, json=self._credentials, timeout=DEFAULT_TIMEOUT
                )
                response.raise_for_status()
                self._token = str(response.json()["token"])
            return self._token


def create_client(params: RendezvousParameters) -> etcd3gw.Etcd3Client:
    """An etcd3gw client for ``params.endpoint`` with the TLS and auth options of ``params``."""
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=2379)
    protocol = str(params.get("protocol", "http")).strip().lower()
    if protocol not in ("http", "https"):
        raise ValueError(f"The etcd protocol must be http or https, not {protocol!r}.")
    username = params.get("username")
    session = (
        _AuthSession(username, str(params.get("password", ""))) if username else requests.Session()
    )
    adapter = PatientAdapter(float(params.get("outage_timeout", DEFAULT_OUTAGE_S)))
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    ca_cert, cert, key = params.get("ca_cert"), params.get("cert"), params.get("key")
    if ca_cert:
        session.verify = ca_cert
    elif protocol == "http":  # no TLS: spares requests a look for CA files on every call
        session.verify = False
    # Nor look for proxies and .netrc files on every call: etcd is reached directly.
    session.trust_env = False
    if cert:
        session.cert = (cert, key) if key else cert
    client = etcd3gw.Etcd3Client(
        host=host,
        port=port,
        protocol=protocol,
        timeout=float(params.get("timeout", DEFAULT_TIMEOUT)),
        session=session,
    )
    if isinstance(session, _AuthSession):
        with connection_errors():  # get_url asks etcd for its version, to pick the API path
            session.login_url = client.get_url("/auth/authenticate")
    return client


def create_backend(params: RendezvousParameters) -> tuple[EtcdV3RendezvousBackend, EtcdV3Store]:
    """The backend and store for torch's ``create_handler``, from the rendezvous parameters.

    ``params.endpoint`` is ``host[:port]`` (port 2379 by default); ``--rdzv-conf``
    keys: ``protocol`` (http/https), ``ca_cert``, ``cert``, ``key`` (TLS files),
    ``username``/``password`` (etcd auth), ``lease_ttl`` (seconds, default 10),
    ``timeout`` (seconds per etcd request, default 10) and ``outage_timeout``
    (seconds an unreachable etcd is waited for, default 30). The backend is named after
    ``params.backend``, as torch's registry requires.
    """
    lease_ttl = int(params.get("lease_ttl", DEFAULT_LEASE_TTL))
    keyspace = EtcdV3Keyspace(create_client(params), params.run_id, lease_ttl)
    return EtcdV3RendezvousBackend(keyspace, params.backend), EtcdV3Store(keyspace)
