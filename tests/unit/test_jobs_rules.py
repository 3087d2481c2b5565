"""The retry rule, the backoff and the metrics' bounded histogram, without a database."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from cronlock import Backoff, InvalidJobOption, InvalidPayload, JobStatus
from cronlock.observe.stats import DrainStats, LatencyHistogram
from cronlock.queue.complete import outcome_of_failure
from cronlock.queue.jobs import Job, parse_json, to_json

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _job(retry_count: int, max_retries: int) -> Job:
    return Job(uuid.uuid4(), "t", {}, retry_count, max_retries, NOW, NOW)


@pytest.mark.parametrize("max_retries", [0, 1, 2, 5])
def test_max_retries_n_means_n_retries_and_n_plus_1_attempts(max_retries: int) -> None:
    retry_count, entries, attempts = 0, [], 0
    backoff = Backoff(jitter=0)
    while True:
        attempts += 1
        outcome = outcome_of_failure(_job(retry_count, max_retries), "boom", NOW, NOW, backoff)
        entries.append(outcome.error_entry)
        retry_count = outcome.retry_count
        if outcome.status is JobStatus.FAILED:
            break
        assert outcome.status is JobStatus.RETRYING
    assert attempts == max_retries + 1
    assert retry_count == max_retries
    assert len(entries) == attempts


def test_backoff_doubles_from_one_second_with_a_cap() -> None:
    backoff = Backoff(jitter=0, cap=10)
    assert [backoff.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert Backoff(jitter=0).delay(10_000) == 3600


def test_jitter_stays_within_its_band() -> None:
    rng = random.Random(7)
    delays = {Backoff(jitter=0.1).delay(3, rng) for _ in range(200)}
    assert min(delays) >= 3.6 and max(delays) <= 4.4 and len(delays) > 100


def test_failure_schedules_the_retry_from_now() -> None:
    outcome = outcome_of_failure(_job(1, 3), "boom", NOW, NOW, Backoff(jitter=0))
    assert outcome.worker_run_at == NOW + timedelta(seconds=2) and outcome.delay == 2
    assert outcome.status is JobStatus.RETRYING


def test_bad_backoff_and_json() -> None:
    with pytest.raises(InvalidJobOption):
        Backoff(factor=0.5)
    with pytest.raises(InvalidPayload):
        to_json(float("inf"), "x")
    assert parse_json('{"a": [1, 2]}', "x") == {"a": [1, 2]}


def test_histogram_percentiles_within_two_percent_in_bounded_memory() -> None:
    histogram = LatencyHistogram()
    values = [i / 1000 for i in range(1, 100_001)]  # 1 ms … 100 s
    random.Random(1).shuffle(values)
    for value in values:
        histogram.record(value)
    assert len(histogram.buckets) < 600  # not one entry per value
    for fraction in (0.5, 0.95, 0.99):
        exact = fraction * 100
        assert histogram.percentile(fraction) == pytest.approx(exact, rel=0.021)
    assert histogram.summary_ms()["avg"] == pytest.approx(50_000.5, rel=1e-6)


def test_histogram_record_many_is_record_for_each() -> None:
    values = [-0.5, 0.0, 1e-7, 1e-6, 2e-6, 0.001, 0.25, 3.0, 0.25]
    one_by_one, batched = LatencyHistogram(), LatencyHistogram()
    for value in values:
        one_by_one.record(value)
    batched.record_many(values[:4])
    batched.record_many([])
    batched.record_many(values[4:])
    assert batched == one_by_one


def test_stats_report_uses_the_references_keys() -> None:
    stats = DrainStats(processed=8, failed=1, retried=1)
    report = stats.report()
    for key in ("processed", "failed", "retried", "throughput_per_sec", "avg_latency_ms"):
        assert key in report
    assert report["p95_latency_ms"] == 0.0
    assert report["error_rate"] == 0.2
