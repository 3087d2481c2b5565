"""Summaries of repeated measurements: the same module as ``cronlock bench`` uses.

Every figure the report shows is a median over several runs with its min..max, so a single
lucky or unlucky run is visible instead of hidden. Percentiles use the nearest-rank method
(no interpolation): a p99 of 500 samples is a latency that one of them really had.
"""

from __future__ import annotations

from cronlock_bench.stats import Spread, percentile, spread

__all__ = ["Spread", "percentile", "spread"]
