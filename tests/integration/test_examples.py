"""The examples in tasks/ are code that runs: their demo data, the reindex and the stats cron."""

from __future__ import annotations

from types import ModuleType

from sqlalchemy import func, select, text

from cronlock import App, Database, RunStatus
from tasks.models import BAD_POSTS, Post, PostStats


async def test_reindex_then_stats(database: Database, examples: ModuleType) -> None:
    app: App = examples.app
    app.use_database(str(database.url))
    try:
        async with database.session() as session:
            await examples.setup_demo(session, posts=50)
        reindex = await app.run("reindex-fts", manual=True)
        stats = await app.run("refresh-post-stats", manual=True)
        # Only the bad post is left, and fails again.
        again = await app.run("reindex-fts", manual=True)
    finally:
        await app.aclose()

    assert reindex.status is RunStatus.PARTIAL
    assert (reindex.items_ok, reindex.items_failed) == (49, 1)
    # The demo's bad posts among the first 50 (post 17's language does not exist), and only it.
    bad = [str(post) for post in sorted(BAD_POSTS) if post <= 50]
    assert bad == ["17"]
    assert [failure.item for failure in reindex.failures] == bad
    assert reindex.failures[0].error_type == "UndefinedObjectError"
    assert f'"{BAD_POSTS[17]}" does not exist' in reindex.failures[0].message
    assert stats.status is RunStatus.COMPLETED
    assert (again.items_ok, again.items_failed) == (0, 1)
    assert [failure.item for failure in again.failures] == bad
    async with database.session() as session:
        summary = await session.get(PostStats, 1)
        assert summary is not None and (summary.posts, summary.indexed) == (50, 49)
        hits = await session.scalar(
            select(func.count())
            .select_from(Post)
            .where(Post.search_vector.op("@@")(func.to_tsquery("english", "savepoints")))
        )
        assert hits == 49


async def test_plain_sql_insert_enqueues_a_job(database: Database) -> None:
    # Server defaults for every column but job_type and payload (a trigger or another language).
    async with database.engine.begin() as conn:
        await conn.execute(
            text("INSERT INTO cronlock.jobs (job_type, payload) VALUES ('send_email', '{}')")
        )
        row = (await conn.execute(text("SELECT * FROM cronlock.jobs"))).mappings().one()
    assert row["status"] == "pending"
    assert (row["retry_count"], row["max_retries"]) == (0, 3)
    assert row["error_history"] == []
    assert row["id"] is not None and row["created_at"] is not None
    assert (row["queue"], row["priority"]) == ("default", 0)
    assert row["run_at"] == row["created_at"]  # due at once
