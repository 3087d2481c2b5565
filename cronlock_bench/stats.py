"""Summaries: a median with its range over repeats, and nearest-rank percentiles."""

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
    """The median of ``values`` and their range (one value: all three are that value)."""
    if not values:
        raise ValueError("no values to summarise")
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": len(values),
    }


def percentile(values: Sequence[float], pct: float) -> float:
    """The nearest-rank ``pct`` percentile: a value one of the samples really had."""
    if not values:
        raise ValueError("no values")
    if not 0 < pct <= 100:
        raise ValueError(f"percentile out of range: {pct}")
    ordered = sorted(values)
    return ordered[max(math.ceil(pct / 100 * len(ordered)), 1) - 1]
