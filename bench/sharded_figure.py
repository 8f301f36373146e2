"""Figures 10 and 11: sharded (FSDP2 + DCP) checkpoints on S3 (moto's server).

The job is :mod:`bench.sharded_job`, run by ``python -m bench.sharded_run`` (one
driver process per node); every rank saves its shards with DCP and reports them.

Figure 10 -- bytes downloaded per node on restart. A 4-rank job on 2 nodes (two
driver processes here, 2 workers each) whose drivers reach moto through a TCP
proxy each, which counts the bytes it passes from the server. First launch:
rank 1 SIGKILLs itself once checkpoint 0 is committed (the nodes survive), the
group restarts and loads it, then the run fails on purpose once checkpoint 1 is
committed. Second launch: two fresh drivers (as replacement nodes: no local
copies) continue the run from checkpoint 1. Loaders: ``as_directory()`` (every
node downloads the whole checkpoint) and ``CheckpointReader``.

Figure 11 -- worker SIGKILL -> first step again with a 400 MB sharded checkpoint
(2 workers, one node), with the checkpoint on local disk, on S3 with the local
tier, and on S3 downloading (``ELASTIC_TRAIN_LOCAL_TIER=0``). Figure 11b, from the
same runs: the time ``report()`` and the save before it block a rank per checkpoint --
``elastic_train.torch.async_save`` (a writer process), ``dcp.async_save`` (a thread)
and ``dcp.save`` -- against a bare copy of the same tensors into host memory, and the
training steps' speed while a checkpoint is being written.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec

from bench import background_cost, procs
from bench.report import Table
from bench.sharded_job import MIB
from bench.stats import Summary, Target, fmt_ratio, ratio, with_target
from bench.variants import REPO

TIER_TARGET = Target(1.1, at_least=False)
BUCKET = "bench-sharded"


@dataclass
class Launch:
    """One launch of the job on one or more nodes, and what its ranks noted."""

    ok: list[bool]
    events: list[dict]
    tails: list[str]
    others: float | None = None  # mean CPU use of other processes, cores

    def times(self, event: str, rank: int | None = None) -> list[float]:
        return [e["time"] for e in self.events
                if e["event"] == event and rank in (None, e["rank"])]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    return env


def _events(directory: str) -> list[dict]:
    out = []
    for name in sorted(os.listdir(directory)):
        if name.startswith("rank") and name.endswith(".jsonl"):
            with open(os.path.join(directory, name)) as f:
                out += [{**json.loads(line), "rank": int(name[4:-6])} for line in f]
    return out


def _launch(nodes: list[dict], events: str, scratch: str, timeout_s: float) -> Launch:
    """Runs one driver per node config at once; waits for all."""
    results: list[procs.RunResult | None] = [None] * len(nodes)

    def one(i: int) -> None:
        cmd = [sys.executable, "-m", "bench.sharded_run", json.dumps(nodes[i])]
        results[i] = procs.run(cmd, _env(), REPO, timeout_s,
                               os.path.join(scratch, f"node{i}-{len(os.listdir(scratch))}.log"),
                               memory=False)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return Launch([r is not None and "RESULT" in r.output_tail for r in results],
                  _events(events), [r.output_tail if r else "" for r in results],
                  results[0].foreign_cores if results[0] else None)


def _job(size_mb: float, events: str, **train: Any) -> dict:
    return {"size_mb": size_mb, "layers": 4, "steps": 2, "events": events,
            "saver": "sync", "loader": "reader", **train}


# Figure 10 ---------------------------------------------------------------------------

def _shard_reads_once(suite: Any, endpoint: str, loader: str, rep: int, scratch: str
                      ) -> dict[str, list[float]]:
    from tests.support.servers import TcpProxy, free_port, s3_options

    proxies = [TcpProxy(int(endpoint.rsplit(":", 1)[1])) for _ in (0, 1)]
    name = f"reads-{loader}-{rep}"
    events = tempfile.mkdtemp(dir=scratch)
    train = _job(suite.profile.shard_reads_mb, events, loader=loader, epochs=3, kill_epoch=1,
                 kill_rank=1, kill_marker=os.path.join(events, "killed"), fail_epoch=2)

    def nodes(train_config: dict) -> list[dict]:
        rendezvous = {"endpoint": f"127.0.0.1:{free_port()}", "run_id": f"{name}-{free_port()}"}
        return [{"storage": f"s3://{BUCKET}/runs", "name": name, "workers": 4, "per_node": 2,
                 "options": s3_options(f"http://127.0.0.1:{p.port}"), "max_failures": 1,
                 "rendezvous": rendezvous, "train": train_config} for p in proxies]

    first = _launch(nodes(train), events, scratch, suite.profile.timeout_s)
    if not first.times("kill") or not first.times("loaded"):
        raise RuntimeError(f"figure 10, first launch did not restart: {first.tails[0][-800:]}")
    killed = first.times("kill")[0]
    restart_end = max(first.times("loaded"))
    second_start = time.time()
    second = _launch(nodes({**train, "epochs": 2, "kill_epoch": None, "fail_epoch": None}),
                     events, scratch, suite.profile.timeout_s)
    if not all(second.ok):
        raise RuntimeError(f"figure 10, second launch failed: {second.tails[0][-800:]}")
    reloaded = max(t for t in second.times("loaded") if t > second_start)
    fs = fsspec.filesystem("s3", **s3_options(endpoint))
    checkpoint = f"{BUCKET}/runs/{name}/checkpoint_000001"
    sizes = {p.rsplit("/", 1)[1]: fs.size(p) for p in fs.find(checkpoint)}
    for proxy in proxies:
        proxy.cut()
    return {
        "survivors": [p.downloaded_between(killed, restart_end) / MIB for p in proxies],
        "replacements": [p.downloaded_between(second_start, reloaded) / MIB for p in proxies],
        "checkpoint": [sum(v for k, v in sizes.items() if k != ".commit.json") / MIB],
        "metadata": [sizes[".metadata"] / MIB],
    }


Once = Callable[[Any, str, Any, int, str], dict[str, list[float]]]


def _measure(suite: Any, figure: str, variants: Sequence[Any], label: Callable[[Any], str],
             once: Once) -> dict[str, dict[str, list[float]]]:
    """``once(suite, moto endpoint, variant, repetition, scratch)`` for each repetition
    and variant, against one moto server; the values of each key, by variant label."""
    from tests.support.servers import MotoS3Server, s3_options

    scratch = tempfile.mkdtemp(prefix=f"bench_{figure}_")
    moto = MotoS3Server()
    rows: dict[str, dict[str, list[float]]] = {}
    try:
        fsspec.filesystem("s3", **s3_options(moto.endpoint)).mkdir(BUCKET)
        for rep in range(suite.profile.repeat):
            for variant in variants:
                got = once(suite, moto.endpoint, variant, rep, scratch)
                for key, values in got.items():
                    rows.setdefault(label(variant), {}).setdefault(key, []).extend(values)
                suite.echo(f"  [{figure}] rep {rep + 1}/{suite.profile.repeat} "
                           f"{label(variant)}: done")
    finally:
        moto.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return rows


def shard_reads(suite: Any) -> list[Table]:
    """Figure 10: MiB downloaded per node when a 4-rank sharded checkpoint is loaded."""
    rows = _measure(suite, "shard_reads", ("directory", "reader"), str, _shard_reads_once)
    return [_reads_table(rows, suite.profile.repeat)]


_LOADERS = {"directory": "as_directory() + dcp.load(checkpoint_id=dir) (as before)",
            "reader": "dcp.load(storage_reader=CheckpointReader(checkpoint))"}


def _reads_table(rows: dict[str, dict[str, list[float]]], repeat: int) -> Table:
    table = Table("Figure 10 — MiB downloaded per node when a restart loads a 4-rank sharded "
                  "checkpoint from S3 (2 nodes × 2 workers; median (min–max) over nodes and "
                  "repetitions)",
                  ["restart", "loader", "downloaded per node MiB", "checkpoint MiB",
                   "a node's share + .metadata MiB", "per node / share"])
    for scenario, label in (("replacements", "new nodes (no local copies)"),
                            ("survivors", "worker SIGKILL, nodes survive")):
        for loader, row in rows.items():
            got, size = Summary.of(row[scenario]), Summary.of(row["checkpoint"])
            share = Summary.of([c / 2 + m for c, m in zip(row["checkpoint"], row["metadata"],
                                                          strict=True)])
            per_share = ratio(got, share)
            table.add(label, _LOADERS[loader], got.fmt(1), size.fmt(1), share.fmt(1),
                      "n/a" if per_share is None else f"{per_share:.2f}")
    table.notes += [
        f"{repeat} repetition(s). Each node's driver reaches moto's S3 server through a TCP "
        "proxy of its own; the count is every byte the server sent to that node (checkpoint "
        "files, and the small JSON files a start reads).",
        "New nodes: from the second launch's start until every rank has loaded checkpoint 1 "
        "(fresh drivers: nothing kept locally). Worker SIGKILL: from the kill until every "
        "rank of the restarted group has loaded checkpoint 0.",
        "Before a restart every file is checked against the manifest by the rank that wrote "
        "it, which also brings it to its node when the node lacks it; with "
        "CheckpointReader a rank then reads its shards there and fetches other byte ranges "
        "it needs from S3, while as_directory() fetches every file to every node.",
    ]
    return table


# Figure 11 ---------------------------------------------------------------------------

_TIER_VARIANTS = (  # (label, on S3, environment, saver: see bench.sharded_job._Saver)
    ("local disk", False, {}, "thread"),
    ("S3, local tier", True, {}, "thread"),
    ("S3, downloading (ELASTIC_TRAIN_LOCAL_TIER=0)", True, {"ELASTIC_TRAIN_LOCAL_TIER": "0"},
     "thread"),
    ("S3, local tier, dcp.save", True, {}, "sync"),
    ("S3, local tier, async_save", True, {}, "process"),
    ("local disk, async_save", False, {}, "process"),
)
BLOCKED_TARGET = Target(1.2, at_least=False)  # blocked per checkpoint / a bare host copy
STEPS_TARGET = Target(0.95, at_least=True)  # steps/s while a write runs / without one
_TIMED_STEPS = 5
# 2 epochs before the kill, 6 after: 5 saves after the first of an attempt (and the
# first of the back-to-back pair) are timed per run, where 4 epochs gave 2: a 15 ms
# save call on 2 shared cores needs more than 2 samples for a median.
_TIER_EPOCHS = 8


def _tier_once(suite: Any, endpoint: str, variant: tuple, rep: int,
               scratch: str) -> dict[str, list[float]]:
    from tests.support.servers import s3_options

    label, on_s3, env, saver = variant
    events = tempfile.mkdtemp(dir=scratch)
    node = {"storage": f"s3://{BUCKET}/tier" if on_s3 else os.path.join(scratch, "results"),
            "options": s3_options(endpoint) if on_s3 else None,
            "name": f"tier-{_TIER_VARIANTS.index(variant)}-{rep}", "workers": 2,
            "per_node": 2, "max_failures": 1, "env": env,
            "train": _job(suite.profile.local_tier_mb, events, saver=saver, epochs=_TIER_EPOCHS,
                          kill_epoch=2, kill_rank=1, settle=True,
                          kill_marker=os.path.join(events, "killed"),
                          timed_steps=_TIMED_STEPS, back_to_back=True)}
    launch = _launch([node], events, scratch, suite.profile.timeout_s)
    kills = launch.times("kill")
    if not all(launch.ok) or not kills:
        raise RuntimeError(f"figure 11 ({label}) failed: {launch.tails[0][-800:]}")
    again = min(t for t in launch.times("first_step", 0) if t > kills[0])
    loaded = min(t for t in launch.times("loaded", 0) if t > kills[0])
    started = min(t for t in launch.times("started", 0) if t > kills[0])
    saves = [e for e in launch.events if e["event"] == "save" and e["rank"] == 0]
    later = [e for e in saves if not e["first"]]  # the writers are up, the imports done
    steps = [e for e in launch.events if e["event"] == "steps"]
    return {"restart": [again - kills[0]], "loaded": [loaded - kills[0]],
            "started": [started - kills[0]], "others": [launch.others],
            "save": [e["save_s"] for e in later],
            "report": [e["report_s"] for e in later],
            "blocked": [e["save_s"] + e["report_s"] for e in later],
            "first": [e["save_s"] + e["report_s"] for e in saves if e["first"]],
            "copy": [e["copy_s"] for e in later],
            "back_to_back": [e["save_s"] + e["report_s"] for e in launch.events
                             if e["event"] == "back_to_back" and e["rank"] == 0],
            "quiet": [t for e in steps for t in e["quiet"]],
            "writing": [t for e in steps if not e["first"] for t in e["writing"]],
            "writing_first": [t for e in steps if e["first"] for t in e["writing"]]}


def local_tier(suite: Any) -> list[Table]:
    """Figure 11: worker SIGKILL -> first step again, sharded 400 MB checkpoint."""
    rows = _measure(suite, "local_tier", _TIER_VARIANTS, lambda v: v[0], _tier_once)
    bound = background_cost.table([background_cost.measure(suite.profile.background_steps)
                                   for _ in range(suite.profile.repeat)])
    return [*_tier_tables(rows, suite.profile), bound]


def _tier_tables(rows: dict[str, dict[str, list[float]]], profile: Any) -> list[Table]:
    size = profile.local_tier_mb
    restart = Table(f"Figure 11 — worker SIGKILL → first step again with a {size:g} MB "
                    "sharded checkpoint (2 workers, s, median (min–max))",
                    ["checkpoint", "kill → train function (checked)", "kill → state loaded",
                     "kill → first step again", "ratio to local disk, target",
                     "others' CPU (cores)"])
    floor = Summary.of(rows["local disk"]["restart"])
    for label, row in rows.items():
        value = Summary.of(row["restart"])
        cell = "floor" if label == "local disk" else with_target(ratio(value, floor),
                                                                 TIER_TARGET)
        restart.add(label, Summary.of(row["started"]).fmt(), Summary.of(row["loaded"]).fmt(),
                    value.fmt(), cell, Summary.of(row["others"]).fmt(2))
    restart.notes += [
        f"{profile.repeat} repetition(s); FSDP2 MLP, AdamW, DCP shards of both ranks "
        "committed after each epoch (num_to_keep=2); rank 1 SIGKILLs itself once checkpoint "
        "1 is committed; the group restarts and dcp.load reads through CheckpointReader.",
        "Local tier: the node kept the files its ranks uploaded and checks them against the "
        "manifest (size and SHA-256) before use. Downloading: nothing kept, each rank "
        "downloads (and checks) its share before the restart.",
        "Times are rank 0's time.time() stamps after the kill: its train function entered "
        "(the session is up: restart point chosen, every rank's share checked), the state "
        "loaded, the first step. S3 is moto's server (in memory) on 127.0.0.1.",
        "others' CPU: mean CPU use of processes outside the run (/proc/stat), of 2 cores.",
    ]
    return [restart, *_blocked_tables(rows, size)]


_SAVERS = (  # (variant, how the save is made)
    ("S3, local tier, async_save", "elastic_train.torch.async_save (writer process)"),
    ("S3, local tier", "dcp.async_save (thread) + report(written=...)"),
    ("S3, local tier, dcp.save", "dcp.save + report()"),
)


_LOCAL_WRITER = ("local disk, async_save",
                 "elastic_train.torch.async_save, the run on local disk (no S3, no moto)")


def _blocked_tables(rows: dict[str, dict[str, list[float]]], size: float) -> list[Table]:
    """Figure 11b: what a checkpoint costs the training, by how it is saved."""
    return [_blocked_table(rows, size), _steps_table(rows, size)]


def _blocked_table(rows: dict[str, dict[str, list[float]]], size: float) -> Table:
    """Figure 11b: how long a rank is blocked per checkpoint, by how it is saved."""
    blocked = Table(f"Figure 11b — time a rank is blocked per checkpoint with a {size:g} MB "
                    "sharded state (rank 0, s, median (min–max) over the checkpoints after "
                    "the first of each attempt)",
                    ["save", "save call", "report()", "total blocked",
                     "bare host copy, same run", "save call / copy, goal", "total / copy",
                     "first save of an attempt", "a save at once after another"])
    for label, save in _SAVERS:
        row = rows[label]
        call, total = Summary.of(row["save"]), Summary.of(row["blocked"])
        copy = Summary.of(row["copy"])
        goal = ratio(call, copy)
        blocked.add(save, call.fmt(3), Summary.of(row["report"]).fmt(3), total.fmt(3),
                    copy.fmt(3),
                    with_target(goal, BLOCKED_TARGET) if label == _SAVERS[0][0]
                    else fmt_ratio(goal),
                    fmt_ratio(ratio(total, copy)), Summary.of(row["first"]).fmt(3),
                    Summary.of(row["back_to_back"]).fmt(3))
    blocked.notes += [
        "Each save starts once the previous checkpoint is committed (uploads keep up with "
        "training): the times are the save's own, without report()'s wait for a slower "
        "upload. The last column is the exception: a save made at once after the one "
        "before (no steps between), which waits for that one's write -- at most one write "
        "is in flight per rank (async_save's back-pressure rule; dcp.async_save's own "
        "future is waited for the same way here).",
        "Bare host copy: every tensor of the rank's state (its FSDP2 shards and AdamW "
        "state) copied into CPU buffers allocated at the first save, timed just before "
        "each save; the floor of what any save blocks for. The goal is async_save's, on "
        "the save call: report() costs the same with or without a background write (the "
        "ranks exchange their file lists, rank 0 appends the metrics row to S3), and is "
        "shown beside it.",
        "The first save of an attempt (left out of the other columns) also imports DCP, "
        "waits for the slowest rank (the writers start together) and, for async_save, "
        "allocates the shared-memory buffers and starts the writer processes (a new "
        "interpreter each, importing torch, in the background).",
        "async_save copies the state into shared memory (the first save with DCP's "
        "DefaultStager, the next ones into the same buffers, see "
        "elastic_train/torch/keeping_stager.py), and DCP's writer process -- a gloo group "
        "of its own between the ranks' writers, save plans cached, under SCHED_IDLE -- "
        "writes the files; report() with "
        "the returned checkpoint does not wait for them, which are uploaded and committed "
        "once written. dcp.async_save copies likewise and writes in a thread of the "
        "training process. dcp.save writes the files first; report() then copies them into "
        "the staging area.",
    ]
    return blocked


def _steps_table(rows: dict[str, dict[str, list[float]]], size: float) -> Table:
    """Figure 11b, continued: how fast training steps while a checkpoint is written."""
    steps = Table(f"Figure 11b (continued) — training steps while a checkpoint's files are "
                  f"being written ({size:g} MB sharded state; s per step, median (min–max), both "
                  "ranks)",
                  ["save", "steps with nothing in flight", "steps during the write",
                   "steps/s during / without, goal", "steps during the first write"])
    for label, save in (*_SAVERS[:2], _LOCAL_WRITER):
        row = rows[label]
        quiet, writing = Summary.of(row["quiet"]), Summary.of(row["writing"])
        speed = ratio(quiet, writing)  # steps per second: the inverse of s per step
        cell = with_target(speed, STEPS_TARGET) if label == _SAVERS[0][0] else fmt_ratio(speed)
        steps.add(save, f"{quiet.fmt(3)} (n={len(row['quiet'])})",
                  f"{writing.fmt(3)} (n={len(row['writing'])})", cell,
                  f"{Summary.of(row['writing_first']).fmt(3)} "
                  f"(n={len(row['writing_first'])})")
    steps.notes += [
        f"Without: the {_TIMED_STEPS} steps before each save, once the previous checkpoint is "
        "committed (nothing written or uploaded). During: of as many steps after each save, "
        "those that began while the rank's files were still being written (a write "
        "shorter than a step slows that step alone); the first save of an attempt apart "
        "(its write waits for the writer processes to start).",
        "A step that begins during a write also overlaps what follows it, the files' upload "
        "to moto once the write ends (a write may be shorter than a step): the "
        "figure bounds what a write and its upload cost the training together, for both "
        "writers alike. The last row has no upload to S3 and no moto server: the run is on "
        "local disk, where report() copies the written files into the run directory.",
        "2 CPU cores for 2 ranks, their writers and uploads, and moto's S3 server: a writer "
        "process does not take the training's GIL, but it does take CPU time (serialising "
        "and writing the state) from a machine that has none spare, so on this machine "
        "steps slow while a write runs, whoever writes. On a GPU node the step runs on the "
        "device and the writer on otherwise idle host cores.",
    ]
    return steps
