"""Lease claims come from shared storage: whatever a claim file holds, the lease reads
the well-formed claims and leaves the rest out, never raising (#24: fuzz what comes from
storage). A claim whose token or id its file name does not carry is forged: left out."""

from __future__ import annotations

import json
import uuid

import fsspec
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from elastic_train.storage.lease import HELD, Claim, LeaseDir

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
FIELDS = ["token", "claim_id", "job", "state", "owner", "ttl_s", "beat_at"]
GOOD = Claim(token=3, claim_id="0123456789abcdef", job="job-a", state=HELD,
             owner={"host": "h", "pid": 1}, ttl_s=30.0)


def _lease(files: dict[str, str]) -> LeaseDir:
    fs = fsspec.filesystem("memory")
    path = f"/lease-{uuid.uuid4().hex}"
    fs.makedirs(path, exist_ok=True)
    for name, text in files.items():
        with fs.open(f"{path}/{name}", "w") as f:
            f.write(text)
    return LeaseDir(fs, path)


@settings(max_examples=300, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.too_slow])
@given(bad=values | st.fixed_dictionaries({}, optional={k: values for k in FIELDS}),
       token=st.integers(0, 10**10 - 1))
def test_any_claim_file_is_read_or_left_out(bad, token):
    lease = _lease({GOOD.file_name: json.dumps(GOOD.to_json()),
                    f"claim-{token:010d}-fedcba9876543210.json": json.dumps(bad)})
    claims = lease.claims()
    assert GOOD in [c.__class__(**{**c.__dict__, "modified": None}) for c in claims]
    for claim in claims:
        assert type(claim.token) is int and isinstance(claim.owner, dict)
        assert claim.file_name in {GOOD.file_name, f"claim-{token:010d}-fedcba9876543210.json"}
    assert lease.newest() is not None


def test_a_claim_naming_another_token_than_its_file_is_left_out():
    forged = {**GOOD.to_json(), "token": 9}  # a file of token 3 that says 9
    assert _lease({GOOD.file_name: json.dumps(forged)}).claims() == []


def test_text_that_is_no_json_is_left_out():
    assert _lease({GOOD.file_name: '{"token": 3, "cla'}).claims() == []
