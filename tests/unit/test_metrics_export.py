"""The metric exporters without a run: MetricsConfig and launch's flags, the port check,
the figures NodeMetrics records (into a real prometheus_client registry), what the run
monitor's feed reads, and the OTLP push against a receiver that decodes the protobuf --
and against a collector that is down."""

from __future__ import annotations

import logging
import re
import socket
import sys
import time
import types
import urllib.request

import pytest

import elastic_train as et
from elastic_train.cli.launch_command import main_launch
from elastic_train.driver import exporters, metrics_feed, prometheus_endpoint
from elastic_train.driver.node_metrics import METRICS, NodeMetrics
from elastic_train.driver.otlp_push import OtlpSink
from elastic_train.driver.prometheus_endpoint import PrometheusSink, check_port
from elastic_train.storage.manifest import CommitManifest
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.paths import REPO
from tests.support.servers import free_port, held_connections, idle_connections

SCRIPT = "tests/e2e/scripts/plain_torchrun_script.py"


@pytest.mark.parametrize("settings, words", [
    ({"port": 80}, ["MetricsConfig.port=80", "privileged", "1024 to 65535"]),
    ({"port": 70000}, ["MetricsConfig.port=70000"]),
    ({"port": True}, ["MetricsConfig.port=True"]),
    ({"otlp_endpoint": "collector:4318"}, ["otlp_endpoint='collector:4318'", "http://"]),
    ({"otlp_interval_s": 0}, ["otlp_interval_s=0", "> 0"]),
    ({"port": 9464, "address": "127.0.0.1:9464"},
     ["address='127.0.0.1:9464'", "without a port", "address='127.0.0.1', port=9464"]),
    ({"address": "[::1]:9464"}, ["address='[::1]:9464'", "address='::1', port=9464"]),
])
def test_bad_settings_name_the_value_and_the_fix(settings, words):
    with pytest.raises(et.ConfigError) as raised:
        et.MetricsConfig(**settings)
    for word in words:
        assert word in str(raised.value)


def test_off_by_default_and_the_otlp_path():
    assert not et.RunConfig().metrics_config.enabled
    assert et.MetricsConfig(otlp_endpoint="http://c:4318").otlp_url == "http://c:4318/v1/metrics"
    assert et.MetricsConfig(otlp_endpoint="http://c:1/x").otlp_url == "http://c:1/x"
    assert exporters.start(et.MetricsConfig(), "r", "n") is None


def test_a_taken_port_is_refused_naming_it_and_the_fix():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(et.ConfigError) as raised:
            check_port("127.0.0.1", port)
    said = str(raised.value)
    assert f"port={port}" in said and "taken" in said and "--metrics-port 9464" in said


def test_fit_with_a_taken_port_fails_before_any_process_starts(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr("elastic_train.agent.zygote.server.prestart",
                        lambda *a, **k: started.append("zygote"))
    monkeypatch.setattr("elastic_train.driver.supervisor.run_agent",
                        lambda *a, **k: started.append("agent"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        trainer = et.torch.TorchTrainer(
            lambda: None, scaling_config=et.ScalingConfig(num_workers=1),
            run_config=et.RunConfig(storage_path=str(tmp_path), name="taken",
                                    metrics_config=et.MetricsConfig(port=port,
                                                                    address="127.0.0.1")))
        with pytest.raises(et.ConfigError, match=f"port={port} .* taken"):
            trainer.fit()
    assert started == []


def test_launch_flags_set_the_metrics_config(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    launched = []
    monkeypatch.setattr("elastic_train.driver.launch_run.launch",
                        lambda settings, argv: launched.append(settings) or 0)
    argv = ["--metrics-port", "9464", "--metrics-address", "127.0.0.1", "--otlp-endpoint",
            "http://c:4318", "--otlp-interval", "2", SCRIPT]
    assert main_launch(argv, {}) == 0
    assert launched[0].run_config.metrics_config == et.MetricsConfig(
        port=9464, address="127.0.0.1", otlp_endpoint="http://c:4318", otlp_interval_s=2.0)
    assert main_launch(["--metrics-port", "80", SCRIPT], {}) == 2
    err = capsys.readouterr().err
    assert "--metrics-port=80" in err and "privileged" in err, err
    assert main_launch(["--metrics-port", "9464", "--metrics-address", "127.0.0.1:9464",
                        SCRIPT], {}) == 2
    err = capsys.readouterr().err  # the address is blamed, and the fix works as said
    assert "--metrics-address='127.0.0.1:9464'" in err and "without a port" in err, err
    assert "--metrics-address 127.0.0.1 --metrics-port 9464" in err, err


def _sample(sink: PrometheusSink, name: str, **labels: str) -> float | None:
    return sink.registry.get_sample_value(name, {"node": "n", "run": "r", **labels})


def test_the_agents_events_and_the_rows_become_the_metrics():
    now = [100.0]
    sink = PrometheusSink()
    metrics = NodeMetrics("r", "n", [sink], clock=lambda: now[0])
    now[0] = 103.0
    metrics.note_rendezvous(world_size=4)  # 3 s from the start to the first round
    metrics.note_row({"step_time_s": 0.25, "slowest_rank_score": 1.5})
    metrics.note_failure("failure", restarting=True, failed_at=109.0)
    now[0] = 110.0
    metrics.note_failure("peer", restarting=True, failed_at=None)  # the same recovery
    now[0] = 112.0
    metrics.note_rendezvous(world_size=2)
    metrics.note_failure("preemption", restarting=False, failed_at=None)  # the run stops
    assert _sample(sink, "elastic_train_restarts_total", cause="failure") == 1
    assert _sample(sink, "elastic_train_restarts_total", cause="peer") == 1
    assert _sample(sink, "elastic_train_restarts_total", cause="preemption") is None
    assert _sample(sink, "elastic_train_recovery_seconds_count") == 1
    assert _sample(sink, "elastic_train_recovery_seconds_sum") == 3.0  # from 109
    assert _sample(sink, "elastic_train_rendezvous_rounds_total") == 2
    assert _sample(sink, "elastic_train_rendezvous_seconds_sum") == 3.0 + 2.0
    assert _sample(sink, "elastic_train_world_size") == 2
    assert _sample(sink, "elastic_train_step_time_seconds") == 0.25
    assert _sample(sink, "elastic_train_slowest_rank_score") == 1.5


def test_goodput_by_cause_and_checkpoint_blocking():
    sink = PrometheusSink()
    NodeMetrics("r", "n", [sink]).note_goodput(
        {"productive": 90.0, "recompute": 6.0, "checkpoint": 3.0, "other": 1.0})
    assert _sample(sink, "elastic_train_goodput_seconds") == 90.0
    assert _sample(sink, "elastic_train_badput_seconds", cause="recompute") == 6.0
    assert _sample(sink, "elastic_train_badput_seconds", cause="productive") is None
    assert _sample(sink, "elastic_train_checkpoint_blocked_seconds") == 3.0


def test_a_sink_that_fails_is_dropped_with_one_warning(caplog):
    class Broken:
        def record(self, metric, value, labels):
            raise RuntimeError("exporter bug")

        def close(self):
            pass

    sink = PrometheusSink()
    metrics = NodeMetrics("r", "n", [Broken(), sink])
    with caplog.at_level(logging.WARNING):
        metrics.note_rendezvous(2)
        metrics.note_rendezvous(2)
    assert [r.message for r in caplog.records].count(
        "Metrics: Broken failed on elastic_train_rendezvous_rounds and is turned off for "
        "this run.") == 1
    assert _sample(sink, "elastic_train_rendezvous_rounds_total") == 2


class _Store:
    """A run directory's checkpoints, as the feed reads them."""

    def __init__(self):
        self.committed: dict[str, CommitManifest] = {}

    def manifest_of(self, name):
        return self.committed.get(name)


def test_the_feed_measures_upload_lag_and_bytes_and_forgets_lost_checkpoints():
    storage = types.SimpleNamespace(checkpoints=_Store(), read_ledger=list)  # no ledger lines
    sink = PrometheusSink()
    feed = metrics_feed.MetricsFeed(NodeMetrics("r", "n", [sink]), storage)
    now = time.time()
    feed.observe({"training_iteration": 1, "timestamp": int(now) - 5,
                  "checkpoint_dir_name": "checkpoint_000000"})
    feed.observe({"training_iteration": 2, "timestamp": int(now) - 2,
                  "checkpoint_dir_name": "checkpoint_000001", "step_time_s": 0.5})
    feed.poll()
    assert _sample(sink, "elastic_train_upload_bytes_total") is None
    storage.checkpoints.committed["checkpoint_000001"] = CommitManifest(
        index=1, training_iteration=2, world_size=2, metrics={},
        files={"a.pt": {"size": 300}, "b.pt": {"size": 200}})
    feed.poll()
    assert _sample(sink, "elastic_train_upload_bytes_total") == 500
    assert 2 <= _sample(sink, "elastic_train_upload_lag_seconds") < 4
    assert _sample(sink, "elastic_train_step_time_seconds") == 0.5
    assert feed._uncommitted == {}  # checkpoint 0 was cut short: never waited for again


def test_the_goodput_hook_reads_the_ledgers_breakdown(monkeypatch):
    from elastic_train.goodput.breakdown import Cause

    ledger = [{"event": "launch"}]
    monkeypatch.setattr(metrics_feed, "breakdown", lambda entries: types.SimpleNamespace(
        seconds={Cause.PRODUCTIVE: 8.0, Cause.RESTORE: 2.0} if entries == ledger else {}))
    storage = types.SimpleNamespace(read_ledger=lambda: ledger)
    assert metrics_feed.goodput_seconds(storage) == {"productive": 8.0, "restore": 2.0}
    assert metrics_feed.goodput_seconds(types.SimpleNamespace(read_ledger=list)) is None


def test_otlp_pushes_every_metric_as_protobuf():
    with OtlpReceiver() as receiver:
        sink = OtlpSink(receiver.url + "/v1/metrics", interval_s=60)
        metrics = NodeMetrics("r", "n", [sink])
        metrics.note_rendezvous(4)
        metrics.note_failure("failure", True, None)
        metrics.note_rendezvous(4)
        metrics.note_row({"step_time_s": 0.25, "slowest_rank_score": 1.5})
        metrics.note_commit(1.5, 1000)
        metrics.note_goodput({"productive": 9.0, "checkpoint": 1.0})
        metrics.close()  # the last push
    assert {p.name for p in receiver.points} == {m.name for m in METRICS}
    assert receiver.latest("elastic_train_restarts", node="n", run="r",
                           cause="failure").value == 1
    assert receiver.latest("elastic_train_restarts").kind == "sum"
    assert receiver.latest("elastic_train_world_size").value == 4
    assert receiver.latest("elastic_train_recovery_seconds").count == 1
    assert receiver.latest("elastic_train_upload_bytes").value == 1000
    assert receiver.latest("elastic_train_badput_seconds", cause="checkpoint").value == 1.0


def test_a_collector_that_is_down_costs_one_warning(caplog):
    url = f"http://127.0.0.1:{free_port()}/v1/metrics"  # nothing listens
    sink = OtlpSink(url, interval_s=0.1)
    metrics = NodeMetrics("r", "n", [sink])
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            metrics.note_rendezvous(2)
            time.sleep(0.1)
        metrics.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert url in warnings[0] and "training goes on" in warnings[0]


def test_a_nodes_series_do_not_grow_with_the_jobs_ranks():
    """Nothing is labelled by rank: a node of a 64-rank job serves as many series as a
    node of a 2-rank one (what keeps a scrape small: python -m bench.metrics_cost)."""
    from bench.metrics_cost import filled

    def series(ranks: int) -> int:
        return sum(len(f.samples) for f in filled(1, ranks).registry.collect())

    assert series(64) == series(2) < 100


@pytest.mark.parametrize("module, settings, extra", [
    ("prometheus_client", {"port": 9464}, "elastic-train[metrics]"),
    ("opentelemetry.sdk.metrics", {"otlp_endpoint": "http://c:4318"}, "elastic-train[otel]"),
])
def test_a_missing_client_is_named_with_its_extra_before_anything_starts(
        monkeypatch, module, settings, extra):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(et.ConfigError, match=re.escape(extra)):
        exporters.check(et.MetricsConfig(**settings))


@pytest.mark.timeout(60)
def test_idle_connections_neither_hold_the_endpoint_nor_delay_a_scrape():
    """300 connections that send nothing (one a request cut short) against the endpoint
    at its defaults: a scrape still answers at once, the endpoint holds no more than its
    cap, and it closes the idle ones within its admit timeout."""
    sink, port = PrometheusSink(), free_port()
    sink.serve("127.0.0.1", port)
    flood = idle_connections("127.0.0.1", port, 300)
    flood[-1].sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    try:
        started = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as got:
            assert got.status == 200 and b"elastic_train_" in got.read()
        assert time.monotonic() - started < 3.0
        time.sleep(0.5)  # the last of the flood accepted
        limits = prometheus_endpoint.LIMITS
        assert held_connections(port) <= limits.connections
        flood[-1].settimeout(limits.admit_timeout_s + 5)
        assert flood[-1].recv(1) == b""  # closed by the endpoint
    finally:
        for sock in flood:
            sock.close()
        sink.close()
