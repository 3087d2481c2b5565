"""The bench's app: one no-op job type. ``cronlock bench`` starts its workers with
``--app cronlock.bench.app``, so the app ships in the package and imports from a wheel."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from cronlock.app import App

__all__ = ["JOB_TYPE", "app", "make_app"]

JOB_TYPE = "cronlock-bench-noop"


async def noop(session: AsyncSession, payload: Any) -> None:
    """Does nothing and never touches its session: what is measured is the queue itself."""
    return None


def make_app() -> App:
    fresh = App()
    fresh.job(JOB_TYPE, max_retries=0)(noop)
    return fresh


app = make_app()
