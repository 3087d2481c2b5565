"""The reference's FTS reindex: ``to_tsvector`` per post, each post in its own savepoint.

A post whose content cannot be indexed fails alone and is recorded in the run; the other
posts of the batch commit. A post that keeps failing stays NULL and is tried again next run,
until it failed in three runs in a row: then it is parked, and ``run.skip_parked`` leaves it
out (``cronlock task parked reindex-fts`` lists it). The batch is ordered by id and bounded: a
run never holds more than BATCH_SIZE savepoints.
"""

from __future__ import annotations

from sqlalchemy import cast, func, select, update
from sqlalchemy.dialects.postgresql import REGCONFIG

import cronlock

from . import app
from .models import Post

BATCH_SIZE = 1000


@app.periodic("reindex-fts", cron="*/15 * * * *")
async def reindex_fts(run: cronlock.Run) -> None:
    """Recompute the search vector of posts that have none, one savepoint per post."""
    post_ids = await run.session.scalars(
        select(Post.id).where(Post.search_vector.is_(None)).order_by(Post.id).limit(BATCH_SIZE)
    )
    for post_id in run.skip_parked(post_ids.all()):
        async with run.item(post_id):
            await run.session.execute(
                update(Post)
                .where(Post.id == post_id)
                .values(
                    search_vector=func.to_tsvector(
                        cast(Post.language, REGCONFIG),
                        func.concat_ws(" ", Post.title, Post.content),
                    )
                )
                .execution_options(synchronize_session=False)
            )
