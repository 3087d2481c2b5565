"""OpenTelemetry traces of an app (the 'otel' extra): ``cronlock.tracing.instrument(app)``.

Once instrumented, an app makes a span

- for each enqueue (``enqueue <job_type>``, kind PRODUCER, with the number of jobs), whose W3C
  trace context every job it writes carries in ``jobs.trace_context``;
- for each attempt of a job (``job <job_type>``, kind CONSUMER), the child of the span that
  enqueued it, so one trace goes from the request that enqueued the job, across the queue, to
  every attempt; a failed attempt's span has status ERROR and the error. A span's start and
  end are the worker's clock, as every span's are (worker-side: across hosts the wait from
  the enqueue's span to an attempt's has the hosts' clock skew in it); the job's own times on
  the database's clock, the one all hosts share, are its attributes
  ``cronlock.enqueued_at`` (``created_at``) and ``cronlock.claimed_at`` (the claim, the row's
  ``started_at``), ISO 8601;
- for each periodic run (``run <task>``), with its slot, trigger, outcome, items and run id,
  and its items as events: ``item failed`` (with the error) for every failed item, ``item``
  for the first ``ITEM_EVENTS_OK`` (50) that succeeded (a span keeps 128 events by default).

The spans come from ``tracer_provider`` (default: the global one, ``opentelemetry.trace``),
and the trace context is written and read with the global propagator (W3C trace context
unless you configured another). An app that is not instrumented never imports this module,
and its statements are the untraced ones: tracing costs nothing until it is on. Every commit
mode's attempts are traced: they run in the one attempt runner (``queue/attempt.py``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .errors import ConfigurationError
from .observe.tracehooks import ITEM_EVENTS

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ConfigurationError(
        "cronlock.tracing needs the 'otel' extra: pip install 'cronlock[otel]'"
    ) from exc

if TYPE_CHECKING:
    from .app import App
    from .outcome import RunResult

__all__ = ["ITEM_EVENTS_OK", "Tracing", "instrument", "uninstrument"]

_SCOPE = "cronlock"
# A span keeps 128 events by default (OTEL_SPAN_EVENT_COUNT_LIMIT): a run's first succeeded
# items are events, and every failed one, so that a thousand good items never push out the
# failures; the counts are the span's attributes.
ITEM_EVENTS_OK = 50


class Tracing:
    """The spans of one app (``instrument`` makes it; the app's traced paths call it)."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        from . import __version__

        self.tracer = trace.get_tracer(_SCOPE, __version__, tracer_provider=tracer_provider)

    @contextmanager
    def enqueue(self, job_type: str, count: int) -> Iterator[str]:
        with self.tracer.start_as_current_span(
            f"enqueue {job_type}",
            kind=SpanKind.PRODUCER,
            attributes={"cronlock.job_type": job_type, "cronlock.jobs": count},
        ):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            yield json.dumps(carrier, separators=(",", ":"))

    async def attempt(self, run: Callable[[], Awaitable[Any]], job: Any, queue: str) -> Any:
        from .queue.complete import Cancelled, Failure, Snoozed

        parent = None
        if job.trace_context:
            try:
                parent = propagate.extract(json.loads(job.trace_context))
            except (ValueError, TypeError, AttributeError):
                parent = None  # a context written by hand: the attempt starts its own trace
        attempt = job.retry_count + 1
        with self.tracer.start_as_current_span(
            f"job {job.job_type}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "cronlock.job_id": str(job.id),
                "cronlock.job_type": job.job_type,
                "cronlock.queue": queue,
                "cronlock.attempt": attempt,
                # The database's clock (a span's own times are the worker's).
                "cronlock.enqueued_at": job.created_at.isoformat(),
                "cronlock.claimed_at": job.claimed_at.isoformat(),
            },
            record_exception=True,
            set_status_on_exception=True,
        ) as span:
            outcome = await run()
            if isinstance(outcome, Failure):
                span.set_attribute("cronlock.outcome", outcome.status.value)
                span.set_status(Status(StatusCode.ERROR, outcome.error))
            elif isinstance(outcome, Cancelled):
                span.set_attribute("cronlock.outcome", "cancelled")  # not an error: directed
            elif isinstance(outcome, Snoozed):
                span.set_attribute("cronlock.outcome", "snoozed")
            else:
                span.set_attribute("cronlock.outcome", "completed")
            return outcome

    async def periodic_run(
        self,
        task: str,
        slot: datetime | None,
        trigger: str,
        run: Callable[[], Awaitable[RunResult]],
    ) -> RunResult:
        attributes: dict[str, Any] = {"cronlock.task": task, "cronlock.trigger": trigger}
        if slot is not None:
            attributes["cronlock.slot"] = slot.isoformat()
        with self.tracer.start_as_current_span(f"run {task}", attributes=attributes) as span:
            succeeded = 0

            def item(key: object, error: BaseException | None) -> None:
                nonlocal succeeded
                if error is None:
                    succeeded += 1
                    if succeeded <= ITEM_EVENTS_OK:
                        span.add_event("item", {"cronlock.item": str(key)})
                else:
                    span.add_event(
                        "item failed",
                        {
                            "cronlock.item": str(key),
                            "exception.type": type(error).__name__,
                            "exception.message": str(error),
                        },
                    )

            token = ITEM_EVENTS.set(item)
            try:
                result = await run()
            finally:
                ITEM_EVENTS.reset(token)
            span.set_attributes(
                {
                    "cronlock.outcome": result.status.value,
                    "cronlock.items_ok": result.items_ok,
                    "cronlock.items_failed": result.items_failed,
                }
            )
            if result.run_id is not None:
                span.set_attribute("cronlock.run_id", result.run_id)
            if result.skip_reason is not None:
                span.set_attribute("cronlock.skip_reason", str(result.skip_reason))
            if result.error is not None and result.status.value == "failed":
                span.set_status(Status(StatusCode.ERROR, result.error))
            return result


def instrument(app: App, *, tracer_provider: trace.TracerProvider | None = None) -> Tracing:
    """Trace ``app``'s enqueues, job attempts and periodic runs from now on (drainers made by
    ``app.drainer()`` after this call)."""
    tracing = Tracing(tracer_provider)
    app.tracing = tracing
    return tracing


def uninstrument(app: App) -> None:
    """Stop tracing ``app`` (drainers made after this call)."""
    app.tracing = None
