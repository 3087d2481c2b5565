"""The bench's scratch schema: created fresh, migrated, and dropped whatever happens.

Its name is ``cronlock_bench_<random hex>``; its queue name is unique too, because advisory
locks are per database, not per schema: a drainer of the user's own ``default`` queue and the
bench's drainers never wait for each other.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError

from cronlock import schema
from cronlock.app import App
from cronlock.database import Database
from cronlock.errors import DatabaseUnavailable

from . import sql as bench_sql
from .app import make_app

__all__ = ["Scratch", "one_line", "scratch_schema"]

PREFIX = "cronlock_bench_"


@dataclass(frozen=True)
class Scratch:
    """Where the bench works: its schema and queue, and an app with the no-op job on them."""

    url: str
    schema: str
    queue: str
    app: App

    @property
    def database(self) -> Database:
        return self.app.database

    def fresh_app(self) -> App:
        """Another app on the same schema, with its own engine (a second client)."""
        app = make_app()
        app.use_database(self.url, schema=self.schema)
        return app


@contextlib.asynccontextmanager
async def scratch_schema(url: str) -> AsyncIterator[Scratch]:
    """Create and migrate a fresh schema, yield it, and drop it (also on error or Ctrl-C)."""
    token = secrets.token_hex(6)
    name = PREFIX + token
    app = make_app()
    database = app.use_database(url, schema=name)
    try:
        async with database.engine.begin() as conn:
            await conn.execute(bench_sql.bench_schema_create(name))
    except (OSError, DBAPIError, TimeoutError) as exc:
        await app.aclose()
        raise DatabaseUnavailable(_why_not(database, exc)) from None
    try:
        await schema.upgrade(database)
        async with database.engine.begin() as conn:
            await conn.execute(bench_sql.BENCH_ITEMS_CREATE)
        yield Scratch(url=url, schema=name, queue="cronlock-bench-" + token, app=app)
    finally:
        await app.aclose()
        await drop(url, name)


def one_line(exc: BaseException) -> str:
    """The first line of what the driver (or the exception) said."""
    cause = getattr(exc, "orig", None) or exc
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0]}" if text else type(cause).__name__


def _why_not(database: Database, exc: BaseException) -> str:
    answer = getattr(exc, "orig", None)
    if getattr(answer, "sqlstate", None) is None:  # no answer from a server
        return schema.describe_connection_error(database, exc)
    detail = str(answer).strip().splitlines()[0]
    return (
        f"cannot create a scratch schema in {database.display_url}: {detail} "
        "(the bench needs CREATE on the database)"
    )


async def drop(url: str, name: str) -> None:
    database = Database(url, schema=name)
    try:
        async with database.engine.begin() as conn:
            await conn.execute(bench_sql.bench_schema_drop(name))
    except (OSError, DBAPIError, TimeoutError) as exc:
        raise DatabaseUnavailable(
            f"could not drop the scratch schema {name} ({one_line(exc)}): "
            f"drop it by hand with DROP SCHEMA {name} CASCADE"
        ) from None
    finally:
        await database.dispose()
