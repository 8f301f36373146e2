"""The metric exporters end to end, on one real run whose worker raises once: a real
Prometheus scrapes its endpoint and the values are read back through Prometheus's HTTP
API; the same run pushes over OTLP/HTTP to a receiver that decodes the protobuf."""

from __future__ import annotations

import pytest

import elastic_train as et
from tests.conftest import EPOCHS, fit
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.prometheus_server import prometheus_binary, running
from tests.support.servers import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120),
              pytest.mark.usefixtures("no_leaked_processes")]


@pytest.mark.skipif(prometheus_binary() is None,
                    reason="no prometheus binary: apt-get install prometheus (.ci/run does)")
def test_prometheus_scrapes_a_run_with_a_fault(storage_path, tmp_path):
    port = free_port()
    fault = {"rank": 1, "epoch": 2, "batch": 1, "how": "raise", "marker": str(tmp_path / "m")}
    with running(prometheus_binary(), f"127.0.0.1:{port}") as prometheus, \
            OtlpReceiver() as receiver:
        metrics = et.MetricsConfig(port=port, address="127.0.0.1", otlp_endpoint=receiver.url,
                                   otlp_interval_s=0.5)
        result = fit(storage_path, "scraped", max_failures=1,
                     config={"fault": fault, "step_sleep": 0.05}, metrics_config=metrics)
        assert result.error is None

        def last(name: str, labels: str = "") -> float | None:
            return prometheus.value(f'last_over_time({name}{{run="scraped"{labels}}}[10m])')

        assert last("elastic_train_restarts_total", ',cause="failure"') == 1
        assert last("elastic_train_world_size") == 2
        assert last("elastic_train_rendezvous_rounds_total") >= 1
        assert last("elastic_train_recovery_seconds_count") == 1
        assert 0 < last("elastic_train_recovery_seconds_sum") < 60
        assert last("elastic_train_step_time_seconds") > 0.05
        assert last("elastic_train_slowest_rank_score") >= 1
        assert last("elastic_train_upload_bytes_total") > 0
        assert last("elastic_train_upload_lag_seconds") >= 0
        up = prometheus.query(f'up{{instance="127.0.0.1:{port}"}}[10m]')
        assert up and any(v == "1" for _, v in up[0]["values"])

    # The same figures over OTLP (the last push is the run's end): names without _total
    pushed = {p.name for p in receiver.points}
    assert {"elastic_train_restarts", "elastic_train_world_size",
            "elastic_train_recovery_seconds", "elastic_train_upload_bytes"} <= pushed
    assert receiver.latest("elastic_train_restarts", run="scraped", cause="failure").value == 1
    assert receiver.latest("elastic_train_world_size", run="scraped").value == 2
    assert receiver.latest("elastic_train_recovery_seconds", run="scraped").count == 1
    assert EPOCHS == len(result.metrics_dataframe)
