"""cronlock's fire times against Debian cron's semantics, on random expressions (issue 12).

The default run checks a seeded sample in a few seconds. The full run, a CI step of its own:

    CRONLOCK_DIFFERENTIAL_EXPRESSIONS=100000 pytest -s -m differential \
        tests/unit/test_cron_differential.py

checks that many expressions, each in five zones (Europe/Madrid, America/New_York,
Australia/Lord_Howe, Asia/Kolkata, UTC), against cronsim, with Debian's loop deciding where
cronsim is wrong; and Debian's loop itself across every 2026 transition of those zones.
"""

from __future__ import annotations

import os

import crondiff
import pytest

FULL = int(os.environ.get("CRONLOCK_DIFFERENTIAL_EXPRESSIONS", "100000"))


def _check(report: crondiff.Report) -> None:
    print(dict(report.counts))  # the figures, for the CI log (pytest -s)
    assert not report.disagreements, "\n".join(report.disagreements[:20])


def test_random_expressions_agree_with_cronsim_and_debians_loop() -> None:
    report = crondiff.run(expressions=400, seed=12)
    assert report.counts["compared"] >= 1900
    _check(report)


def test_debians_loop_across_transitions_maps_every_start_to_a_fire_time() -> None:
    _check(crondiff.run_loop(expressions=6, seed=12))


def test_a_busy_host_catching_up_never_gets_no_slot() -> None:
    _check(crondiff.run_loop(expressions=4, seed=13, busy=True))


@pytest.mark.differential
@pytest.mark.timeout(3600)
def test_full_differential_run() -> None:
    # One process per core. The loop's windows (24 hours of Debian's loop each, a hundred times
    # an expression's cost against cronsim) are a fixed share of the expressions: at 100,000,
    # 250 expressions' windows in five zones across the 2026 transitions and 62 on a busy host.
    # Twice that share was three quarters of the step's time (CI's 30 minutes are the bound).
    report = crondiff.run_parallel("run", FULL, seed=2026)
    report.add(crondiff.run_parallel("loop", max(FULL // 400, 10), seed=2026))
    report.add(crondiff.run_parallel("loop", max(FULL // 1600, 10), seed=2027, busy=True))
    assert report.counts["expressions"] == FULL
    _check(report)
