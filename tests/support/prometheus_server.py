"""A real Prometheus server for tests (Debian's ``prometheus`` package): on a free port of
127.0.0.1, with a temporary config and data directory, scraping one target; stopped by
its own pid. :func:`prometheus_binary` is None where it is not installed (the test then
skips, saying so)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.support.servers import free_port, stop_process

SCRAPE_S = 0.5  # its timeout too (at most the interval): a loaded machine answers slowly


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


class PrometheusServer:
    """Prometheus scraping ``target`` (``host:port``) every :data:`SCRAPE_S`."""

    def __init__(self, binary: str, target: str, start_timeout: float = 30.0):
        self.binary, self.target, self.start_timeout = binary, target, start_timeout
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = tempfile.TemporaryDirectory(prefix="prometheus-test-")
        self._log = open(Path(self._dir.name) / "log", "w+")  # noqa: SIM115 -- closed in stop
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Starts it and returns once it is ready; raises with its log if it is not in time."""
        config = Path(self._dir.name) / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": f"{int(SCRAPE_S * 1000)}ms",
                       "scrape_timeout": f"{int(SCRAPE_S * 1000)}ms"},
            "scrape_configs": [{"job_name": "elastic-train",
                                "static_configs": [{"targets": [self.target]}]}]}))
        self._proc = subprocess.Popen(
            [self.binary, f"--config.file={config}",
             f"--storage.tsdb.path={Path(self._dir.name) / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline and self._proc.poll() is None:
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{self.url}/-/ready", timeout=1).status == 200:
                    return
            time.sleep(0.1)
        log = self.output()
        self.stop()
        raise RuntimeError(f"prometheus was not ready in {self.start_timeout}s:\n{log}")

    def query(self, expr: str) -> list[dict]:
        """The result of an instant query through ``/api/v1/query``."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.load(response)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def value(self, expr: str) -> float | None:
        """The single value ``expr`` has now (None: no series)."""
        result = self.query(expr)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def output(self) -> str:
        self._log.flush()
        self._log.seek(0)
        return self._log.read()

    def stop(self) -> None:
        if self._proc is not None:
            stop_process(self._proc)
        self._log.close()
        self._dir.cleanup()


@contextlib.contextmanager
def running(binary: str, target: str) -> Iterator[PrometheusServer]:
    server = PrometheusServer(binary, target)
    server.start()
    try:
        yield server
    finally:
        server.stop()
