"""A queue nobody serves is visible (status, queue list, /metrics), and a producer enqueues
declared job types without their handlers."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from jobsupport import job_app, job_rows

from cronlock import App, Database, DuplicateName, UnknownJobType
from cronlock.observe.prometheus import render_metrics, scrape


def _metric(text: str, name: str, queue: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f'{name}{{queue="{queue}"}} '):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_due_jobs_with_no_drainer_flag_the_queue(database: Database) -> None:
    async with job_app(database) as app:
        # Due for five minutes, and no drainer: unserved. Due for a second: not yet.
        long_ago = datetime.now(UTC) - timedelta(minutes=5)
        await app.enqueue("noop", {}, run_at=long_ago)
        await app.enqueue("noop", {}, queue="fresh")
        report = await app.status()
        queues = {q["queue"]: q for q in report["queue"]["queues"]}
        assert queues["default"]["unserved"] and not queues["fresh"]["unserved"]
        assert queues["default"]["active_drainers"] == 0
        metrics = render_metrics(await scrape(app.database)).decode()
        assert _metric(metrics, "cronlock_queue_unserved", "default") == 1
        assert _metric(metrics, "cronlock_queue_unserved", "fresh") == 0
        assert _metric(metrics, "cronlock_queue_paused", "default") is None
        listed = {q.name: q for q in await app.queues()}
        assert listed["default"].unserved and listed["default"].handled_here

        # A paused queue is not unserved (nobody should take its jobs): it says paused.
        await app.pause_queue("default")
        metrics = render_metrics(await scrape(app.database)).decode()
        assert _metric(metrics, "cronlock_queue_paused", "default") == 1
        assert _metric(metrics, "cronlock_queue_unserved", "default") == 0
        queues = {q["queue"]: q for q in (await app.status())["queue"]["queues"]}
        assert queues["default"]["paused"] and not queues["default"]["unserved"]


async def test_a_producer_enqueues_declared_types(
    database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    async with job_app(database) as worker:
        producer = App()
        declared = producer.declare_job("echo", queue="default", max_retries=1)
        assert declared.to_dict() == {
            "job_type": "echo",
            "queue": "default",
            "max_retries": 1,
            "concurrency_limit": None,
        }
        producer.use_database(str(database.url))
        try:
            with pytest.raises(UnknownJobType, match="no handler registered for job type"):
                await producer.enqueue("unheard_of", {})
            answer = await producer.enqueue("echo", {"x": 1})
            with caplog.at_level(logging.WARNING, logger="cronlock.queue"):
                for _ in range(3):
                    await producer.enqueue("elsewhere", {}, allow_unknown=True)
            warnings = [
                r for r in caplog.records if r.__dict__.get("action") == "enqueue_unknown_type"
            ]
            assert len(warnings) == 1  # once per type, not once per job
        finally:
            await producer.aclose()
        rows = {str(r["id"]): r for r in await job_rows(database)}
        assert rows[str(answer.id)]["max_retries"] == 1
        result = await worker.drain()
        # The worker runs what it has handlers for; the unknown type fails there, visibly.
        assert result.stats["processed"] == 1
        assert {r["job_type"]: r["status"] for r in await job_rows(database)}["echo"] == "completed"


def test_a_declaration_and_a_handler_must_agree() -> None:
    app = App()
    app.declare_job("send", queue="mail", max_retries=5)

    async def handler(session: Any, payload: Any) -> None:
        return None

    with pytest.raises(DuplicateName, match="declared with queue 'mail'"):
        app.job("send")(handler)
    app.job("send", queue="mail", max_retries=5)(handler)
    assert app.knows("send") and "send" in app.handlers
    with pytest.raises(DuplicateName):
        app.declare_job("send", queue="mail", max_retries=5)
    other = App()
    other.job("ping", queue="a")(handler)
    with pytest.raises(DuplicateName, match="its handler has queue 'a'"):
        other.declare_job("ping", queue="b")
    assert other.job_types["ping"].queue == "a"
