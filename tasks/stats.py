"""A single-transaction cron, like the reference's ``run_cron_with_lock``: one statement,
all or nothing, under the task's advisory lock."""

from __future__ import annotations

from sqlalchemy import func, literal, select
from sqlalchemy.dialects.postgresql import insert

import cronlock

from . import app
from .models import Post, PostStats


@app.periodic("refresh-post-stats", cron="0 * * * *")
async def refresh_post_stats(run: cronlock.Run) -> None:
    """Recount posts and indexed posts into the one-row post_stats table."""
    counts = select(
        literal(1), func.count(), func.count(Post.search_vector), func.now()
    ).select_from(Post)
    upsert = insert(PostStats).from_select(["id", "posts", "indexed", "refreshed_at"], counts)
    await run.session.execute(
        upsert.on_conflict_do_update(
            index_elements=[PostStats.id],
            set_={
                "posts": upsert.excluded.posts,
                "indexed": upsert.excluded.indexed,
                "refreshed_at": upsert.excluded.refreshed_at,
            },
        )
    )
