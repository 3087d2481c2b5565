"""OpenTelemetry traces (issue 16, point 10; the 'otel' extra): a span for the enqueue, one for
each attempt (the enqueue's child, across the queue, through the job row), one for a periodic
run with its items as events; checked with the SDK's in-memory exporter. An app that is not
traced imports none of it and writes no trace context."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from itemsupport import items_app
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy import select

import cronlock
from cronlock import Database
from cronlock.sql.tables import jobs
from cronlock.tracing import ITEM_EVENTS_OK, instrument


@pytest.fixture
def exporter() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    yield provider, spans
    provider.shutdown()


def _app(database: Database) -> cronlock.App:
    app = cronlock.App()

    @app.job("hello", max_retries=1)
    async def hello(session: Any, payload: dict[str, Any]) -> None:
        if payload.get("fail"):
            raise ValueError("told to fail")

    app.use_database(str(database.url))
    return app


def _named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


@pytest.mark.parametrize("commit_mode", ["strict", "batch", "lease"])
async def test_a_trace_crosses_the_queue_from_the_request_to_each_attempt(
    database: Database, exporter: tuple[TracerProvider, InMemorySpanExporter], commit_mode: str
) -> None:
    provider, spans = exporter
    app = _app(database)
    instrument(app, tracer_provider=provider)
    request_tracer = provider.get_tracer("the web application")
    try:
        with request_tracer.start_as_current_span("POST /signup"):
            ok = await app.enqueue("hello", {"n": 1})
            async with database.session() as session:  # in the caller's transaction too
                [bad] = await app.enqueue_many_tx(session, "hello", [{"fail": True}])
                await session.commit()
        first = await app.drain(max_seconds=30, commit_mode=commit_mode)
        assert first.stats["processed"] == 1 and first.stats["retried"] == 1
        async with database.connect() as conn:  # the retry is due now, not after its backoff
            await conn.execute(jobs.update().values(run_at=jobs.c.created_at))
            await conn.commit()
        second = await app.drain(max_seconds=30, commit_mode=commit_mode)
        assert second.stats["failed"] == 1
    finally:
        await app.aclose()

    finished = spans.get_finished_spans()
    [request] = _named(finished, "POST /signup")
    enqueues = _named(finished, "enqueue hello")
    assert len(enqueues) == 2
    for span in enqueues:
        assert span.kind is SpanKind.PRODUCER
        assert span.parent is not None and span.parent.span_id == request.context.span_id
    attempts = _named(finished, "job hello")
    by_job: dict[str, list[ReadableSpan]] = {}
    for span in attempts:
        assert span.attributes is not None
        by_job.setdefault(str(span.attributes["cronlock.job_id"]), []).append(span)
    [done] = by_job[str(ok.id)]
    assert done.kind is SpanKind.CONSUMER
    assert done.context.trace_id == request.context.trace_id  # one trace, across the queue
    assert done.parent is not None and done.parent.span_id == enqueues[0].context.span_id
    assert done.attributes is not None
    assert (done.attributes["cronlock.attempt"], done.attributes["cronlock.outcome"]) == (
        1,
        "completed",
    )
    failed = sorted(by_job[str(bad.id)], key=lambda s: s.start_time or 0)
    assert [s.attributes["cronlock.attempt"] for s in failed if s.attributes] == [1, 2]
    assert [s.attributes["cronlock.outcome"] for s in failed if s.attributes] == [
        "retrying",
        "failed",
    ]
    for span in failed:
        assert span.context.trace_id == request.context.trace_id
        assert span.parent is not None and span.parent.span_id == enqueues[1].context.span_id
        assert span.status.status_code is StatusCode.ERROR
        assert "ValueError: told to fail" in (span.status.description or "")


@pytest.mark.parametrize("commit_mode", ["strict", "lease"])
async def test_a_handler_s_cancel_or_snooze_is_its_attempt_s_outcome_not_an_error(
    database: Database, exporter: tuple[TracerProvider, InMemorySpanExporter], commit_mode: str
) -> None:
    provider, spans = exporter
    app = cronlock.App()

    @app.job("directed")
    async def directed(session: Any, payload: dict[str, Any]) -> object:
        return cronlock.JobCancel("not wanted") if payload["cancel"] else cronlock.JobSnooze(60)

    app.use_database(str(database.url))
    instrument(app, tracer_provider=provider)
    try:
        await app.enqueue_many("directed", [{"cancel": True}, {"cancel": False}])
        result = await app.drain(max_seconds=30, commit_mode=commit_mode)
    finally:
        await app.aclose()
    assert result.stats["cancelled"] == 1
    outcomes = sorted(
        str(span.attributes["cronlock.outcome"])
        for span in _named(spans.get_finished_spans(), "job directed")
        if span.attributes
    )
    assert outcomes == ["cancelled", "snoozed"]
    for span in _named(spans.get_finished_spans(), "job directed"):
        assert span.status.status_code is not StatusCode.ERROR


async def test_a_periodic_run_is_a_span_with_its_items_as_events(
    database: Database, exporter: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, spans = exporter
    async with items_app(database) as app:
        instrument(app, tracer_provider=provider)
        result = await app.run("thousand", manual=True)
    [run] = _named(spans.get_finished_spans(), "run thousand")
    assert run.attributes is not None
    assert {k: run.attributes[k] for k in ("cronlock.task", "cronlock.trigger")} == {
        "cronlock.task": "thousand",
        "cronlock.trigger": "manual",
    }
    assert run.attributes["cronlock.outcome"] == "partial"
    assert run.attributes["cronlock.run_id"] == result.run_id
    assert (run.attributes["cronlock.items_ok"], run.attributes["cronlock.items_failed"]) == (
        990,
        10,
    )
    names = [event.name for event in run.events]
    # Every failed item, and the first good ones (a span keeps 128 events by default).
    assert names.count("item failed") == 10 and names.count("item") == ITEM_EVENTS_OK
    [seventh] = [e for e in run.events if e.attributes and e.attributes["cronlock.item"] == "7"]
    assert seventh.name == "item failed" and seventh.attributes is not None
    assert seventh.attributes["exception.message"] == "item 7 is bad"


def test_an_app_not_traced_writes_no_context_and_imports_no_opentelemetry(
    database_url: str,
) -> None:
    code = (
        "import asyncio, sys, cronlock\n"
        "app = cronlock.App()\n"
        "@app.job('hello')\n"
        "async def hello(session, payload):\n"
        "    return None\n"
        f"app.use_database({database_url!r})\n"
        "async def main():\n"
        "    await app.enqueue('hello', {})\n"
        "    await app.drain()\n"
        "    await app.aclose()\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry', 'cronlock.tr'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (0, "[]\n"), done.stderr

    async def contexts() -> list[Any]:
        database = Database(database_url)
        try:
            async with database.connect() as conn:
                return list((await conn.execute(select(jobs.c.trace_context))).scalars())
        finally:
            await database.dispose()

    assert asyncio.run(contexts()) == [None]
