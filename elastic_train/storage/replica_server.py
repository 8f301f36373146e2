"""A node's replica server: its local tier over HTTP(S), for the peers that restore from
it and the peers that send it their copies (see :mod:`.peer_replicas`).

One process per node of a multi-node job with a remote store
(``CheckpointConfig.peer_replicas`` > 0), started by the node run
(:func:`start`) beside its agent and ended with it (and with a SIGKILLed driver:
:func:`~.parent_watch.die_with`). A process, not a thread of the driver, so that the
driver stays safe to fork workers from, and so that serving never holds the GIL of
the agent. It knows only the tier's layout (:class:`~.local_tier.TierEntry`) and the
run's group in it (:func:`~.local_tier.run_group`):

* Every request is signed with the node's key (below); one that is not gets 401 with
  an empty body, and its connection is closed.
* ``GET /<run group>/<checkpoint_NNNNNN>/<file>`` (each part URL-quoted): the tier's
  copy of the file, verified or kept (the node's own upload, or a peer's replica);
  404 when it has none, or when a symbolic link is on its way. The reader checks it
  against the manifest's SHA-256; the server vouches for nothing.
* ``PUT`` of the same path with ``X-Sha256`` (the sender's manifest entry) and its
  ``Content-Length``, both signed: stored as a kept copy of the entry once the body
  matches them (201; 400 otherwise, and nothing is kept). Only what the tier would
  keep and prune itself is taken: this run's group and a checkpoint name of the
  tier's own spelling (403 for any other), and no more bytes than the disk has
  free (507).

Connections: the limits of :mod:`elastic_train._internal.bounded_http` (:class:`Limits`),
a connection admitted once it sends a signed request.

Who may use the port (see also docs/SECURITY.md): the node's key is made by the
node run as it starts (:func:`new_key`), handed to its server on a pipe and to its
workers in the worker plan (mode 0600), and shared with the other nodes' ranks in the
all-gather that tells them the server's URL (the job's process group, formed through
the rendezvous). It is never written elsewhere: not in the run directory, a log or
``run.json``.

A request carries ``X-Replica-Auth``: the HMAC-SHA256, under the key, of its method,
its path as sent, and for a ``PUT`` the body's size and SHA-256
(:func:`signature`). The key itself never travels with a request, and a signature
taken off the wire authorizes only the same request again (the same file, the
same bytes). The server compares with :func:`hmac.compare_digest`.

TLS: ``--rdzv-conf replica_cert=...,replica_key=...,replica_ca_cert=...`` (the way the
etcd client takes its ``cert``/``key``/``ca_cert``): every node serves with its
certificate and presents it when it fetches or sends (mutual TLS), and each side
checks the other's against the CA, the server's name included.

Usage: ``python -m elastic_train.storage.replica_server SETTINGS_JSON PARENT_PID``
with the key on stdin; prints ``PORT <n>``.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.server
import json
import os
import re
import resource
import secrets
import select
import shutil
import socket
import ssl
import subprocess
import sys
import urllib.parse
import uuid
from dataclasses import asdict, dataclass, field
from typing import IO, Any

from elastic_train._internal.bounded_http import BoundedHTTPServer, Limits
from elastic_train.errors import ConfigError, CorruptManifestError
from elastic_train.storage.checkpoint_names import dir_name
from elastic_train.storage.local_tier import TierEntry
from elastic_train.storage.manifest import check_relpath, is_sha256

CHUNK = 1 << 20
START_TIMEOUT_S = 30.0
_PATH_RE = re.compile(r"^/([0-9a-f]{16})/(checkpoint_(\d{6,}))/(.+)$")


AUTH_HEADER = "X-Replica-Auth"
SHA256_HEADER = "X-Sha256"
TLS_CONF_KEYS = ("replica_cert", "replica_key", "replica_ca_cert")


def new_key() -> str:
    """A fresh secret key for one node's replica server (256 bits, hex)."""
    return secrets.token_hex(32)


def signature(key: str, method: str, path: str, size: int | None = None,
              sha256: str = "") -> str:
    """The ``X-Replica-Auth`` value of a request (see the module docstring)."""
    message = f"{method}\n{path}\n{'' if size is None else size}\n{sha256}".encode()
    return hmac.new(bytes.fromhex(key), message, hashlib.sha256).hexdigest()


def is_signed(key: str, given: str, method: str, path: str, size: int | None = None,
              sha256: str = "") -> bool:
    """Whether ``given`` is the request's signature under ``key`` (in constant time)."""
    return hmac.compare_digest(given.encode(), signature(key, method, path, size,
                                                         sha256).encode())


@dataclass(frozen=True)
class ReplicaTLS:
    """The certificate a node serves and fetches with, and the CA its peers' are checked
    against (PEM files).

    Attributes:
        cert: This node's certificate; it must name the address the node serves on
            (``launch --local-addr``, else its host name).
        key: Its private key.
        ca: The CA that signed every node's certificate.
    """

    cert: str
    key: str
    ca: str

    @classmethod
    def from_conf(cls, conf: dict[str, Any] | None) -> ReplicaTLS | None:
        """The files the rendezvous conf names (None without any); a ConfigError when
        only some are given, or one is no file."""
        given = [str((conf or {}).get(name) or "") for name in TLS_CONF_KEYS]
        if not any(given):
            return None
        if not all(given):
            raise ConfigError(
                f"--rdzv-conf {', '.join(TLS_CONF_KEYS)}: give all three for TLS on the "
                f"replica port, or none; got {dict(zip(TLS_CONF_KEYS, given, strict=True))}, "
                "e.g. replica_cert=node.crt,replica_key=node.key,replica_ca_cert=ca.crt.",
                field="RendezvousConfig.conf")
        missing = [f"{name}={path}" for name, path in zip(TLS_CONF_KEYS, given, strict=True)
                   if not os.path.isfile(path)]
        if missing:
            raise ConfigError(f"--rdzv-conf {', '.join(missing)}: no such file on this node; "
                              "give the paths of its PEM files.", field="RendezvousConfig.conf")
        return cls(*given)

    def server_context(self) -> ssl.SSLContext:
        """What the replica server wraps its connections with: asks for a peer's
        certificate signed by the CA."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.ca)
        context.load_cert_chain(self.cert, self.key)
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self) -> ssl.SSLContext:
        """What a peer connects with: checks the server against the CA and its name."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        context.load_cert_chain(self.cert, self.key)
        return context


@dataclass(frozen=True)
class NodeReplica:
    """This node's replica server as its workers know it (from the worker plan).

    Attributes:
        url: Where it serves ("": it did not start; the node still fetches from peers).
        key: Its key (:func:`new_key`).
        tls: The node's certificate, when the job has them.
    """

    url: str
    key: str
    tls: ReplicaTLS | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeReplica:
        """The inverse of :func:`dataclasses.asdict` (the worker plan's JSON)."""
        tls = data.get("tls")
        return cls(data["url"], data["key"], ReplicaTLS(**tls) if tls else None)


@dataclass(frozen=True)
class ServerSettings:
    """What a node's server serves, where, and how.

    Attributes:
        root: The node's local tier.
        host: The address to bind (:func:`host_for`).
        group: The run's directory in the tier (:func:`~.local_tier.run_group`); the
            server serves and takes files of no other.
        tls: The node's certificate, when the job has them (None: plain HTTP).
        limits: Its connection limits.
    """

    root: str
    host: str
    group: str
    tls: ReplicaTLS | None = None
    limits: Limits = field(default_factory=Limits)

    @classmethod
    def from_json(cls, text: str) -> ServerSettings:
        data = json.loads(text)
        return cls(data["root"], data["host"], data["group"],
                   ReplicaTLS(**data["tls"]) if data["tls"] else None, Limits(**data["limits"]))


def entry_and_file(root: str, group: str, url_path: str) -> tuple[TierEntry, str] | None:
    """The tier entry and file (unquoted) a request's path names, when it is a file of
    the run's ``group`` in a checkpoint the tier names (and so prunes) itself; None for
    any other path."""
    match = _PATH_RE.match(url_path)
    if match is None:
        return None
    found, name, digits, quoted = match.groups()
    if found != group or name != dir_name(int(digits)):
        return None
    try:
        parts = [urllib.parse.unquote(part, errors="strict") for part in quoted.split("/")]
        if any("/" in part for part in parts):
            return None
        return TierEntry(os.path.join(root, group, name)), check_relpath("/".join(parts))
    except (UnicodeDecodeError, CorruptManifestError):
        return None


def plain_path(base: str, rel: str) -> str | None:
    """``base/rel`` when no symbolic link is on its way from ``base`` (which may itself
    lie below one); None otherwise. What the server reads or writes never leaves the
    tier, nor follows a link someone left in it."""
    path = os.path.join(base, rel)
    return path if os.path.realpath(path) == os.path.join(os.path.realpath(base), rel) \
        else None


def stored_copy(entry: TierEntry, rel: str) -> str | None:
    """The tier's copy of ``rel``: verified first, else kept (verified again: the node
    moves a kept copy there once it checked it); None without one."""
    for base in (entry.verified, entry.kept, entry.verified):
        path = plain_path(base, rel)
        if path is not None and os.path.isfile(path):
            return path
    return None


def receive(target: str, body: IO[bytes], size: int, sha256: str) -> int:
    """Stores ``size`` bytes read from ``body`` at ``target`` if their SHA-256 is
    ``sha256``; the answer's status: 201 once stored, 400 for other bytes, 507 (and
    nothing read) when the disk has not that much room."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if shutil.disk_usage(os.path.dirname(target)).free <= size:
        return 507
    partial = f"{target}.part-{uuid.uuid4().hex[:8]}"
    digest, left = hashlib.sha256(), size
    try:
        with open(partial, "wb") as out:
            while left > 0 and (chunk := body.read(min(CHUNK, left))):
                digest.update(chunk)
                left -= len(chunk)
                out.write(chunk)
        if left or digest.hexdigest() != sha256:
            return 400
        os.replace(partial, target)
        return 201
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)


class _Server(BoundedHTTPServer):
    """The tier's server: :class:`BoundedHTTPServer`, each connection in TLS when the
    job has certificates."""

    def __init__(self, settings: ServerSettings, key: str):
        self.settings, self.key = settings, key
        self._tls = settings.tls.server_context() if settings.tls else None
        super().__init__((settings.host, 0), _Handler, settings.limits)

    def wrap(self, request: socket.socket) -> socket.socket:
        return request if self._tls is None else self._tls.wrap_socket(request,
                                                                        server_side=True)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a peer fetches many files on one connection
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 -- http.server's name
        if not self._signed():
            return
        found = entry_and_file(self.server.settings.root, self.server.settings.group, self.path)
        path = stored_copy(*found) if found else None
        if path is None:
            self._empty(404)
            return
        with open(path, "rb") as f:  # open: a prune that removes it now does not cut it
            size = os.fstat(f.fileno()).st_size
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            self.wfile.flush()
            self.connection.sendfile(f)  # in the kernel where it can: no copies through Python

    def do_PUT(self) -> None:  # noqa: N802
        try:
            size = int(self.headers.get("Content-Length", ""))
        except ValueError:
            size = -1
        sha256 = self.headers.get(SHA256_HEADER, "")
        if not self._signed(size, sha256):
            return
        self.close_connection = True  # unless the whole body is read below
        settings = self.server.settings
        found = entry_and_file(settings.root, settings.group, self.path)
        target = plain_path(found[0].kept, found[1]) if found else None
        if target is None:
            self._empty(403)
        elif size < 0 or not is_sha256(sha256):
            self._empty(400)
        else:
            status = receive(target, self.rfile, size, sha256)
            self.close_connection = status != 201
            self._empty(status)

    def _signed(self, size: int | None = None, sha256: str = "") -> bool:
        """Whether the request is signed with the node's key; answers 401 (and ends the
        connection: a body is never read) when it is not."""
        if is_signed(self.server.key, self.headers.get(AUTH_HEADER, ""), self.command,
                     self.path, size, sha256):
            self.server.admit()
            return True
        self.close_connection = True
        self._empty(401)
        return False

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        """Any other method, a malformed request: its status and nothing else."""
        self.close_connection = True
        self._empty(code)

    def _empty(self, code: int) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # one line per file would flood the node's log


def serve(settings: ServerSettings, key: str) -> None:
    """Serves the tier on a free port of ``settings.host``; prints ``PORT <n>`` once
    listening. Raises its own limit of open files as far as it may, for connections."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):  # an unlimited hard limit: keep the soft
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = _Server(settings, key)
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


def host_for(local_addr: str | None, rendezvous_endpoint: str | None) -> str:
    """The address a node's server binds and its peers use: the node's ``local_addr``;
    else loopback when the nodes meet at a loopback endpoint (all on this machine);
    else the node's name, as torch's agent names it (where that name resolves to a
    loopback address, give ``launch --local-addr``: peers cannot reach it, and restore
    from the store)."""
    if local_addr:
        return local_addr
    host = urllib.parse.urlsplit(f"//{rendezvous_endpoint or ''}").hostname or ""
    if host == "localhost" or host.startswith("127.") or host == "::1":
        return "127.0.0.1"
    return socket.getfqdn()


def start(settings: ServerSettings, key: str, timeout_s: float = START_TIMEOUT_S
          ) -> tuple[subprocess.Popen, str]:
    """Starts this node's server (its tier created if missing) with the node's ``key``
    (handed over on a pipe, never on its command line); returns the process and its URL
    (``http(s)://host:port``). In a session of its own, so that a Ctrl-C at the terminal
    reaches the driver only (it stops the server)."""
    os.makedirs(settings.root, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", __name__, json.dumps(asdict(settings)), str(os.getpid())],
        stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdin is not None
    proc.stdin.write(key + "\n")
    proc.stdin.close()
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("PORT "):
        stop(proc)
        raise OSError(f"the replica server did not start on {settings.host} within "
                      f"{timeout_s:g} s (it said {line!r})")
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    scheme = "https" if settings.tls else "http"
    return proc, f"{scheme}://{host}:{int(line.split()[1])}"


def stop(proc: subprocess.Popen) -> None:
    """Ends a server :func:`start` started."""
    proc.kill()
    proc.wait()
    if proc.stdout:
        proc.stdout.close()


if __name__ == "__main__":
    from elastic_train.storage.parent_watch import die_with

    die_with(int(sys.argv[2]))
    serve(ServerSettings.from_json(sys.argv[1]), sys.stdin.readline().strip())
