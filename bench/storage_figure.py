"""Figure 7: checkpoint storage -- what ``report()`` costs a rank, and upload throughput.

For each checkpoint size, one worker (``TorchTrainer``, ASYNC uploads) times a
plain ``torch.save`` of its state to local disk, then ``report()`` with that
directory as the checkpoint (the time the rank is blocked: staging and
queueing), then waits until the commit marker is visible in storage
(upload + commit, in the background). The run's storage is a local directory
or an S3 bucket on a moto server this benchmark starts on 127.0.0.1. Each
throughput is then compared with a bare ``fs.put`` of a file of the same size
to the same filesystem, timed in this process.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from typing import Any

import cloudpickle
import fsspec

from bench.report import Table
from bench.stats import Summary, fmt_ratio, ratio
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.stores.s3 import PART_SIZE, PARTS_AT_ONCE

MIB = 1 << 20
_TENSORS = 8  # the state is this many float32 tensors, as a model's would be


def _state(size_mb: int) -> dict[str, Any]:
    import torch

    numel = size_mb * MIB // 4 // _TENSORS
    gen = torch.Generator().manual_seed(size_mb)
    return {f"layer{i}": torch.randn(numel, generator=gen) for i in range(_TENSORS)}


def _train(config: dict[str, Any]) -> list[dict[str, float]]:
    """The worker: for each size, torch.save, report(), then wait for the commit."""
    import torch

    import elastic_train as et

    fs, run_path = fsspec.core.url_to_fs(config["run_url"], **config["options"])
    timings = []
    for index, size_mb in enumerate(config["sizes_mb"]):
        state = _state(size_mb)
        with tempfile.TemporaryDirectory() as d:
            began = time.perf_counter()
            torch.save(state, os.path.join(d, "state.pt"))
            saved = time.perf_counter()
            et.report({"size_mb": size_mb}, checkpoint=et.Checkpoint.from_directory(d),
                      checkpoint_upload_mode="ASYNC")
            reported = time.perf_counter()
        marker = f"{run_path}/checkpoint_{index:06d}/.commit.json"
        while not (fs.invalidate_cache() or fs.exists(marker)):
            time.sleep(0.01)
        timings.append({"size_mb": size_mb, "save_s": saved - began,
                        "report_s": reported - saved, "commit_s": time.perf_counter() - reported})
    return timings


def _fit(storage_url: str, options: dict[str, Any], name: str,
         sizes_mb: tuple[int, ...]) -> list[dict[str, float]]:
    import elastic_train as et
    from elastic_train.torch import TorchTrainer

    config = {"run_url": f"{storage_url}/{name}", "options": options, "sizes_mb": sizes_mb}
    return TorchTrainer(
        _train, train_loop_config=config, scaling_config=et.ScalingConfig(num_workers=1),
        run_config=et.RunConfig(storage_path=storage_url, name=name,
                                storage_options=options or None, verbose=0),
    ).fit().return_value


def _bare_put_s(fs: fsspec.AbstractFileSystem, target: str, size_mb: int) -> float:
    """Seconds of one ``fs.put`` of a ``size_mb`` torch.save file to ``target``."""
    import torch

    with tempfile.TemporaryDirectory() as d:
        local = os.path.join(d, "state.pt")
        torch.save(_state(size_mb), local)
        fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        began = time.perf_counter()
        fs.put(local, target)
        seconds = time.perf_counter() - began
    fs.rm(target)
    return seconds


def _targets(scratch: str, s3_endpoint: str) -> list[tuple[str, str, dict[str, Any]]]:
    """``(label, storage URL, storage options)`` of local disk and the S3 server."""
    from tests.support.servers import s3_options

    options = s3_options(s3_endpoint)
    fsspec.filesystem("s3", **options).mkdir("bench")
    return [("local disk", os.path.join(scratch, "results"), {}),
            ("S3 (moto server)", "s3://bench/results", options)]


def storage(suite: Any) -> list[Table]:
    """Figure 7: report() blocking and upload throughput, local disk and S3."""
    from tests.support.servers import MotoS3Server

    sizes = suite.profile.storage_sizes_mb
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need no bench/
    scratch = tempfile.mkdtemp(prefix="bench_storage_")
    server = MotoS3Server()
    rows: dict[tuple[str, int], dict[str, list[float]]] = {}
    try:
        targets = _targets(scratch, server.endpoint)
        for rep in range(suite.profile.repeat):
            for label, url, options in targets:
                fs, root = fsutil.resolve(url, options=options)
                for t in _fit(url, options, f"rep{rep}", sizes):
                    row = rows.setdefault((label, t["size_mb"]), {})
                    for key in ("save_s", "report_s", "commit_s"):
                        row.setdefault(key, []).append(t[key])
                    row.setdefault("put_s", []).append(
                        _bare_put_s(fs, f"{root}/bare/state.pt", t["size_mb"]))
                fs.rm(f"{root}/rep{rep}", recursive=True)  # moto keeps objects in memory
                suite.echo(f"  [storage] rep {rep + 1}/{suite.profile.repeat} {label}: done")
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return [_table(rows, suite.profile.repeat)]


def _table(rows: dict[tuple[str, int], dict[str, list[float]]], repeat: int) -> Table:
    table = Table("Figure 7 — checkpoint storage: time blocked in report() and upload "
                  "throughput (median (min–max))",
                  ["checkpoint", "storage", "torch.save s", "report() blocks s",
                   "ratio to torch.save", "upload + commit MiB/s", "bare fs.put MiB/s",
                   "ratio to fs.put"])
    for (label, size_mb), row in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        save, rep = Summary.of(row["save_s"]), Summary.of(row["report_s"])
        ours = Summary.of([size_mb / s for s in row["commit_s"]])
        bare = Summary.of([size_mb / s for s in row["put_s"]])
        table.add(f"{size_mb} MiB", label, save.fmt(3), rep.fmt(3), fmt_ratio(ratio(rep, save)),
                  ours.fmt(0), bare.fmt(0), fmt_ratio(ratio(ours, bare)))
    table.notes += [
        f"{repeat} repetition(s); one worker (TorchTrainer, num_workers=1), "
        "checkpoint_upload_mode=ASYNC; the state is one torch.save file of 8 float32 tensors.",
        "report() blocks = staging the files locally and queueing them; the upload and the "
        "commit marker follow in the background. Upload + commit = from report() returning "
        "until the commit marker is visible, as the worker polls it (10 ms).",
        "Bare fs.put = one fs.put of a file of the same size to the same filesystem from the "
        "benchmark process (s3fs defaults: 50 MiB parts, 10 at once; elastic-train sends "
        f"{PART_SIZE // MIB} MiB parts, {PARTS_AT_ONCE} at once, to bound "
        "memory).",
        "S3 is moto's server (in memory) on 127.0.0.1: it measures the client path, not a "
        "network.",
    ]
    return table
