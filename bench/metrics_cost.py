"""What the metric exporters cost (issue #40's bars): how long a scrape of the Prometheus
endpoint takes with 64 ranks' worth of series (< 10 ms), and the CPU the driver's feed
spends per poll of a real run directory (step overhead <= 0.5 %).

Scrapes: the endpoint's series carry ``node`` and ``run``, never a rank: one node's endpoint serves
one node's series however many ranks the job runs (``--nodes 1``, the default: a node of
a 64-rank job, every metric and label value filled in: restarts with each of their 3
causes, badput with each of its 10). ``--nodes 64`` puts 64 nodes' series in one registry,
which no endpoint serves (each node serves its own): what a scrape would cost if it did.
The endpoint is served by prometheus_client's own server, as in a run, and scraped over
HTTP from this process.

The driver's feed (``--run-dir``, a run's directory): the workers do no metrics work,
so what metrics can take from a step is the CPU of the driver's feed, which the monitor
calls about once a second (:mod:`elastic_train.driver.metrics_feed`). Each measured poll
gets a new report with a checkpoint that is committed (the most a poll ever does) and
every 10th reads the goodput ledger, as at one poll a second; the thread's CPU time per
poll over one second is its share of a core.

    python -m bench.metrics_cost [--nodes 1] [--scrapes 300] [--run-dir DIR --polls 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.request

from bench.procs import free_port
from elastic_train.driver.metrics_feed import MetricsFeed
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


def poll_cost(run_dir: str, polls: int) -> float:
    """The feed's CPU seconds per poll of ``run_dir`` (see the module)."""
    from elastic_train.storage import RunStorage
    from elastic_train.storage import filesystem as fsutil

    fs, path = fsutil.resolve(run_dir)
    storage = RunStorage(fs, path)
    rows = [r for r in storage.read_metrics() if r.get("checkpoint_dir_name")]
    committed = {m.name for m in storage.checkpoints.committed()}
    rows = [r for r in rows if r["checkpoint_dir_name"] in committed]
    if not rows:
        raise SystemExit(f"{run_dir} has no committed checkpoint: pass a finished run's")
    feed = MetricsFeed(NodeMetrics("bench", "node-0", [PrometheusSink()]), storage)
    start = time.thread_time()
    for i in range(polls):
        feed.observe(rows[i % len(rows)])
        feed.poll(final=i % 10 == 0)
    return (time.thread_time() - start) / polls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--run-dir", default=None)
    parser.add_argument("--polls", type=int, default=2000)
    args = parser.parse_args()
    if args.run_dir:
        cpu = poll_cost(args.run_dir, args.polls)
        print(f"driver feed: {cpu * 1e6:.0f} µs CPU per poll over {args.polls} polls = "
              f"{cpu * 100:.3f} % of a core at one poll a second")
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
