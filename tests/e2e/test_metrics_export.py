"""The metric exporters and the run's picture end to end, on one real run whose worker
raises once: a real Prometheus scrapes its endpoint and the values are read back
through Prometheus's HTTP API; the same run pushes over OTLP/HTTP to a receiver that
decodes the protobuf; ``elastic-train show RUN --plot`` draws it."""

from __future__ import annotations

import contextlib
import os
import struct

import fsspec
import pytest

import elastic_train as et
from elastic_train.cli.main import main as cli_main
from elastic_train.cli.run_plot import world_sizes
from elastic_train.storage import RunStorage
from tests.conftest import EPOCHS, fit
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.prometheus_server import prometheus_binary, running
from tests.support.servers import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120),
              pytest.mark.usefixtures("no_leaked_processes")]
NAME = "observed"


@pytest.fixture(scope="module")
def faulted(tmp_path_factory):
    """The run, with the Prometheus that scraped it (None without the binary) and the
    OTLP receiver it pushed to; Prometheus stays up until the module's tests are done."""
    tmp_path = tmp_path_factory.mktemp("metrics")
    port = free_port()
    fault = {"rank": 1, "epoch": 2, "batch": 1, "how": "raise", "marker": str(tmp_path / "m")}
    binary = prometheus_binary()
    with contextlib.ExitStack() as stack:
        prometheus = stack.enter_context(running(binary, f"127.0.0.1:{port}")) \
            if binary else None
        receiver = stack.enter_context(OtlpReceiver())
        metrics = et.MetricsConfig(port=port, address="127.0.0.1", otlp_endpoint=receiver.url,
                                   otlp_interval_s=0.5)
        result = fit(str(tmp_path / "results"), NAME, max_failures=1,
                     config={"fault": fault, "step_sleep": 0.15}, metrics_config=metrics)
        assert result.error is None and len(result.metrics_dataframe) == EPOCHS
        yield result, prometheus, receiver, port


@pytest.mark.skipif(prometheus_binary() is None,
                    reason="no prometheus binary: apt-get install prometheus (.ci/run does)")
def test_prometheus_scrapes_a_run_with_a_fault(faulted):
    _, prometheus, _, port = faulted

    def last(name: str, labels: str = "") -> float | None:
        return prometheus.value(f'last_over_time({name}{{run="{NAME}"{labels}}}[10m])')

    assert last("elastic_train_restarts_total", ',cause="failure"') == 1
    assert last("elastic_train_world_size") == 2
    assert last("elastic_train_rendezvous_rounds_total") >= 1
    assert last("elastic_train_recovery_seconds_count") == 1
    assert 0 < last("elastic_train_recovery_seconds_sum") < 60
    assert last("elastic_train_step_time_seconds") > 0.05
    assert last("elastic_train_slowest_rank_score") >= 1
    assert last("elastic_train_upload_bytes_total") > 0
    assert last("elastic_train_upload_lag_seconds") >= 0
    assert last("elastic_train_goodput_seconds") >= 0  # the ledger, read while it ran
    up = prometheus.query(f'up{{instance="127.0.0.1:{port}"}}[10m]')
    assert up and any(v == "1" for _, v in up[0]["values"])


def test_the_same_run_pushes_the_same_figures_over_otlp(faulted):
    _, _, receiver, _ = faulted
    pushed = {p.name for p in receiver.points}  # the last push is the run's end
    assert {"elastic_train_restarts", "elastic_train_world_size",
            "elastic_train_recovery_seconds", "elastic_train_upload_bytes"} <= pushed
    assert receiver.latest("elastic_train_restarts", run=NAME, cause="failure").value == 1
    assert receiver.latest("elastic_train_world_size", run=NAME).value == 2
    assert receiver.latest("elastic_train_recovery_seconds", run=NAME).count == 1
    # the goodput ledger's breakdown, read at the run's end: a fault costs detection time
    assert receiver.latest("elastic_train_goodput_seconds", run=NAME).value > 0
    assert receiver.latest("elastic_train_badput_seconds", run=NAME, cause="detection").value > 0
    blocked = receiver.latest("elastic_train_checkpoint_blocked_seconds", run=NAME).value
    assert blocked == receiver.latest("elastic_train_badput_seconds", run=NAME,
                                      cause="checkpoint").value


def test_show_plot_draws_the_faulted_run(faulted, tmp_path, capsys):
    result = faulted[0]
    png = tmp_path / "run.png"
    assert cli_main(["show", result.path, "--plot", str(png)]) == 0
    assert "failures" in capsys.readouterr().out.lower()
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert 600 <= width <= 3000 and 600 <= height <= 4000, (width, height)
    assert 20_000 < os.path.getsize(png) < 2_000_000
    # The world-size panel comes from the ledger's attempts, kept checkpoints or not.
    ledger = RunStorage(fsspec.filesystem("file"), result.path).read_ledger()
    sizes, source = world_sizes(ledger, [], 0.0)
    assert source == "attempts" and [size for _, size in sizes] == [2, 2], ledger
