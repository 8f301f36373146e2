"""A small OTLP/HTTP metrics receiver for tests: on a free port of 127.0.0.1, it decodes
each POST to ``/v1/metrics`` as opentelemetry.proto's ``ExportMetricsServiceRequest``
(the real protobuf payload, as a collector would) and keeps every data point.

Example::

    with OtlpReceiver() as receiver:
        ...  # push to receiver.url
        receiver.latest("elastic_train_world_size", run="r")  # 2.0
"""

from __future__ import annotations

import http.server
import threading
from dataclasses import dataclass
from types import TracebackType

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from tests.support.servers import free_port


@dataclass(frozen=True)
class Point:
    """One decoded data point: a number's value, a histogram's count and sum."""

    name: str
    kind: str  # "gauge", "sum" or "histogram"
    attributes: dict[str, str]
    value: float
    count: int = 0


def _points(request: ExportMetricsServiceRequest) -> list[Point]:
    points = []
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                kind = metric.WhichOneof("data")
                for point in getattr(metric, kind).data_points:
                    attributes = {a.key: a.value.string_value for a in point.attributes}
                    if kind == "histogram":
                        points.append(Point(metric.name, kind, attributes, point.sum,
                                            point.count))
                    else:
                        value = point.as_double if point.HasField("as_double") else point.as_int
                        points.append(Point(metric.name, kind, attributes, float(value)))
    return points


class OtlpReceiver:
    """The receiver; a context manager that serves from a thread until it exits."""

    def __init__(self) -> None:
        self.points: list[Point] = []
        self.requests = 0
        received = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 -- http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ok = self.path == "/v1/metrics" and \
                    self.headers["Content-Type"] == "application/x-protobuf"
                if ok:
                    request = ExportMetricsServiceRequest()
                    request.ParseFromString(body)
                    received.points += _points(request)
                    received.requests += 1
                reply = ExportMetricsServiceResponse().SerializeToString() if ok else b""
                self.send_response(200 if ok else 400)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.server.shutdown()
        self.server.server_close()

    def latest(self, name: str, **attributes: str) -> Point | None:
        """The last point received of ``name`` whose attributes include ``attributes``."""
        found = [p for p in self.points if p.name == name
                 and all(p.attributes.get(k) == v for k, v in attributes.items())]
        return found[-1] if found else None
