"""A hostile process on the job's network, without the job's keys (the chaos kind
``hostile_peer``): for ``duration_s`` it sends every node's replica server forged
``PUT``s of the node's checkpoint files (same size and CRC-32, other bytes; unsigned,
and signed with a key of its own), unsigned ``GET``s of them, and keeps ``flood`` idle
connections open to each server (opening a new one for each the server closes).

    python -m tests.support.hostile_peer SPEC_JSON

SPEC_JSON names ``urls``, ``files`` (URL path -> a file holding the forged bytes),
``duration_s``, ``flood``, ``ready`` (touched once the flood is open) and ``report``
(written at the end: each status answered, by request, and every request that was
not refused).
"""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
import sys
import time
import urllib.parse
from collections import Counter

from elastic_train.storage.replica_server import AUTH_HEADER, new_key, signature
from tests.support.peer_faults import put

REFUSED = (401, 403)


class Flood:
    """``count`` idle connections to each of ``urls``, kept open."""

    def __init__(self, urls: list[str], count: int):
        self.targets = [urllib.parse.urlsplit(url) for url in urls]
        self.count = count
        self.socks: list[tuple[int, socket.socket]] = []
        self.opened = self.cut = 0

    def refill(self) -> None:
        """Replaces the connections the servers closed, and opens any missing."""
        if self.socks:
            closed, _, _ = select.select([s for _, s in self.socks], [], [], 0)
            for sock in closed:
                sock.close()
            self.cut += len(closed)
            self.socks = [(t, s) for t, s in self.socks if s not in closed]
        for target, parts in enumerate(self.targets):
            for _ in range(self.count - sum(t == target for t, _ in self.socks)):
                try:
                    sock = socket.create_connection((parts.hostname, parts.port), timeout=2)
                except OSError:
                    self.cut += 1
                    continue
                self.socks.append((target, sock))
                self.opened += 1

    def close(self) -> None:
        for _, sock in self.socks:
            sock.close()


def _get(url: str, path: str, headers: dict[str, str]) -> int | str:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__
    finally:
        conn.close()


def _put(url: str, key: str | None, path: str, data: bytes) -> int | str:
    try:
        return put(url, key, path, data)
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__


def attack(spec: dict) -> dict:
    """Runs the attack; what each request got."""
    forged = {path: open(name, "rb").read() for path, name in spec["files"].items()} \
        or {f"/{'0' * 16}/checkpoint_000000/state.pt": b"forged"}  # the node held none yet
    flood = Flood(spec["urls"], spec["flood"])
    flood.refill()
    with open(spec["ready"], "w"):
        pass
    statuses: Counter[str] = Counter()
    accepted = []
    own_key = new_key()  # not the job's
    deadline = time.monotonic() + spec["duration_s"]
    while time.monotonic() < deadline:
        for url in spec["urls"]:
            for path, data in forged.items():
                sent = {"unsigned PUT": _put(url, None, path, data),
                        "PUT signed with another key": _put(url, own_key, path, data),
                        "unsigned GET": _get(url, path, {}),
                        "GET signed with another key": _get(
                            url, path, {AUTH_HEADER: signature(own_key, "GET", path)})}
                for what, status in sent.items():
                    statuses[f"{what}: {status}"] += 1
                    if isinstance(status, int) and status not in REFUSED:
                        accepted.append(f"{what} {url}{path}: {status}")
        flood.refill()
    flood.close()
    return {"pid": os.getpid(), "statuses": dict(statuses), "accepted": accepted,
            "flood_opened": flood.opened, "flood_cut": flood.cut}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        given = json.load(f)
    result = attack(given)
    with open(given["report"] + ".part", "w") as f:
        json.dump(result, f)
    os.replace(given["report"] + ".part", given["report"])
