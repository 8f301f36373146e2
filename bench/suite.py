"""The runner of the figures: :class:`Suite` runs the variants (repetitions interleaved --
a, b, c, a, b, c, ... -- so that drift of the machine hits every variant alike) and
caches the samples, since figures 1, 2 and 5 read the same runs. Every ratio is to the
floor (a) measured in the same invocation. Helpers every figure's table uses live here
too; the figures themselves are in the modules :mod:`bench.figures` lists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bench.measure import FaultPlan, Sample, measure
from bench.profiles import Profile
from bench.report import Table
from bench.stats import Summary
from bench.variants import ET_LAUNCH, MAIN, RAY, Variant, launch_help, ray_available
from bench.workload import WorkloadConfig

NOT_AVAILABLE = "not available here (not installed)"

Printer = Callable[[str], None]


class Suite:
    """Runs and caches the measurements of one invocation."""

    def __init__(self, profile: Profile, echo: Printer):
        self.profile = profile
        self.echo = echo
        self.launch_available = launch_help() is not None
        self.failures: list[Sample] = []
        self.fatal_failures = 0
        self._main: dict[str, list[Sample]] | None = None

    def variants(self, *wanted: Variant) -> list[Variant]:
        """``wanted``, without (d) when ``elastic-train launch`` does not exist and
        without (e) when Ray is not installed."""
        return [v for v in wanted if (v is not ET_LAUNCH or self.launch_available)
                and (v is not RAY or ray_available())]

    def run_set(self, name: str, variants: Sequence[Variant], base: WorkloadConfig,
                workers: int, max_restarts: int = 0, fault: FaultPlan | None = None,
                failures_are_results: bool = False,
                repeat: int | None = None) -> dict[str, list[Sample]]:
        """``repeat`` runs (default: the profile's) of each variant, interleaved, failed ones
        included (``ok=False``).

        Failed runs are also listed in :attr:`failures`; they make the suite fail unless
        ``failures_are_results`` (figure 4: a run that does not recover is a finding).
        """
        out: dict[str, list[Sample]] = {v.key: [] for v in variants}
        repeat = repeat or self.profile.repeat
        total = len(variants) * repeat
        done = 0
        for rep in range(repeat):
            for variant in variants:
                done += 1
                sample = measure(variant, base, workers, self.profile.timeout_s,
                                 max_restarts, fault)
                status = "ok" if sample.ok else f"FAILED, {sample.error.split(': ...')[0]}"
                self.echo(f"  [{name}] {done}/{total} {variant.label}, {workers} workers, "
                          f"rep {rep + 1}: {status}")
                out[variant.key].append(sample)
                if not sample.ok:
                    self.failures.append(sample)
                    self.fatal_failures += not failures_are_results
        return out

    def main_runs(self) -> dict[str, list[Sample]]:
        """The runs behind figures 1, 2 and 5."""
        if self._main is None:
            self._main = self.run_set(
                "main", self.variants(*MAIN),
                self.profile.main, self.profile.workers)
        return self._main


def summary_of(samples: list[Sample], get: Callable[[Sample], float | None]) -> Summary:
    """Summary over the successful runs."""
    return Summary.of([get(s) for s in samples if s.ok])


def missing_row(table: Table, variant: Variant, runs: dict[str, list[Sample]]) -> bool:
    """Adds a placeholder row when ``variant`` was not run or no run of it succeeded."""
    if variant.key not in runs:
        why = NOT_AVAILABLE
    elif not any(s.ok for s in runs[variant.key]):
        why = "every run failed (see the failed-runs table)"
    else:
        return False
    table.add(variant.label, why, *["—"] * (len(table.headers) - 2))
    return True


def others_cpu(samples: list[Sample]) -> str:
    """Median CPU (in cores) that other processes used during these runs."""
    return Summary.of([s.foreign_cores for s in samples]).fmt(2)


def failures_table(failures: list[Sample]) -> Table | None:
    """Runs that failed or timed out (left out of every figure), if any."""
    if not failures:
        return None
    table = Table("Failed runs (left out of the figures)", ["variant", "workers", "error"])
    for s in failures:
        head, _, tail = s.error.partition(": ...")
        tail = (head + ": ..." + " ".join(tail.split())[-300:]).replace("|", "\\|")
        table.add(s.variant, s.workers, tail)
    return table
