"""``python -m bench``: elastic-train vs bare torchrun on one deterministic DDP workload.

    python -m bench                    full profile, 3 repetitions, writes BENCHMARKS.md
    python -m bench --repeat 5         more repetitions
    python -m bench --only steps       one figure (names: bench/figures.py's FIGURES, or
                                       --help); repeatable. Its section replaces the
                                       figure's in BENCHMARKS.md, the old one moves to
                                       docs/benchmarks-history.md (bench/splice.py)
    python -m bench --smoke            tiny and quick (CI); writes a file only with --output
    python -m bench --output FILE      write the markdown there instead

Run it from the repository root with the project's virtualenv python. It
runs one process tree at a time; every run is a subprocess with a timeout,
in its own temporary directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import pathlib
import shlex
import sys
import time

from bench.figures import FIGURES
from bench.profiles import FULL, SMOKE, Profile
from bench.report import FigureRun, document, machine_lines
from bench.splice import splice
from bench.suite import NOT_AVAILABLE, Printer, Suite, failures_table
from bench.variants import REPO

DEFAULT_OUTPUT = pathlib.Path(REPO, "BENCHMARKS.md")
HISTORY = pathlib.Path(REPO, "docs", "benchmarks-history.md")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, 1 repetition; no recovery, scaling or 100 MB runs")
    parser.add_argument("--repeat", type=int, default=None,
                        help="repetitions of every measurement (default: 3, smoke: 1)")
    parser.add_argument("--only", choices=FIGURES, action="append", default=None,
                        metavar="NAME", help="run this figure only (repeat the flag for "
                        f"several): {', '.join(FIGURES)}")
    parser.add_argument("--output", default=None,
                        help=f"markdown file to write (default: {DEFAULT_OUTPUT}, or with "
                             "--only the figures' sections in it; with --smoke nothing is "
                             "written unless given)")
    args = parser.parse_args(argv)
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat must be >= 1")
    return args


def method_lines(profile: Profile, figures: tuple[str, ...]) -> list[str]:
    cfg = profile.main
    return [
        f"Workload: MLP {cfg.input_dim} → {' → '.join([str(cfg.hidden)] * cfg.layers)} → "
        f"{cfg.classes}, batch {cfg.batch} per worker, SGD with momentum, synthetic data from a "
        "seeded torch.Generator (bench/workload.py, shared by every variant).",
        f"{profile.workers} workers (gloo on CPU), one torch thread per worker in every "
        "harness (OMP_NUM_THREADS=1 + torch.set_num_threads(1) for torchrun, "
        "resources_per_worker={'CPU': 1} for elastic-train).",
        f"{profile.repeat} repetition(s) per measurement, variants interleaved; cells are "
        "median (min–max); every ratio is to the floor (a) of this invocation.",
        "(a) `python -m torch.distributed.run --standalone --nproc-per-node N "
        "bench/torchrun_worker.py` without checkpoints; (b) the same with rank 0 "
        "torch.save-ing model + optimizer every epoch; (c) `python -m bench.et_driver`: "
        "TorchTrainer(...).fit() with report() + Checkpoint every epoch; "
        "(d) `elastic-train launch` when that command exists.",
        "Times are wall-clock (time.time()): the harness stamps the launch, the kill and the "
        "exit; workers append events to files (bench/events.py).",
        f"Figures run: {', '.join(figures)}.",
    ]


def run_figure(name: str, suite: Suite, echo: Printer) -> FigureRun:
    """Measures figure ``name``, printing its tables as they come."""
    figure = FIGURES[name]
    echo(f"figure {name} ...")
    started, load = datetime.datetime.now().astimezone(), os.getloadavg()[0]
    tables = figure.measure(suite)
    for table in tables:
        print("\n" + table.markdown(), flush=True)
    return FigureRun(name, figure.heading, figure.goal, started, (load, os.getloadavg()[0]),
                     tables)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    profile = SMOKE if args.smoke else FULL
    if args.repeat is not None:
        profile = dataclasses.replace(profile, repeat=args.repeat)
    figures = tuple(dict.fromkeys(args.only)) if args.only else (profile.figures
                                                                 or tuple(FIGURES))
    command = "python -m bench" + ("" if not argv else " " + shlex.join(argv))
    t0 = time.monotonic()

    def echo(line: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {line}", flush=True)

    for line in machine_lines("gpu" in figures):
        echo(line.lstrip("- "))
    suite = Suite(profile, echo)
    if not suite.launch_available:
        echo(f"(d) elastic-train launch: {NOT_AVAILABLE} "
             "(`elastic-train launch --help` fails); recorded as such.")
    runs = [run_figure(name, suite, echo) for name in figures]
    failed = failures_table(suite.failures)
    if failed is not None:
        print("\n" + failed.markdown(), flush=True)
    runtime = time.monotonic() - t0
    echo(f"done: profile {profile.name}, {runtime:.0f} s in total")
    text = document(command, profile.name, runtime, method_lines(profile, figures), runs,
                    failed, gpu="gpu" in figures)
    if args.output or not (args.smoke or args.only):
        pathlib.Path(args.output or DEFAULT_OUTPUT).write_text(text)
        echo(f"wrote {args.output or DEFAULT_OUTPUT}")
    elif not args.smoke:
        when = f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
        report, history = splice(DEFAULT_OUTPUT.read_text(), HISTORY.read_text(), text, when)
        DEFAULT_OUTPUT.write_text(report)
        HISTORY.write_text(history)
        echo(f"replaced the sections of {', '.join(figures)} in {DEFAULT_OUTPUT}; the old "
             f"ones are in {HISTORY}")
    return 1 if suite.fatal_failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
