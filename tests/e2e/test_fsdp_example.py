"""examples/fsdp_transformer.py runs as a user would run it: FSDP2 on 2 workers with a
worker killed and resumed, then continued on 1 worker from the sharded checkpoint.
Its GPU case (nccl) is in tests/e2e/test_gpu.py."""

from __future__ import annotations

import re

import pytest

from tests.support.examples import FSDP_QUICK, run_fsdp_example

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400),
              pytest.mark.usefixtures("no_leaked_processes")]


def test_example_resumes_and_reshards(tmp_path):
    out = run_fsdp_example(tmp_path, *FSDP_QUICK)
    assert "rank 1: killing myself at step 15" in out
    resumed = re.findall(r"rank (\d): resumed at step (\d+)", out)
    assert sorted(resumed) == [("0", "10"), ("0", "20"), ("1", "10")]
    assert re.search(r"run 1: .* on 2 workers; .*from ranks 0, 1\)", out)
    assert re.search(r"run 2: .* on 1 worker\(s\), resharded from 2; .*from rank 0\)", out)

