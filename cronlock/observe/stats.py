"""The drainer's metrics: counts, throughput, latency percentiles, in bounded memory.

Latencies go into a log-bucketed histogram (buckets 2 % wide), so a worker that runs for months
keeps a few hundred integers, not one float per job (the reference's ever-growing list), and a
percentile is exact to within 2 %. ``DrainStats.report`` uses the reference's keys
(``processed``, ``failed``, ``retried``, ``throughput_per_sec``, ``avg_latency_ms``,
``p95_latency_ms``) and adds the rest: p50/p99, end-to-end latency, error rate.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DrainStats", "LatencyHistogram"]

_GROWTH = 1.02
_LOG_GROWTH = math.log(_GROWTH)
_FLOOR_SECONDS = 1e-6
_LOG_FLOOR = math.log(_FLOOR_SECONDS)
_PER_LOG_GROWTH = 1 / _LOG_GROWTH


@dataclass
class LatencyHistogram:
    """Durations in seconds: count, sum, max and log buckets; memory bounded by the range."""

    count: int = 0
    total: float = 0.0
    maximum: float = 0.0
    buckets: dict[int, int] = field(default_factory=dict)

    def record(self, seconds: float) -> None:
        # Once or twice per job on the drainer's hot path: one log, no function calls.
        if seconds < 0.0:
            seconds = 0.0
        if seconds > self.maximum:
            self.maximum = seconds
        index = (
            int((math.log(seconds) - _LOG_FLOOR) * _PER_LOG_GROWTH)
            if seconds > _FLOOR_SECONDS
            else 0
        )
        self.count += 1
        self.total += seconds
        buckets = self.buckets
        buckets[index] = buckets.get(index, 0) + 1

    def record_many(self, durations: list[float]) -> None:
        """``record`` each of ``durations`` (a batch's): the same buckets, one call."""
        if not durations:
            return
        buckets, log, floor = self.buckets, math.log, _FLOOR_SECONDS
        total = 0.0
        for seconds in durations:
            if seconds > floor:
                index = int((log(seconds) - _LOG_FLOOR) * _PER_LOG_GROWTH)
                total += seconds
            else:
                index = 0
                if seconds > 0.0:
                    total += seconds
            buckets[index] = buckets.get(index, 0) + 1
        self.count += len(durations)
        self.total += total
        self.maximum = max(self.maximum, *durations)

    def percentile(self, fraction: float) -> float:
        """The smallest recorded duration with at least ``fraction`` of the others below it."""
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(fraction * self.count))
        seen = 0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if seen >= rank:
                # The bucket's upper edge, never more than the largest value recorded.
                return min(_FLOOR_SECONDS * _GROWTH ** (index + 1), self.maximum)
        return self.maximum

    def summary_ms(self) -> dict[str, float]:
        def ms(seconds: float) -> float:
            return round(seconds * 1000, 3)

        return {
            "avg": ms(self.total / self.count) if self.count else 0.0,
            "p50": ms(self.percentile(0.50)),
            "p95": ms(self.percentile(0.95)),
            "p99": ms(self.percentile(0.99)),
            "max": ms(self.maximum),
        }


@dataclass
class DrainStats:
    """What a drainer did since it started."""

    processed: int = 0  # attempts that completed their job
    failed: int = 0  # attempts after which the job failed for good
    retried: int = 0  # attempts that failed and scheduled a retry
    cancelled: int = 0  # attempts that ended their job cancelled (JobCancel, an operator)
    snoozed: int = 0  # attempts whose handler snoozed its job (JobSnooze: not counted)
    handed_back: int = 0  # claimed, not started, returned to the queue at shutdown
    rolled_back: int = 0  # in flight when aborted: rolled back, due again
    # The lease commit mode: completions not applied because the job was handed on since,
    # and running jobs of lost workers this drainer returned to the queue.
    fenced: int = 0
    lost_returned: int = 0
    started: float = field(default_factory=time.monotonic)
    stopped: float | None = None
    run_time: LatencyHistogram = field(default_factory=LatencyHistogram)
    end_to_end: LatencyHistogram = field(default_factory=LatencyHistogram)

    @property
    def attempts(self) -> int:
        return self.processed + self.failed + self.retried + self.cancelled + self.snoozed

    def elapsed(self) -> float:
        return (self.stopped or time.monotonic()) - self.started

    def stop(self) -> None:
        if self.stopped is None:
            self.stopped = time.monotonic()

    def report(self) -> dict[str, Any]:
        elapsed = self.elapsed()
        run_time = self.run_time.summary_ms()
        return {
            "elapsed_seconds": round(elapsed, 3),
            "processed": self.processed,
            "failed": self.failed,
            "retried": self.retried,
            "cancelled": self.cancelled,
            "snoozed": self.snoozed,
            "handed_back": self.handed_back,
            "rolled_back": self.rolled_back,
            "fenced": self.fenced,
            "lost_returned": self.lost_returned,
            # The reference's definition: jobs finished (for good) per second.
            "throughput_per_sec": round(
                (self.processed + self.failed + self.cancelled) / elapsed, 2
            )
            if elapsed > 0
            else 0.0,
            "error_rate": round((self.failed + self.retried) / self.attempts, 4)
            if self.attempts
            else 0.0,
            # started -> completed (committed), as the reference measured it: a duration on
            # this worker's monotonic clock (worker-side, no clock skew in it)
            "avg_latency_ms": run_time["avg"],
            "p50_latency_ms": run_time["p50"],
            "p95_latency_ms": run_time["p95"],
            "p99_latency_ms": run_time["p99"],
            # created -> completed: what the job's enqueuer waited (created -> claimed on the
            # database's clock, then claimed -> committed on this worker's monotonic clock)
            "end_to_end_latency_ms": self.end_to_end.summary_ms(),
        }
