"""One liveness rule for the drainers' rows, shared by ``cronlock status`` and the metrics.

A SIGKILLed drainer leaves its row in ``workers`` (only WORKER_PRUNE removes it, an hour
later). Both readers must stop counting it once its heartbeat is older than
``sql.WORKER_ALIVE_WITHIN``, and not before: the test writes the heartbeat it needs instead
of waiting for it to age.
"""

from __future__ import annotations

from datetime import timedelta

from cli import kill_all, start_cli
from jobsupport import job_app
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select, update
from waiting import eventually

from cronlock import Database, sql
from cronlock.observe.prometheus import render_metrics, scrape
from cronlock.observe.status import collect_queue
from cronlock.sql.tables import workers


async def _states(database: Database) -> list[str]:
    async with database.connect() as conn:
        return list((await conn.execute(select(workers.c.state))).scalars().all())


async def _beat_ago(database: Database, ago: timedelta) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(update(workers).values(heartbeat_at=func.now() - ago))


async def _seen(database: Database) -> tuple[list[str], dict[tuple[str, str], float]]:
    """The drainers' states as ``cronlock status`` shows them, and ``cronlock_drainers``."""
    shown = [worker["state"] for worker in (await collect_queue(database))["workers"]]
    metrics = render_metrics(await scrape(database)).decode()
    drainers = {
        (sample.labels["queue"], sample.labels["state"]): sample.value
        for family in text_string_to_metric_families(metrics)
        if family.name == "cronlock_drainers"
        for sample in family.samples
    }
    return shown, drainers


async def test_a_killed_drainer_is_gone_in_status_and_metrics_past_the_rule(
    database: Database, database_url: str
) -> None:
    async with job_app(database):
        pass  # the test handlers' tables
    worker = start_cli("--app", "testapps.jobs", "worker", database_url=database_url)
    try:

        async def active() -> bool:
            return await _states(database) == ["active"]

        await eventually(active, timeout=30)
        worker.kill()
        worker.wait(timeout=30)
    finally:
        kill_all(worker)
    assert await _states(database) == ["active"]  # SIGKILL left the row behind

    second = timedelta(seconds=1)
    # Within the rule a row may be a live drainer between two beats: both still count it.
    await _beat_ago(database, sql.WORKER_ALIVE_WITHIN - second)
    assert await _seen(database) == (["active"], {("default", "active"): 1.0})
    # Past it, the drainer is gone for both.
    await _beat_ago(database, sql.WORKER_ALIVE_WITHIN + second)
    assert await _seen(database) == (["gone"], {})
