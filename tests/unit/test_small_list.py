"""The small list of issue 23 (item 6): what a new user met in the first trial, one test each.

The dashboard's two (a failed job's page, a form post with neither Origin nor Referer) are in
tests/integration/test_dashboard.py.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cronlock import UnknownJobType
from cronlock.cli import render
from cronlock.observe.slots import Cell
from cronlock.outcome import DrainResult, JobStatus, RunResult, RunStatus
from cronlock.queue.jobs import handler_for
from cronlock.queue.operate import JobInfo

# The README's sections moved to the docs site (issue 28): enqueueing to how-to/jobs.md,
# retries to how-to/workers.md.
DOCS = Path(__file__).resolve().parents[2] / "docs"
NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def _section(page: str, title: str) -> str:
    text = (DOCS / page).read_text()
    start = text.index(f"\n## {title}\n")
    return text[start : text.index("\n#", start + 1)]


def test_the_unknown_type_error_names_the_way_to_enqueue_it_anyway() -> None:
    with pytest.raises(UnknownJobType, match=r"--allow-unknown, or allow_unknown=True"):
        handler_for({}, "send_emial")


def test_a_run_that_started_early_is_early_not_negatively_late() -> None:
    lateness = {"last": -4459.0, "mean": -1000.0, "max": 20.0, "runs": 3}
    line = render.health_line({"recent_lateness_ms": lateness}, NOW)
    assert "early 4459 ms last, early 1000 ms mean, 20 ms max over 3 runs" in line
    assert "-" not in line.split("late", 1)[1]


def test_a_completed_job_shows_no_error_but_keeps_its_history() -> None:
    job = JobInfo(
        id=uuid.uuid4(),
        job_type="send_email",
        queue="default",
        status=JobStatus.COMPLETED,
        priority=0,
        payload={},
        result={"ok": True},
        retry_count=1,
        max_retries=3,
        error_message="ConnectionError: refused",
        error_history=[{"attempt": 1, "at": NOW.isoformat(), "error": "ConnectionError: refused"}],
        dedup_key=None,
        created_at=NOW,
        run_at=NOW,
        next_retry_at=None,
        started_at=NOW,
        completed_at=NOW,
    )
    lines = render.job_lines(job)
    assert not any(line.strip().startswith("error ") for line in lines), lines
    assert any("attempt 1 at" in line and "refused" in line for line in lines)
    failed = render.job_lines(JobInfo(**{**job.__dict__, "status": JobStatus.FAILED}))
    assert any(line.strip().startswith("error ") for line in failed)


def test_one_item_is_singular() -> None:
    result = RunResult(
        task="reindex",
        status=RunStatus.PARTIAL,
        slot=NOW,
        started_at=NOW,
        finished_at=NOW + timedelta(seconds=1),
        duration_ms=1000,
        items_ok=1,
        items_failed=1,
    )
    assert "partial — 1 item ok, 1 failed" in render.describe(result)[0]
    cell = Cell(slot=NOW, outcome="partial", run_id=1, recorded=True, items_ok=1, items_failed=2)
    assert cell.text.endswith(", 1 item ok, 2 failed")


def test_a_drain_where_every_job_failed_prints_no_latency() -> None:
    stats = {
        "processed": 0,
        "retried": 0,
        "failed": 3,
        "elapsed_seconds": 0.2,
        "throughput_per_sec": 15.0,
        "p95_latency_ms": 0.0,
    }
    [line] = render.describe_drain(DrainResult("default", RunStatus.PARTIAL, stats))
    assert "0 completed, 0 retrying, 3 failed" in line and "p95" not in line
    done = render.describe_drain(
        DrainResult("default", RunStatus.COMPLETED, {**stats, "processed": 1})
    )
    assert "p95 0.0 ms" in done[0]


def test_status_says_which_tasks_are_not_this_apps() -> None:
    queue = {
        "queues": [],
        "rates": {
            f"{o}_per_min_{w}": 0 for o in ("completed", "failed") for w in ("1m", "5m", "15m")
        },
        "workers": [],
        "recent_failures": [],
    }
    entry = {"task": "other-apps-task", "registered": False, "last_runs": [], "overdue": None}
    text = "\n".join(render.describe_status({"tasks": [entry], "queue": queue}, NOW))
    assert "not a task of this app" in text and "another app sharing it" in text
    mine = "\n".join(
        render.describe_status({"tasks": [{**entry, "registered": True}], "queue": queue}, NOW)
    )
    assert "not a task of this app" not in mine


def test_the_docs_say_where_a_session_comes_from_and_what_backoff_takes() -> None:
    assert "app.database.session()" in _section("how-to/jobs.md", "Enqueueing")
    retries = _section("how-to/workers.md", "Retries")
    for parameter in ("base", "factor", "cap", "jitter"):
        assert re.search(rf"`{parameter}` ", retries) or f"{parameter}=" in retries, parameter
    assert "Backoff(base=1.0, factor=2.0" in retries
