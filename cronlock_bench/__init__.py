"""``cronlock bench``: cronlock measured on the user's own database, in a scratch schema.

The modules, one job each: ``options`` (what to measure), ``scratch`` (the schema, created and
dropped), ``app`` (the no-op job the workers load), ``enqueue``, ``drain``, ``latency``,
``periodic`` and ``recovery`` (the workloads), ``flow`` and ``workers`` (jobs and worker
processes they share), ``tidy`` (between workloads), ``runner`` (the order and the cleanup),
``report`` (JSON and table) and ``progress`` (bar or lines on stderr). The definitions follow
the repository's benchmarks/ harness, which compares cronlock with its peers.
"""

from __future__ import annotations

from .options import SECTIONS, BenchOptions, bench_options
from .report import render
from .runner import BenchFailed, run_bench

__all__ = ["SECTIONS", "BenchFailed", "BenchOptions", "bench_options", "render", "run_bench"]
