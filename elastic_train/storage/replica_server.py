"""A node's replica server: its local tier over HTTP, for the peers that restore from it
and the peers that send it their copies (see :mod:`.peer_replicas`).

One process per node of a multi-node job with a remote store
(``CheckpointConfig.peer_replicas`` > 0), started by the node run
(:func:`start`) beside its agent and ended with it (and with a SIGKILLed driver:
:func:`~.parent_watch.die_with`). A process, not a thread of the driver, so that the
driver stays safe to fork workers from, and so that serving never holds the GIL of
the agent. It knows only the tier's layout (:class:`~.local_tier.TierEntry`):

* ``GET /<run group>/<checkpoint_NNNNNN>/<file>``: the tier's copy of the file,
  verified or kept (the node's own upload, or a peer's replica); 404 when it has none.
  The reader checks it against the manifest; the server vouches for nothing.
* ``PUT`` of the same path with ``X-Crc32`` (the writer's CRC-32, the manifest's
  number): stored as a kept copy of the entry once the body matches it and its
  ``Content-Length``; 400 otherwise, and nothing is kept.

The tier prunes replicas with its own entries. Like the c10d store's port, this port
belongs on the network only the job's nodes reach: it has no authentication (a
writer can fill the tier's disk, but what it sends is used only when it matches a
committed manifest).

Usage: ``python -m elastic_train.storage.replica_server ROOT HOST`` prints ``PORT <n>``.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import select
import socket
import subprocess
import sys
import urllib.parse
import uuid
import zlib

from elastic_train.errors import CorruptManifestError
from elastic_train.storage.local_tier import TierEntry, confined

CHUNK = 1 << 20
START_TIMEOUT_S = 30.0
_PATH_RE = re.compile(r"^/([0-9a-f]{16})/(checkpoint_\d{6,})/(.+)$")


def entry_and_file(root: str, url_path: str) -> tuple[TierEntry, str] | None:
    """The tier entry and file a request's path names; None for any other path."""
    match = _PATH_RE.match(url_path)
    if match is None:
        return None
    group, name, rel = match.groups()
    entry = TierEntry(os.path.join(root, group, name))
    try:
        confined(entry.verified, rel)
    except CorruptManifestError:
        return None
    return entry, rel


def stored_copy(entry: TierEntry, rel: str) -> str | None:
    """The tier's copy of ``rel``: verified first, else kept (verified again: the node
    moves a kept copy there once it checked it); None without one."""
    for base in (entry.verified, entry.kept, entry.verified):
        path = confined(base, rel)
        if os.path.isfile(path):
            return path
    return None


def receive(entry: TierEntry, rel: str, body: object, size: int, crc32: str) -> bool:
    """Stores ``size`` bytes read from ``body`` as the entry's kept copy of ``rel`` if
    their CRC-32 is ``crc32``; whether it did."""
    target = confined(entry.kept, rel)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    partial = f"{target}.part-{uuid.uuid4().hex[:8]}"
    crc, left = 0, size
    try:
        with open(partial, "wb") as out:
            while left > 0 and (chunk := body.read(min(CHUNK, left))):  # type: ignore[attr-defined]
                crc, left = zlib.crc32(chunk, crc), left - len(chunk)
                out.write(chunk)
        if left or f"{crc:08x}" != crc32:
            return False
        os.replace(partial, target)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a peer fetches many files on one connection
    root = ""

    def do_GET(self) -> None:  # noqa: N802 -- http.server's name
        found = entry_and_file(self.root, self.path)
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
        found = entry_and_file(self.root, self.path)
        size = int(self.headers.get("Content-Length", "-1"))
        crc32 = self.headers.get("X-Crc32", "")
        if found is None or size < 0 or not re.fullmatch(r"[0-9a-f]{8}", crc32):
            self.close_connection = True  # the body was not read
            self._empty(400)
            return
        ok = receive(*found, self.rfile, size, crc32)
        if not ok:
            self.close_connection = True
        self._empty(201 if ok else 400)

    def _empty(self, code: int) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # one line per file would flood the node's log


def serve(root: str, host: str) -> None:
    """Serves ``root`` on a free port of ``host``; prints ``PORT <n>`` once listening."""
    handler = type("Handler", (_Handler,), {"root": root})
    server = http.server.ThreadingHTTPServer((host, 0), handler)
    server.daemon_threads = True
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


def start(root: str, host: str, timeout_s: float = START_TIMEOUT_S
          ) -> tuple[subprocess.Popen, str]:
    """Starts this node's server on ``root`` (created if missing), bound to ``host``;
    returns the process and its URL (``http://host:port``). In a session of its own, so
    that a Ctrl-C at the terminal reaches the driver only (it stops the server)."""
    os.makedirs(root, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", __name__, root, host, str(os.getpid())],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("PORT "):
        stop(proc)
        raise OSError(f"the replica server did not start on {host} within {timeout_s:g} s "
                      f"(it said {line!r})")
    bracketed = f"[{host}]" if ":" in host else host
    return proc, f"http://{bracketed}:{int(line.split()[1])}"


def stop(proc: subprocess.Popen) -> None:
    """Ends a server :func:`start` started."""
    proc.kill()
    proc.wait()
    if proc.stdout:
        proc.stdout.close()


if __name__ == "__main__":
    from elastic_train.storage.parent_watch import die_with

    die_with(int(sys.argv[3]))
    serve(sys.argv[1], sys.argv[2])
