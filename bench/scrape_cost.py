"""How long a scrape of the Prometheus endpoint takes with 64 ranks' worth of series
(issue #40's bar: < 10 ms).

The endpoint's series carry ``node`` and ``run``, never a rank: one node's endpoint serves
one node's series however many ranks the job runs (``--nodes 1``, the default: a node of
a 64-rank job, every metric and label value filled in: restarts with each of their 3
causes, badput with each of its 10). ``--nodes 64`` puts 64 nodes' series in one registry,
which no endpoint serves (each node serves its own): what a scrape would cost if it did.
The endpoint is served by prometheus_client's own server, as in a run, and scraped over
HTTP from this process.

    python -m bench.scrape_cost [--nodes 1] [--scrapes 300]
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.request

from bench.procs import free_port
from elastic_train.driver.node_metrics import NodeMetrics
from elastic_train.driver.prometheus_endpoint import PrometheusSink
from elastic_train.goodput.breakdown import Cause

RANKS = 64
CAUSES = ("failure", "peer", "preemption")
BADPUT = tuple(cause.value for cause in Cause if cause is not Cause.PRODUCTIVE)


def filled(nodes: int, ranks: int = RANKS) -> PrometheusSink:
    """An endpoint's registry with every series of ``nodes`` nodes of a ``ranks``-rank job."""
    sink = PrometheusSink()
    for node in range(nodes):
        metrics = NodeMetrics("bench", f"node-{node}", [sink])
        for cause in CAUSES:
            metrics.note_failure(cause, restarting=True, failed_at=None)
            metrics.note_rendezvous(world_size=ranks)
        metrics.note_row({"step_time_s": 0.1, "slowest_rank_score": 1.1})
        metrics.note_commit(2.0, 1 << 30)
        metrics.note_goodput({"productive": 1000.0, **{cause: 1.0 for cause in BADPUT}})
    return sink


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--scrapes", type=int, default=300)
    args = parser.parse_args()
    sink, port = filled(args.nodes), free_port()
    sink.serve("127.0.0.1", port)
    url = f"http://127.0.0.1:{port}/metrics"
    body = urllib.request.urlopen(url).read()
    series = sum(1 for line in body.decode().splitlines() if line and line[0] != "#")
    took = []
    for _ in range(args.scrapes):
        start = time.perf_counter()
        with urllib.request.urlopen(url) as response:
            response.read()
        took.append((time.perf_counter() - start) * 1000)
    sink.close()
    took.sort()
    print(f"{RANKS} ranks, {args.nodes} node(s) in the registry: {series} series, "
          f"{len(body)} bytes; scrape median "
          f"{statistics.median(took):.2f} ms, p99 {took[int(len(took) * 0.99) - 1]:.2f} ms, "
          f"max {took[-1]:.2f} ms over {args.scrapes} scrapes")


if __name__ == "__main__":
    main()
