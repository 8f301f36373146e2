"""Commit markers and listings come from shared storage, which others can write: a hostile
or malformed marker is a damaged checkpoint (the restore falls back to an older one), never
a crash and never a write outside the node's local tier (#24, item 2). fsspec's in-memory
store stands in for S3; no processes."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
import zlib

import fsspec
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from elastic_train.storage import CheckpointStore, CommitManifest
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.checkpoint_store import DAMAGED_DIR, MARKER, describe_files
from elastic_train.storage.local_tier import LocalTier
from elastic_train.storage.restore_check import choose_intact
from tests.support.node_settings import use_node_settings

PAYLOAD = b"import os  # would run at every interpreter start\n"


def info(data: bytes, rank: int = 0) -> dict:
    return {"size": len(data), "crc32": f"{zlib.crc32(data):08x}", "rank": rank}


def new_run() -> CheckpointStore:
    return CheckpointStore(fsspec.filesystem("memory"), f"/hostile-{uuid.uuid4().hex}/run")


def commit(store: CheckpointStore, index: int, tmp: str) -> CommitManifest:
    src = os.path.join(tmp, f"src{index}")
    os.makedirs(src, exist_ok=True)
    with open(os.path.join(src, "model.pt"), "wb") as f:
        f.write(b"weights %d" % index)
    store.upload(index, src, ["model.pt"])
    manifest = CommitManifest(index, index, {}, {rel: {**i, "rank": 0} for rel, i in
                                                  describe_files(src, ["model.pt"]).items()}, 1)
    store.commit(manifest)
    return manifest


def restore(store: CheckpointStore) -> CommitManifest | None:
    """What rank 0 of a one-worker group does before a restart (worker.resume_point)."""
    _, manifests = store.sweep()
    return choose_intact(store, manifests, 0, 1, lambda ok: ok)


def set_aside(store: CheckpointStore, index: int) -> str:
    """Where the damaged checkpoint ``index`` of the default name is kept."""
    return fsutil.join(store.run_path, DAMAGED_DIR, f"{index:06d}.checkpoint_{index:06d}")


def files_under(root: str) -> set[str]:
    return {os.path.join(d, n) for d, _, names in os.walk(root) for n in names}


@pytest.fixture
def node(tmp_path, monkeypatch):
    """(tier root, a directory around it standing in for the rest of the node): deep enough
    that the ``..`` of these tests stay inside it, even on code that follows them."""
    tier_root = tmp_path / "node" / "a" / "b" / "c" / "d" / "e" / "f" / "tier"
    use_node_settings(monkeypatch, tier_root=str(tier_root))
    return str(tier_root), str(tmp_path / "node")


def hostile_marker(store: CheckpointStore, index: int, names: list[str]) -> None:
    """Checkpoint ``index``'s marker rewritten to list ``names``, each file put where a naive
    reader fetches it from, with its true size and CRC-32."""
    path = store.path(index)
    for rel in names:
        store.fs.pipe_file(fsutil.join(path, rel), PAYLOAD)
    data = json.loads(store.fs.cat_file(fsutil.join(path, MARKER)))
    data["files"] = {rel: info(PAYLOAD) for rel in names}
    store.fs.pipe_file(fsutil.join(path, MARKER), json.dumps(data).encode())


def test_a_manifest_naming_paths_outside_the_checkpoint_writes_nothing_there(node, tmp_path):
    tier_root, outside = node
    store = new_run()
    older = commit(store, 0, str(tmp_path))
    commit(store, 1, str(tmp_path))
    escape = "../" * 3 + "evil.pth"  # from <tier>/<run hash>/checkpoint_000001/ to f/
    absolute = os.path.join(outside, "absolute.pth")
    hostile_marker(store, 1, [escape, absolute, "sub/../../../../x.pth"])
    before = files_under(outside)

    chosen = restore(store)

    assert chosen == older  # the damaged checkpoint is passed over, not a crash
    written = files_under(outside) - before
    assert all(p.startswith(tier_root + os.sep) for p in written), written
    assert not os.path.exists(absolute)
    assert store.fs.exists(fsutil.join(set_aside(store, 1), MARKER))  # for a person to see


def test_a_listing_with_names_outside_the_checkpoint_writes_nothing_there(node, tmp_path):
    tier_root, outside = node
    store = new_run()
    manifest = commit(store, 0, str(tmp_path))
    # metadata written after the commit is fetched by listing; a listing can be hostile too
    store.fs.pipe_file(store.path(0) + "/a/" + "../" * 4 + "listed.pth", PAYLOAD)
    before = files_under(outside)

    with LocalTier.of_node().local_copy(store.fs, store.path(0), manifest) as d:
        assert os.path.isfile(os.path.join(d, "model.pt"))

    written = files_under(outside) - before
    assert all(p.startswith(tier_root + os.sep) for p in written), written


@pytest.mark.parametrize("marker", [
    b"{not json", b"\xff\xfe", b"[]", b"null", b'{"index": 1}',
    json.dumps({"index": 1, "training_iteration": 1, "metrics": {}, "world_size": 1,
                "files": {"model.pt": {"size": "9", "crc32": "00000000"}}}).encode(),
    json.dumps({"index": 0, "training_iteration": 1, "metrics": {}, "world_size": 1,
                "files": {}}).encode(),  # another checkpoint's marker copied here
    json.dumps({"index": 1, "training_iteration": 1, "metrics": [], "world_size": 0,
                "files": {}}).encode(),
])
def test_a_malformed_marker_is_a_damaged_checkpoint(node, tmp_path, marker):
    store = new_run()
    older = commit(store, 0, str(tmp_path))
    commit(store, 1, str(tmp_path))
    store.fs.pipe_file(fsutil.join(store.path(1), MARKER), marker)

    assert [m.index for m in store.committed()] == [0]
    removed, manifests = store.sweep()
    assert manifests == [older] and removed == [1]  # kept, and its number never reused
    assert not store.fs.exists(store.path(1))  # set aside: its name is free again
    assert store.fs.cat_file(fsutil.join(set_aside(store, 1), MARKER)) == marker  # as it was
    assert CheckpointStore(store.fs, store.run_path).sweep() == ([1], [older])


# Fuzz: markers built from arbitrary JSON, and from valid markers whose names are hostile.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=8), children, max_size=3), max_leaves=12)
names = st.lists(st.sampled_from(["..", ".", "", "a", "model.pt", "/", "\\", "\0", "/abs"]),
                 min_size=1, max_size=6).map("/".join)
file_infos = st.fixed_dictionaries({"size": st.integers(-1, 99) | json_values,
                                    "crc32": st.sampled_from(["00000000", "zz", ""])
                                    | json_values}, optional={"rank": json_values})
valid_shaped = st.fixed_dictionaries({
    "index": st.sampled_from([1, 0, -1, True, "1"]), "training_iteration": st.integers(-1, 3),
    "metrics": json_values, "world_size": st.integers(-1, 3) | json_values,
    "files": st.dictionaries(names | st.text(max_size=6), file_infos, max_size=3)},
    optional={"worker_states": json_values, "created": json_values})
markers = (json_values | valid_shaped).map(lambda d: json.dumps(d).encode()) \
    | st.binary(max_size=40)


# No shrinking (minutes on this store) and no example database written into the checkout.
@settings(max_examples=150, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(marker=markers)
# found by the fuzz: files under names memory's rm cannot remove, in a damaged checkpoint
# that the sweep sets aside (the start must go on, leaving it where it is)
@example(marker=json.dumps({"training_iteration": 0, "index": 0, "metrics": True,
                            "world_size": 1, "files": {
                                "//model.pt/\\/./model.pt/model.pt": {"size": 41},
                                "/..//abs/model.pt": {"size": {}},
                                "../../\\//../a": {"size": {}}}}).encode())
def test_fuzzed_markers_fall_back_and_never_write_outside_the_tier(node, tmp_path, marker):
    tier_root, outside = node
    store = new_run()
    older = commit(store, 0, str(tmp_path))
    commit(store, 1, str(tmp_path))
    try:
        parsed = json.loads(marker)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("files"), dict):
        for rel in parsed["files"]:  # each named file where a naive reader fetches it
            if isinstance(rel, str) and rel and "\0" not in rel:
                with contextlib.suppress(OSError):  # e.g. a name below model.pt
                    store.fs.pipe_file(fsutil.join(store.path(1), rel), PAYLOAD)
    store.fs.pipe_file(fsutil.join(store.path(1), MARKER), marker)
    before = files_under(outside)

    chosen = restore(store)

    assert chosen is not None and chosen.index in (0, 1)
    if chosen.index == 1:  # a marker that passed: only safe names, checked files
        assert all(not rel.startswith("/") and ".." not in rel.split("/")
                   for rel in chosen.files)
    else:
        assert chosen == older
    written = files_under(outside) - before
    assert all(p.startswith(tier_root + os.sep) for p in written), written
    with contextlib.suppress(OSError):  # memory's rm stumbles on some names; it is memory
        store.fs.rm(store.run_path.rsplit("/", 1)[0], recursive=True)
