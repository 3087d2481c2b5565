"""A small app for the crontab tests: one task every minute and a job handler (a drain line)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

import cronlock

app = cronlock.App()


@app.periodic("minutely", cron="* * * * *")
async def minutely(run: cronlock.Run) -> None:
    """One statement, so that a run really talks to the database."""
    await run.session.execute(text("SELECT 1"))


@app.job("noop")
async def noop(session: AsyncSession, payload: dict[str, Any]) -> None:
    """Nothing: its registration is what gives the crontab a drain line."""
