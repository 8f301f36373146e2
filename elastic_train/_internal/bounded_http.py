"""An HTTP server that neither an idle nor a slow client can stall: the replica server's
(:mod:`elastic_train.storage.replica_server`) and the metrics endpoint's
(:mod:`elastic_train.driver.prometheus_endpoint`).

Connections (:class:`Limits`): each read waits at most ``idle_timeout_s``; a connection
must be admitted -- send a request the server takes (the replica server: a signed one;
the metrics endpoint: any whole request) -- within ``admit_timeout_s`` of its accept (a
TLS handshake included) or it is closed; at most ``connections`` are open at once (fewer
when the process may open fewer files), and at the cap a new one closes the oldest
connection not admitted yet, of the address that holds the most such connections -- a
flood from one host evicts its own -- or is refused at once when every open one is
admitted. Each connection has a thread of its own, so a slow client delays no other, and
the server's own threads are daemons apart from their owner's.
"""

from __future__ import annotations

import contextlib
import http.server
import resource
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

SPARE_FILES = 32  # descriptors kept from connections: files served and received, pipes


@dataclass(frozen=True)
class Limits:
    """How long and how many connections a server holds (see the module docstring)."""

    connections: int = 256
    admit_timeout_s: float = 5.0
    idle_timeout_s: float = 15.0


@dataclass
class _Connection:
    sock: socket.socket
    address: str
    accepted: float = field(default_factory=time.monotonic)
    admitted: bool = False  # has sent a request the server takes

    def cut(self) -> None:
        """Ends the connection under its thread's feet (its next read sees the end).
        The plain socket's shutdown, also for a TLS one: no TLS close to wait for."""
        with contextlib.suppress(OSError):
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)


class BoundedHTTPServer(http.server.ThreadingHTTPServer):
    """:class:`http.server.ThreadingHTTPServer` under :class:`Limits`. Its handler calls
    :meth:`admit` once a request is one the server takes; :meth:`wrap` (a subclass's)
    wraps an accepted socket, e.g. in TLS."""

    daemon_threads = True
    block_on_close = False  # no list of every connection's thread
    request_queue_size = 128  # a burst of connections waits in the backlog, not dropped

    def __init__(self, address: tuple[str, int], handler: Any, limits: Limits):
        self.limits = limits
        self._lock = threading.Lock()
        self._open: dict[socket.socket, _Connection] = {}
        self._here = threading.local()
        self._closed = threading.Event()
        super().__init__(address, handler)
        threading.Thread(target=self._sweep, name="http-sweep", daemon=True).start()

    def wrap(self, request: socket.socket) -> socket.socket:
        """The socket the handler reads and writes (this one: ``request`` itself)."""
        return request

    def admit(self) -> None:
        """Notes that this thread's connection sent a request the server takes."""
        self._here.conn.admitted = True

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            if len(self._open) >= self._cap() and not self._evict():
                self.shutdown_request(request)  # every open one is admitted
                return
            self._open[request] = _Connection(request, client_address[0])
        super().process_request(request, client_address)

    def _cap(self) -> int:
        """``connections``, or fewer when the process may not open that many files (it
        keeps some for the files it serves and receives)."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return max(1, min(self.limits.connections, soft - SPARE_FILES))

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        conn = self._open.get(request) or _Connection(request, client_address[0])
        self._here.conn = conn
        try:
            request.settimeout(self.limits.idle_timeout_s)
            conn.sock = self.wrap(request)
            self.finish_request(conn.sock, client_address)
        except Exception:  # noqa: BLE001 -- a client gone, cut, or sending garbage: its end
            pass
        finally:
            with self._lock:
                self._open.pop(request, None)
            self.shutdown_request(conn.sock)

    def _evict(self) -> bool:
        """Closes the oldest connection not admitted, of the address holding the most of
        them (lock held); whether there was one."""
        waiting = [c for c in self._open.items() if not c[1].admitted]
        if not waiting:
            return False
        crowd = Counter(conn.address for _, conn in waiting).most_common(1)[0][0]
        request, conn = min((c for c in waiting if c[1].address == crowd),
                            key=lambda item: item[1].accepted)
        del self._open[request]
        conn.cut()
        return True

    def _sweep(self) -> None:
        """Closes connections not admitted within ``admit_timeout_s``, until closed."""
        while not self._closed.wait(min(0.5, self.limits.admit_timeout_s / 4)):
            late = time.monotonic() - self.limits.admit_timeout_s
            with self._lock:
                for request, conn in list(self._open.items()):
                    if not conn.admitted and conn.accepted < late:
                        del self._open[request]
                        conn.cut()

    def server_close(self) -> None:
        """Stops the sweep and closes the listening socket and every open connection."""
        self._closed.set()
        super().server_close()
        with self._lock:
            for conn in self._open.values():
                conn.cut()
            self._open.clear()
