"""Faults on a node's local tier and on its peers' copies of it (peer replicas), and the
two-node job they are tried on (the e2e tests and the chaos kind ``replica_lost``).

:func:`wipe_tier` runs inside a worker (``tests.support.jobs``'s ``wipe_tier`` fault).
A node's tier holds ``<run group>/checkpoint_NNNNNN[.kept]/<file>``; the same file of
the same checkpoint has the same path in every node's tier, so what one node holds
names what its peers' copies are. :func:`run_two_nodes` runs the job: two
``tests.e2e.scripts.node_driver`` processes (one worker each) on S3, each node through a
:class:`~tests.support.servers.TcpProxy` of its own that records its requests.
"""

from __future__ import annotations

import glob
import hashlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import zlib
from dataclasses import dataclass

from elastic_train.storage import node_settings
from elastic_train.storage.replica_server import (
    AUTH_HEADER,
    SHA256_HEADER,
    ReplicaTLS,
    signature,
)
from tests.support.nodes import node_drivers, node_log
from tests.support.servers import TcpProxy

SUFFIX = ".kept"
NODE_ENDPOINT = "NODE_STORAGE_ENDPOINT"  # a node driver's endpoint_url (its own proxy)


def tier_files(root: str) -> dict[str, bytes]:
    """Every file the tier at ``root`` holds, by ``group/checkpoint_NNNNNN/file`` (kept
    and verified copies alike), with its bytes."""
    found = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            group, entry, *rel = os.path.relpath(path, root).split(os.sep)
            if rel and entry.startswith("checkpoint_") and ".part-" not in name:
                with open(path, "rb") as f:
                    found["/".join([group, entry.removesuffix(SUFFIX), *rel])] = f.read()
    return found


def wipe_tier(peer: str, out_dir: str, hostile_s: float = 0.0) -> None:
    """Removes this node's whole tier (a wiped disk) and does ``peer`` to the copies its
    peers hold of its files: ``keep`` them, ``lose`` them (deleted from the other nodes'
    tiers, whose roots the ranks wrote to ``out_dir/tier.<rank>``) or ``corrupt`` them
    (a first byte flipped, sent through the peers' own replica servers); with
    ``hostile_s``, a :mod:`tests.support.hostile_peer` attacks every node's server for
    that long, from just before the wipe (through the restore). Writes
    ``out_dir/wiped.json``: when, this node's ``$NODE_STORAGE_ENDPOINT``, what the tier
    held and the node's key (for the test to look for)."""
    settings = node_settings.current()
    wiped_at = time.time()
    held = tier_files(settings.tier_root)
    if hostile_s:
        start_hostile_peer(settings.peers, held, hostile_s, out_dir)
    shutil.rmtree(settings.tier_root)
    if peer == "lose":
        for path in glob.glob(os.path.join(out_dir, "tier.*")):
            with open(path) as f:
                root = f.read()
            if root != settings.tier_root:
                _remove_copies(root, held)
    elif peer == "corrupt":
        for name, data in held.items():
            bad = bytes([data[0] ^ 0xFF]) + data[1:]
            for node, url in settings.peers.urls.items():
                if url:
                    assert put(url, settings.peers.keys[node], _quoted(name), bad,
                               settings.peers.tls) == 201
    with open(os.path.join(out_dir, "wiped.json"), "w") as f:
        json.dump({"time": wiped_at, "endpoint": os.environ.get(NODE_ENDPOINT, ""),
                   "held": sorted(held), "key": settings.replica.key}, f)


def start_hostile_peer(peers, held: dict[str, bytes], duration_s: float, out_dir: str) -> None:
    """Starts :mod:`tests.support.hostile_peer` against every node's server with forged
    copies of ``held`` (in a session of its own: it outlives this worker, and ends by
    itself after ``duration_s``); returns once its idle connections are open."""
    folder = os.path.join(out_dir, "hostile")
    os.makedirs(folder, exist_ok=True)
    files = {}
    for i, (name, data) in enumerate(sorted(held.items())):
        files[_quoted(name)] = path = os.path.join(folder, f"{i}.bin")
        with open(path, "wb") as f:
            f.write(forge_crc(data))
    spec = {"urls": [url for url in peers.urls.values() if url], "files": files,
            "duration_s": duration_s, "flood": 100, "ready": os.path.join(folder, "ready"),
            "report": os.path.join(out_dir, "hostile.json")}
    with open(os.path.join(folder, "spec.json"), "w") as f:
        json.dump(spec, f)
    with open(os.path.join(folder, "log"), "w") as log:
        subprocess.Popen([sys.executable, "-m", "tests.support.hostile_peer",
                          os.path.join(folder, "spec.json")], stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while not os.path.exists(spec["ready"]) and time.monotonic() < deadline:
        time.sleep(0.05)


def _remove_copies(root: str, names: dict[str, bytes]) -> None:
    for name in names:
        group, entry, rel = name.split("/", 2)
        for base in (entry, entry + SUFFIX):
            path = os.path.join(root, group, base, rel)
            if os.path.exists(path):
                os.remove(path)


def _quoted(name: str) -> str:
    """The replica server's URL path of a tier file named ``group/checkpoint/rel``."""
    return "/" + "/".join(urllib.parse.quote(part) for part in name.split("/"))


def put(url: str, key: str | None, path: str, data: bytes, tls: ReplicaTLS | None = None
        ) -> int:
    """A ``PUT`` of ``data`` to a replica server, signed with ``key`` (None: unsigned),
    over TLS with ``tls``'s certificate; its status."""
    sha256 = hashlib.sha256(data).hexdigest()
    headers = {SHA256_HEADER: sha256}
    if key is not None:
        headers[AUTH_HEADER] = signature(key, "PUT", path, len(data), sha256)
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=10,
                                       context=tls.client_context()) if tls else \
        http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("PUT", path, body=data, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def forge_crc(data: bytes, at: int = 0) -> bytes:
    """Other bytes of the same size and CRC-32 as ``data``: its first byte flipped, and
    the 4 bytes at ``at`` + 1 rewritten to restore the CRC (CRC-32 is linear over
    GF(2), so 32 chosen bits reach any CRC). What a forged copy needs to pass a
    CRC-only check."""
    forged = bytearray(data)
    forged[0] ^= 0xFF
    zero = zlib.crc32(bytes(len(data)))
    rows = []  # (the CRC change of flipping some bits, those bits as a mask)
    for bit in range(32):
        one = bytearray(len(data))
        one[at + 1 + bit // 8] = 1 << (bit % 8)
        rows.append((zlib.crc32(one) ^ zero, 1 << bit))
    want, flips = zlib.crc32(forged) ^ zlib.crc32(data), 0
    for top in range(31, -1, -1):  # Gaussian elimination, highest bit first
        pivot = next((r for r in rows if r[0] >> top & 1), None)
        if pivot is None:
            continue
        rows = [(v ^ pivot[0], m ^ pivot[1]) if v >> top & 1 and (v, m) != pivot else (v, m)
                for v, m in rows if (v, m) != pivot]
        if want >> top & 1:
            want, flips = want ^ pivot[0], flips ^ pivot[1]
    assert want == 0
    for bit in range(32):
        if flips >> bit & 1:
            forged[at + 1 + bit // 8] ^= 1 << (bit % 8)
    assert zlib.crc32(forged) == zlib.crc32(data) and forged != data
    return bytes(forged)


@dataclass
class TwoNodes:
    """How the job ended: exit codes, the final digest rank 0's driver printed, and what
    the wiped node read from the store after the wipe (None: no wipe happened)."""

    codes: list[int]
    logs: list[str]
    digest: str | None
    held: list[str]
    store_reads: list[str] | None


def data_gets(proxy: TcpProxy, since: float) -> list[str]:
    """The checkpoint files (not commit or upload markers) a node read from the store
    since."""
    return [path for at, method, path in proxy.requests
            if at >= since and method == "GET" and "/checkpoint_" in path
            and ".commit.json" not in path and "/.upload-marks/" not in path
            and "list-type" not in path]


def run_two_nodes(storage, tmp_path, rendezvous: dict, fault: dict, **settings) -> TwoNodes:
    """Runs the job of ``tests.e2e.scripts.node_driver`` (``settings`` added to its own) on two
    nodes with ``fault`` (a ``wipe_tier`` one, whose ``out_dir`` is ``tmp_path/out``)."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = int(storage.options["endpoint_url"].rsplit(":", 1)[1])
    proxies = [TcpProxy(target), TcpProxy(target)]
    settings = {"storage": storage.url, "storage_options": storage.options,
                "out_dir": str(out_dir), "max_failures": 1, "rendezvous": rendezvous,
                "nodes": [2, 2], "fault": {**fault, "out_dir": str(out_dir)}, **settings}
    envs = [{NODE_ENDPOINT: f"http://127.0.0.1:{p.port}"} for p in proxies]
    try:
        with node_drivers(settings, tmp_path, envs) as procs:
            codes = [proc.wait(200) for proc in procs]
    finally:
        for proxy in proxies:
            proxy.cut()
    logs = [node_log(tmp_path, i) for i in (0, 1)]
    digests = [line.split()[1] for log in logs for line in log.splitlines()
               if line.startswith("DIGEST") and line.split()[1] != "None"]
    wiped_file = out_dir / "wiped.json"
    if not wiped_file.exists():
        return TwoNodes(codes, logs, digests[0] if digests else None, [], None)
    wiped = json.loads(wiped_file.read_text())
    node = next(p for p in proxies if p.port == int(wiped["endpoint"].rsplit(":", 1)[1]))
    return TwoNodes(codes, logs, digests[0] if digests else None, wiped["held"],
                    data_gets(node, wiped["time"]))
