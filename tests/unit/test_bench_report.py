"""``cronlock bench`` without a database: its options, its summaries and its table."""

from __future__ import annotations

from typing import Any

import pytest

from cronlock import CommitMode, ConfigurationError
from cronlock_bench import BenchOptions, bench_options, render
from cronlock_bench.options import QUICK, parse_modes, parse_sections, parse_sizes
from cronlock_bench.report import summarise
from cronlock_bench.runner import plan

ABOUT: dict[str, Any] = {
    "cronlock": "0.1.0",
    "postgresql": "16.4",
    "fsync": "on",
    "synchronous_commit": "on",
    "python": "3.11.7",
    "platform": "Linux x86_64",
    "cores": 2,
    "database": "postgresql://u@h/db",
    "schema": "cronlock_bench_0123456789ab",
}


def test_lists_parse_sorted_unique_and_reject_one_bad_value_by_name() -> None:
    assert parse_sizes("10_000, 100,100") == (100, 10_000)
    assert parse_modes("batch,strict,batch") == (CommitMode.BATCH, CommitMode.STRICT)
    assert parse_sections("recovery,drain") == ("drain", "recovery")
    with pytest.raises(ConfigurationError, match=r"--sizes: '-1' is not a job count"):
        parse_sizes("100,-1")
    with pytest.raises(ConfigurationError, match=r"--only: '' is not a section"):
        parse_sections("drain,")


def test_quick_is_small_and_explicit_options_win() -> None:
    options = bench_options(quick=True, items=50)
    assert options.sizes == QUICK.sizes == (100, 1_000)
    assert (options.items, options.recovery_kills) == (50, 1)
    assert bench_options(quick=False).sizes == (100, 1_000, 10_000, 100_000)


def test_repeats_are_interleaved_and_zero_kills_skip_recovery() -> None:
    options = BenchOptions(sizes=(100,), repeats=2, recovery_kills=0)
    sections = [step.section for step in plan(options)]
    once = ["enqueue", "drain", "drain", "latency", "periodic"]
    assert sections == once + once


def test_table_shows_medians_with_ranges_and_only_the_sections_run() -> None:
    options = BenchOptions(sizes=(100,), modes=(CommitMode.BATCH,), repeats=3)
    drains = [
        {"mode": "batch", "n": 100, "seconds": s, "jobs_per_s": 100 / s, "p95_ms": 2.0, "wall_s": s}
        for s in (0.02, 0.01, 0.04)
    ]
    recovery = [{"seconds": [0.1]}, {"seconds": [0.3]}, {"seconds": [0.2]}]
    report = summarise(ABOUT, options, {"drain": drains, "recovery": recovery})
    assert report["drain"][0]["jobs_per_s"] == {
        "median": 5000.0,
        "min": 2500.0,
        "max": 10000.0,
        "runs": 3,
    }
    assert report["enqueue"] is None and report["latency"] is None
    assert report["recovery"]["kills"] == 3 and report["recovery"]["p95_s"] == 0.3
    lines = render(report)
    assert "figures: median (min..max) of 3 runs" in lines
    [row] = [line for line in lines if line.startswith("batch")]
    assert row.split()[:5] == ["batch", "100", "0.020", "s", "(0.010..0.040)"]
    assert "5,000 (2,500..10,000)" in row
    assert not any(line.startswith(("enqueue", "latency", "periodic")) for line in lines)
    [kills] = [line for line in lines if line.startswith("recovery")]
    assert "(3 kills)" in kills and "median 200 ms" in kills
