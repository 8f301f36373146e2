"""The soak (long profile, ``python -m pytest -m long tests/e2e/test_soak.py``): 50 faults
in one run -- exceptions, SIGKILLs and exits of rank 1, each after the attempt committed a
checkpoint -- lose no checkpoint, end bit-identical to a fault-free run, restart in
process every time, and leave the surviving rank with the descriptors, threads and child
processes it had at the start of the second attempt, and at most 5 % more memory."""

from __future__ import annotations

import pytest

from tests.support.soak import soak

pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.timeout(1800),
              pytest.mark.usefixtures("no_leaked_processes")]

FAULTS = 50


def test_fifty_faults_in_one_run(tmp_path):
    result = soak(FAULTS, str(tmp_path / "results"), str(tmp_path / "probes"))
    assert result.finished
    assert result.identical
    assert result.lost_checkpoints == 0
    assert result.failures_recorded == FAULTS and result.in_process == FAULTS
    for what in ("fds", "threads", "children"):
        assert result.last[what] == result.second[what], (what, result)
    assert result.rss_growth is not None and result.rss_growth <= 0.05, result
