"""/metrics parses with Prometheus' own text parser and its numbers match the tables."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
from itemsupport import items_app
from jobsupport import job_app
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from cronlock import Database
from cronlock.http import create_api
from cronlock.sql.tables import runs


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_metrics_match_the_tables(database: Database) -> None:
    waiting_since = datetime.now(UTC) - timedelta(minutes=5)
    async with job_app(database) as app:
        async with database.session() as session:
            await app.enqueue_many_tx(session, "echo", [{"n": 1}, {"n": 2}, {"n": 3}])
            await app.enqueue_tx(session, "always_fail", {})
            # Due for five minutes already: the oldest due job's age is known within the test.
            await app.enqueue_tx(session, "echo", {}, queue="backlog", run_at=waiting_since)
            await app.enqueue_tx(session, "echo", {}, queue="later", delay=3600)
            await session.commit()
        moment = datetime.now(UTC)
        for _ in range(3):  # always_fail: 3 attempts, 2 retries, then failed

            def clock(fixed: datetime = moment) -> datetime:
                return fixed

            await app.drainer(clock=clock).drain()
            moment += timedelta(hours=1)

    async with items_app(database) as tasks:
        # A slot's run, 2.5 s late (thousand fires every 5 minutes).
        slot = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
        slot -= timedelta(minutes=slot.minute % 5)
        await tasks.run("thousand", now=slot + timedelta(seconds=2.5))
        await tasks.run("explode", manual=True)
        await tasks.run("explode", manual=True)
        transport = httpx.ASGITransport(app=create_api(tasks))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
            answer = await http.get("/metrics")
        scraped_by = datetime.now(UTC)

    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    m = _samples(answer.text)

    def job(status: str, queue: str = "default") -> float:
        return m[("cronlock_jobs", (("queue", queue), ("status", status)))]

    assert (job("completed"), job("failed"), job("pending")) == (3, 1, 0)
    assert (job("pending", "backlog"), job("pending", "later")) == (1, 1)
    assert m[("cronlock_jobs_processed_total", (("queue", "default"),))] == 3
    assert m[("cronlock_jobs_failed_total", (("queue", "default"),))] == 1
    assert m[("cronlock_jobs_retried_total", (("queue", "default"),))] == 2
    assert m[("cronlock_job_latency_seconds_count", (("queue", "default"),))] == 3
    assert m[("cronlock_job_latency_seconds_bucket", (("le", "+Inf"), ("queue", "default")))] == 3
    assert m[("cronlock_jobs_due", (("queue", "backlog"),))] == 1
    assert ("cronlock_jobs_due", (("queue", "later"),)) not in m  # not due for an hour
    age = m[("cronlock_oldest_due_job_age_seconds", (("queue", "backlog"),))]
    assert 300 <= age <= (scraped_by - waiting_since).total_seconds()

    def run(status: str, task: str) -> float:
        return m[("cronlock_task_runs_total", (("status", status), ("task", task)))]

    assert (run("partial", "thousand"), run("failed", "explode")) == (1, 2)
    assert run("completed", "thousand") == 0
    assert m[("cronlock_task_consecutive_failures", (("task", "explode"),))] == 2
    assert m[("cronlock_task_consecutive_failures", (("task", "thousand"),))] == 0
    assert ("cronlock_task_last_success_timestamp_seconds", (("task", "explode"),)) not in m
    async with database.connect() as conn:
        started = (
            await conn.execute(select(runs.c.started_at).where(runs.c.task == "thousand"))
        ).scalar_one()
    assert m[("cronlock_task_last_success_timestamp_seconds", (("task", "thousand"),))] == (
        started.timestamp()
    )
    assert m[("cronlock_task_duration_seconds_count", (("task", "explode"),))] == 2
    # A slot's run has a lateness; manual runs belong to no slot and have none.
    assert m[("cronlock_task_lateness_seconds_count", (("task", "thousand"),))] == 1
    assert m[("cronlock_task_lateness_seconds_sum", (("task", "thousand"),))] == 2.5
    assert m[("cronlock_task_lateness_seconds_count", (("task", "explode"),))] == 0


async def test_worker_metrics_endpoint(database: Database) -> None:
    from cronlock.observe.prometheus import serve_metrics

    server = await serve_metrics(database, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            metrics = await http.get("/metrics")
            other = await http.get("/")
    finally:
        server.close()
        await server.wait_closed()
    assert metrics.status_code == 200
    names = {family.name for family in text_string_to_metric_families(metrics.text)}
    assert {"cronlock_jobs", "cronlock_task_runs", "cronlock_drainers"} <= names
    assert other.status_code == 404


async def test_cronlock_worker_metrics_port(database: Database, database_url: str) -> None:
    import os
    import signal

    from cli import free_port, start_cli
    from waiting import wait_for

    port = free_port()
    worker = start_cli(
        "--app",
        "testapps.jobs",
        "worker",
        "--metrics-port",
        str(port),
        database_url=database_url,
    )

    def scraped() -> str | None:
        try:
            answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
        except httpx.TransportError:
            if worker.poll() is not None:
                raise AssertionError(worker.communicate()) from None
            return None
        active = 'cronlock_drainers{queue="default",state="active"} 1.0'
        return answer.text if active in answer.text else None

    try:
        text = wait_for(scraped, timeout=30)
    finally:
        os.kill(worker.pid, signal.SIGTERM)
        worker.communicate(timeout=30)
    assert worker.returncode == 0
    assert text is not None  # wait_for returns only a truthy answer
    names = {family.name for family in text_string_to_metric_families(text)}
    assert {"cronlock_jobs", "cronlock_drainers", "cronlock_task_runs"} <= names
