"""What ``cronlock status`` reports, computed from the tables."""

from __future__ import annotations

from typing import Any

from . import queries
from .app import App
from .database import Database

__all__ = ["collect"]


def _jsonable(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


async def collect(app: App, database: Database, *, limit: int = 5) -> dict[str, Any]:
    async with database.connect() as conn:
        rows = (await conn.execute(queries.RUN_RECENT_PER_TASK, {"limit": limit})).mappings()
        by_task: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_task.setdefault(row["task"], []).append(
                {key: _jsonable(value) for key, value in row.items()}
            )
    names = sorted(set(app.tasks) | set(by_task))
    return {"tasks": [{"task": name, "last_runs": by_task.get(name, [])} for name in names]}
