"""The same figures as :mod:`.prometheus_endpoint`, pushed over OTLP/HTTP to an
OpenTelemetry collector.

Opt-in (``MetricsConfig(otlp_endpoint=...)``, ``launch --otlp-endpoint``); needs the
``otel`` extra (``opentelemetry-sdk`` and ``opentelemetry-exporter-otlp-proto-http``).
The SDK's periodic reader pushes every ``otlp_interval_s`` from a thread of the driver
(started with the run, after the worker zygote is forked), and once more at the end.
A collector that is down or refuses the push costs one warning, naming the URL, and
one line when it answers again; training goes on either way (the SDK's own
per-push error lines are kept out of the console).
"""

from __future__ import annotations

import logging
from typing import Any

from elastic_train.driver.node_metrics import BUCKETS_S, METRICS, Kind, Metric, require

logger = logging.getLogger(__name__)
_SDK_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.metric_exporter",
                "opentelemetry.sdk.metrics._internal.export")


def check_installed() -> None:
    """Raises ConfigError naming the extra unless the SDK and its exporter are installed."""
    require("opentelemetry.sdk.metrics", "otel", "otlp_endpoint",
            package="opentelemetry-sdk")
    require("opentelemetry.exporter.otlp.proto.http.metric_exporter", "otel",
            "otlp_endpoint", package="opentelemetry-exporter-otlp-proto-http")


def _warning_exporter(url: str, timeout_s: float) -> Any:
    """The SDK's OTLP/HTTP exporter, telling of a collector that is down once (and of
    its coming back), not at every push."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult

    class WarningExporter(OTLPMetricExporter):
        failing = False

        def export(self, metrics_data: Any, timeout_millis: float | None = 10000,
                   **kwargs: Any) -> MetricExportResult:
            try:
                result = super().export(metrics_data, timeout_millis, **kwargs)
            except Exception:  # noqa: BLE001 -- a push must never stop the run
                logger.debug("OTLP push failed", exc_info=True)
                result = MetricExportResult.FAILURE
            ok = result is MetricExportResult.SUCCESS
            if not ok and not self.failing:
                logger.warning("Metrics: the OpenTelemetry collector at %s does not take the "
                               "push (down, or refusing it); training goes on, and the push "
                               "is retried every interval.", url)
            elif ok and self.failing:
                logger.warning("Metrics: the OpenTelemetry collector at %s takes the push "
                               "again.", url)
            self.failing = not ok
            return result

    return WarningExporter(endpoint=url, timeout=timeout_s)


class OtlpSink:
    """The figures as OpenTelemetry instruments of one meter, pushed to ``url``."""

    def __init__(self, url: str, interval_s: float):
        check_installed()
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
        from opentelemetry.sdk.resources import Resource

        for name in _SDK_LOGGERS:  # the warning above says it once
            logging.getLogger(name).setLevel(logging.CRITICAL)
        self.reader = PeriodicExportingMetricReader(
            _warning_exporter(url, timeout_s=min(5.0, interval_s)),
            export_interval_millis=interval_s * 1000)
        views = [View(instrument_name=m.name,
                      aggregation=ExplicitBucketHistogramAggregation(BUCKETS_S))
                 for m in METRICS if m.kind is Kind.HISTOGRAM]
        self.provider = MeterProvider(
            metric_readers=[self.reader], views=views,
            resource=Resource.create({"service.name": "elastic-train"}))
        meter = self.provider.get_meter("elastic_train")
        makers = {Kind.COUNTER: meter.create_counter, Kind.GAUGE: meter.create_gauge,
                  Kind.HISTOGRAM: meter.create_histogram}
        self._instruments = {
            m.name: makers[m.kind](m.name, unit=_unit(m.name), description=m.help)
            for m in METRICS}

    def record(self, metric: Metric, value: float, labels: dict[str, str]) -> None:
        instrument = self._instruments[metric.name]
        if metric.kind is Kind.COUNTER:
            instrument.add(value, labels)
        elif metric.kind is Kind.GAUGE:
            instrument.set(value, labels)
        else:
            instrument.record(value, labels)

    def close(self) -> None:
        """Pushes the last values and stops the reader's thread."""
        self.provider.shutdown()


def _unit(name: str) -> str:
    """The UCUM unit the name's suffix says (OpenTelemetry's convention)."""
    return "s" if name.endswith("_seconds") else "By" if name.endswith("_bytes") else "1"
