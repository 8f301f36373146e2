"""Rank 0 waits for the other ranks' uploads as long as they make progress: a slow but
steady upload is no failure, however long it takes."""

from __future__ import annotations

import pytest

from tests.conftest import StorageUnderTest, fit, make_storage
from tests.support.servers import TcpProxy, s3_options

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]

RETRY_S = 4.0


def test_a_slow_steady_upload_outlasting_the_retry_budget_is_waited_for(s3_endpoint, tmp_path):
    """Rank 1's 6 MiB share of each checkpoint crosses a 0.75 MiB/s link: about 8 s, twice
    ``storage_retry_timeout_s``, at full speed all along."""
    direct = make_storage("s3", tmp_path, s3_endpoint)
    proxy = TcpProxy(int(s3_endpoint.rsplit(":", 1)[1]), upload_bytes_per_s=0.75 * 2**20)
    through = StorageUnderTest(direct.url, s3_options(f"http://127.0.0.1:{proxy.port}"),
                               direct.fs)
    try:
        result = fit(through, "slow-link", storage_retry_timeout_s=RETRY_S,
                     config={"epochs": 2, "ballast_mb": 6, "ballast_files": 24})
    finally:
        proxy.cut()
    assert result.checkpoint.path.endswith("checkpoint_000001")
    manifest = direct.run("slow-link").checkpoints.committed()[-1]
    assert len([f for f in manifest.files if f.startswith("ballast_")]) == 24
    assert direct.run("slow-link").read_run_state().to_json()["failures"] == []
