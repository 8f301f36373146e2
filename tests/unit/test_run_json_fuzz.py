"""run.json comes from shared storage: whatever it holds, reading it gives a RunState or a
StorageError that names the file, never another exception (#24: fuzz what comes from
storage)."""

from __future__ import annotations

import json
import uuid

import fsspec
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from elastic_train.errors import StorageError
from elastic_train.storage import RunStorage
from elastic_train.storage.run_state import RunState

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
FIELDS = ["name", "created", "status", "updated", "spec", "versions", "launches",
          "failures", "error", "no_progress", "zygote_errors", "format_version"]
records = values | st.dictionaries(st.sampled_from(FIELDS), values, max_size=6)


def _read(data) -> RunState | None:
    fs = fsspec.filesystem("memory")
    path = f"/fuzz-{uuid.uuid4().hex}/run"
    fs.makedirs(path, exist_ok=True)
    with fs.open(f"{path}/run.json", "w") as f:
        f.write(data if isinstance(data, str) else json.dumps(data))
    return RunStorage(fs, path).read_run_state()


@settings(max_examples=300, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow])
@given(record=records)
def test_any_run_json_reads_as_a_run_state_or_a_storage_error(record):
    try:
        assert isinstance(_read(record), RunState)
    except StorageError as exc:
        assert "run.json" in str(exc)


def test_cut_short_and_not_an_object():
    for text in ['{"name": "x", "sta', "[]", "3", '"running"', "null"]:
        try:
            _read(text)
        except StorageError as exc:
            assert "run.json" in str(exc)
