"""Summaries of repeated measurements: medians with their spread, and latency percentiles.

Every figure the report shows is a median over several runs with its min..max, so a single
lucky or unlucky run is visible instead of hidden. Percentiles use the nearest-rank method
(no interpolation): a p99 of 500 samples is a latency that one of them really had.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TypedDict

__all__ = ["Spread", "percentile", "spread"]


class Spread(TypedDict):
    median: float
    min: float
    max: float
    runs: int


def spread(values: Sequence[float]) -> Spread:
    """The median of ``values`` and their range."""
    if not values:
        raise ValueError("no values to summarise")
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": len(values),
    }


def percentile(values: Sequence[float], pct: float) -> float:
    """The nearest-rank ``pct`` percentile (0 < pct <= 100) of ``values``."""
    if not values:
        raise ValueError("no values")
    if not 0 < pct <= 100:
        raise ValueError(f"percentile out of range: {pct}")
    ordered = sorted(values)
    rank = max(math.ceil(pct / 100 * len(ordered)), 1)
    return ordered[rank - 1]
