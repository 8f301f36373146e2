"""Faults on a node's local tier and on its peers' copies of it (peer replicas), injected
from inside a worker of a multi-node job on this machine (``tests.support.jobs``'s
``wipe_tier`` fault).

A node's tier holds ``<run group>/checkpoint_NNNNNN[.kept]/<file>``; the same file of
the same checkpoint has the same path in every node's tier, so what one node holds
names what its peers' copies are.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import time
import urllib.parse
import zlib

from elastic_train.storage import node_settings

SUFFIX = ".kept"


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


def wipe_tier(peer: str, out_dir: str) -> None:
    """Removes this node's whole tier (a wiped disk) and does ``peer`` to the copies its
    peers hold of its files: ``keep`` them, ``lose`` them (deleted from the tier whose
    root node 0 wrote to ``out_dir/tier.0``) or ``corrupt`` them (a first byte flipped,
    sent through the peers' own replica servers). Writes ``out_dir/wiped.json``: when,
    this node's ``$NODE_STORAGE_ENDPOINT`` and what the tier held."""
    settings = node_settings.current()
    wiped_at = time.time()
    held = tier_files(settings.tier_root)
    shutil.rmtree(settings.tier_root)
    if peer == "lose":
        with open(os.path.join(out_dir, "tier.0")) as f:
            peer_root = f.read()
        for name in held:
            group, entry, rel = name.split("/", 2)
            for base in (entry, entry + SUFFIX):
                path = os.path.join(peer_root, group, base, rel)
                if os.path.exists(path):
                    os.remove(path)
    elif peer == "corrupt":
        for name, data in held.items():
            bad = bytes([data[0] ^ 0xFF]) + data[1:]
            for url in settings.peers.urls.values():
                if url:
                    _put(url, "/" + name, bad)
    with open(os.path.join(out_dir, "wiped.json"), "w") as f:
        json.dump({"time": wiped_at, "endpoint": os.environ.get("NODE_STORAGE_ENDPOINT", ""),
                   "held": sorted(held)}, f)


def _put(url: str, path: str, data: bytes) -> None:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("PUT", path, body=data, headers={"X-Crc32": f"{zlib.crc32(data):08x}"})
        assert conn.getresponse().status == 201
    finally:
        conn.close()
