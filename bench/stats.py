"""Summaries of repeated measurements, ratios to the floor, and target verdicts."""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    """Median and range of the repetitions of one measurement (None values dropped)."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Summary:
        return cls(tuple(float(v) for v in values if v is not None))

    @property
    def ok(self) -> bool:
        return bool(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def best(self) -> float:
        """The largest value (the best run, for a throughput)."""
        return max(self.values) if self.values else float("nan")

    def fmt(self, digits: int = 2) -> str:
        """``median (min–max)``, or ``n/a`` when nothing was measured."""
        if not self.values:
            return "n/a"
        if len(self.values) == 1:
            return f"{self.median:.{digits}f}"
        return (f"{self.median:.{digits}f} ({min(self.values):.{digits}f}–"
                f"{max(self.values):.{digits}f})")


@dataclass(frozen=True)
class Difference:
    """Mean of paired differences ``b_i - a_i`` and its 95 % bootstrap interval."""

    mean: float
    low: float
    high: float
    pairs: int

    @classmethod
    def paired(cls, a: Sequence[float], b: Sequence[float], resamples: int = 4000,
               seed: int = 0) -> Difference | None:
        """Pairs ``a[i]`` with ``b[i]`` (runs made back to back, so that drift of the
        machine hits both alike); None with fewer than two pairs. The interval is the
        2.5th-97.5th percentile of the mean over resamples (seeded: reproducible)."""
        diffs = [y - x for x, y in zip(a, b, strict=False)]
        if len(diffs) < 2:
            return None
        rng = random.Random(seed)
        means = sorted(statistics.fmean(rng.choices(diffs, k=len(diffs)))
                       for _ in range(resamples))
        return cls(statistics.fmean(diffs), means[int(0.025 * resamples)],
                   means[int(0.975 * resamples) - 1], len(diffs))

    def fmt(self, digits: int = 0) -> str:
        return f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


def ratio(value: Summary, floor: Summary) -> float | None:
    """Ratio of the medians, or None when either side was not measured."""
    if not value.ok or not floor.ok or floor.median == 0:
        return None
    return value.median / floor.median


def fmt_ratio(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.3f}"


@dataclass(frozen=True)
class Target:
    """A bound on a ratio: ``value >= bound`` (``at_least``) or ``value <= bound``."""

    bound: float
    at_least: bool

    def verdict(self, value: float | None) -> str:
        if value is None:
            return "n/a"
        passed = value >= self.bound if self.at_least else value <= self.bound
        return "PASS" if passed else "MISS"

    def describe(self) -> str:
        return f"{'≥' if self.at_least else '≤'} {self.bound:g}"


def with_target(value: float | None, target: Target) -> str:
    """``1.012 ≤ 1.1 PASS`` -- the value, the target and the verdict in one cell."""
    return f"{fmt_ratio(value)} {target.describe()} {target.verdict(value)}"
