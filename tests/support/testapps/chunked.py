"""A chunked task for tests that kill its process: 100 items committed 5 at a time."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from sqlalchemy.dialects.postgresql import insert

import cronlock

from .items import processed

ITEMS = 100
EVERY = 5


async def chunky(run: cronlock.Run) -> None:
    """Inserts the items not done yet; with CRASH_MARKER set, tells the test after
    CRASH_AFTER items (two chunks committed, two items in the third) and waits to be killed."""
    crash_after = int(os.environ.get("CRASH_AFTER", "12"))
    marker = os.environ.get("CRASH_MARKER")
    for item in range(ITEMS):
        if marker and item == crash_after:
            Path(marker).write_text(str(os.getpid()))
            await asyncio.Event().wait()
        async with run.item(item):
            await run.session.execute(insert(processed).values(item=item).on_conflict_do_nothing())


def create_app() -> cronlock.App:
    app = cronlock.App()
    app.periodic("chunky", cron="* * * * *", commit_every=EVERY)(chunky)
    return app


app = create_app()  # for `--app testapps.chunked`
