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

Rank 0's ledger (``--ledger-reports``): the goodput ledger is always on; what it costs a
worker is rank 0's report clock (:class:`~elastic_train.worker.attempt_clock.AttemptClock`:
a few clock reads per report, its three numbers in the report's first collective) and
its ledger lines (one per checkpoint report, at least every 10 s), appended to a real
ledger file on local disk. Measured per report, a checkpoint every ``--per-checkpoint``
reports, on the thread's CPU clock and the wall clock.

The driver's feed (``--run-dir``, a run's directory): the workers do no metrics work,
so what metrics can take from a step is the CPU of the driver's feed, which the monitor
calls about once a second (:mod:`elastic_train.driver.metrics_feed`). Each measured poll
gets a new report with a checkpoint that is committed (the most a poll ever does) and
every 10th reads the goodput ledger, as at one poll a second; the thread's CPU time per
poll over one second is its share of a core.

    python -m bench.metrics_cost [--nodes 1] [--scrapes 300] [--run-dir DIR --polls 2000]
                                 [--ledger-reports 20000 --per-checkpoint 60]
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


def ledger_cost(reports: int, per_checkpoint: int) -> tuple[float, float]:
    """Rank 0's report clock and ledger lines: (thread CPU, wall) seconds per report."""
    import tempfile

    from elastic_train.storage import RunStorage
    from elastic_train.worker.attempt_clock import AttemptClock, RunHistory

    with tempfile.TemporaryDirectory() as root:
        clock = AttemptClock(RunHistory(), iteration=0,
                             ledger=RunStorage.open(root, "run").ledger_file("rank0"))
        clock.ready(time.time(), restored_iteration=None)
        cpu, wall = time.thread_time(), time.perf_counter()
        for i in range(1, reports + 1):
            numbers = clock.shared_numbers()
            clock.waited()
            clock.report_ends([[n] for n in numbers], any_checkpoint=i % per_checkpoint == 0,
                              iteration=i)
        took = (time.thread_time() - cpu) / reports, (time.perf_counter() - wall) / reports
        clock.finish(0.0, reports)  # the ledger's thread done before the directory goes
        return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--run-dir", default=None)
    parser.add_argument("--polls", type=int, default=2000)
    parser.add_argument("--ledger-reports", type=int, default=0)
    parser.add_argument("--per-checkpoint", type=int, default=60)
    args = parser.parse_args()
    if args.ledger_reports:
        cpu, wall = ledger_cost(args.ledger_reports, args.per_checkpoint)
        print(f"rank 0's clock and ledger: {cpu * 1e6:.1f} µs CPU, {wall * 1e6:.1f} µs wall per "
              f"report over {args.ledger_reports} reports (a checkpoint every "
              f"{args.per_checkpoint})")
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
