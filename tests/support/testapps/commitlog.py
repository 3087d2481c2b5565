"""A handler that logs which drainer ran each job and when its transaction committed, for the
fence tests: ``done`` gets a number drawn when the handler ran (after its claim), a deferred
trigger copies the row into ``committed`` with a number drawn at COMMIT (``COMMIT_LOG``).
``$DRAINER`` names the process's drainer; job ``n == $SLOW_AT`` writes the file
``$SLOW_MARKER`` and sleeps ``$SLOW_SECONDS``, the others ``$QUICK_SECONDS`` (default 1 ms)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

import cronlock

COMMIT_LOG = [
    "CREATE SEQUENCE commit_seq",
    "CREATE TABLE done (job int NOT NULL, drainer text NOT NULL, ran bigint NOT NULL)",
    "CREATE TABLE committed (job int, drainer text, at bigint DEFAULT nextval('commit_seq'))",
    """CREATE FUNCTION note_commit() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN INSERT INTO committed (job, drainer) VALUES (NEW.job, NEW.drainer); RETURN NULL; END
       $$""",
    """CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON done DEFERRABLE INITIALLY DEFERRED
       FOR EACH ROW EXECUTE FUNCTION note_commit()""",
]


def create_app(name: str | None = None) -> cronlock.App:
    drainer = name or os.environ.get("DRAINER", "?")
    app = cronlock.App()

    @app.job("logged", max_retries=0)
    async def logged(session: AsyncSession, payload: dict[str, Any]) -> None:
        await session.execute(
            text("INSERT INTO done VALUES (:job, :drainer, nextval('commit_seq'))"),
            {"job": payload["n"], "drainer": drainer},
        )
        if payload["n"] == int(os.environ.get("SLOW_AT", "-1")):
            Path(os.environ["SLOW_MARKER"]).write_text(drainer)
            await asyncio.sleep(float(os.environ.get("SLOW_SECONDS", "0")))
        else:
            await asyncio.sleep(float(os.environ.get("QUICK_SECONDS", "0.001")))

    return app


app = create_app()
