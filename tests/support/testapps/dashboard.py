"""The dashboard's test app: two periodic tasks in two zones and the queue's test handlers.

``tests/support/dashseed.py`` fills a database with its runs and jobs in every state; the
browser tests run ``cronlock serve --app testapps.dashboard`` on it.
"""

from __future__ import annotations

import cronlock

from . import jobs as testjobs

TASKS = ("every-minute", "hourly-report")


async def tick(run: cronlock.Run) -> None:
    """Does nothing: its history is seeded."""


def create_app() -> cronlock.App:
    app = testjobs.create_app()
    app.periodic("every-minute", cron="* * * * *")(tick)
    app.periodic("hourly-report", cron="5 * * * *", timezone="Europe/Madrid")(tick)
    return app


app = create_app()
