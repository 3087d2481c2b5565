"""Where cronlock's database is and how to talk to it: URLs, the async engine, sessions.

Accepts the URLs people already have (``postgres://``, ``postgresql://``) as well as
SQLAlchemy's ``postgresql+asyncpg://`` and always drives asyncpg. The schema holding
cronlock's tables is applied with ``schema_translate_map``, never by formatting SQL.

``resolve`` is the one answer to "which database" for every entry point, the command line and
the Python API alike: the URL given (``--database-url``), else ``$CRONLOCK_DATABASE_URL``, else
the App's own ``database_url``, else the embedded PostgreSQL (started, and created the first
time); the schema and the PgBouncer flag likewise (``$CRONLOCK_SCHEMA``,
``$CRONLOCK_PGBOUNCER``).
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote
from uuid import uuid4

from sqlalchemy import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine

from . import embedded
from .errors import ConfigurationError
from .pg import QuickConnections
from .sql.tables import SCHEMA

__all__ = [
    "DATABASE_URL_ENV",
    "PGBOUNCER_ENV",
    "SCHEMA_ENV",
    "Database",
    "Resolved",
    "normalize_url",
    "resolve",
]

DATABASE_URL_ENV = "CRONLOCK_DATABASE_URL"
SCHEMA_ENV = "CRONLOCK_SCHEMA"
PGBOUNCER_ENV = "CRONLOCK_PGBOUNCER"
# click's reading of a boolean, so that the command line and Python agree on CRONLOCK_PGBOUNCER.
_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off", ""}

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_DRIVERS = {"postgres", "postgresql", "postgresql+asyncpg"}
# libpq spells TLS "sslmode"; asyncpg's keyword is "ssl" and takes the same values.
_LIBPQ_RENAMES = {"sslmode": "ssl"}


def normalize_url(url: str | URL) -> URL:
    """The SQLAlchemy asyncpg URL for a PostgreSQL URL as users write them."""
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except (ArgumentError, ValueError):
        raise ConfigurationError(f"not a database URL: {_redact(str(url))!r}") from None
    if parsed.drivername not in _DRIVERS:
        raise ConfigurationError(
            f"unsupported database URL scheme {parsed.drivername!r}: "
            "use postgresql://user@host:port/dbname"
        )
    query = {_LIBPQ_RENAMES.get(k, k): v for k, v in parsed.query.items()}
    return parsed.set(drivername="postgresql+asyncpg", query=query)


@dataclass(frozen=True)
class Resolved:
    """The database an entry point uses, and where that choice came from."""

    url: str
    schema: str
    pgbouncer: bool
    origin: str  # "--database-url", "CRONLOCK_DATABASE_URL", "App(database_url=…)", "embedded"
    server: embedded.Server | None = None  # the embedded server, when that is the database


def resolve(
    url: str | None = None,
    *,
    app_url: str | None = None,
    schema: str | None = None,
    app_schema: str = SCHEMA,
    pgbouncer: bool | None = None,
) -> Resolved:
    """Which database: ``url`` given (the command line's ``--database-url``), else
    ``$CRONLOCK_DATABASE_URL``, else ``app_url`` (``App(database_url=…)``), else the embedded
    PostgreSQL, started (and created the first time) by this call. The schema is ``schema``,
    else ``$CRONLOCK_SCHEMA``, else ``app_schema``; ``pgbouncer``, else
    ``$CRONLOCK_PGBOUNCER``."""
    schema = schema or os.environ.get(SCHEMA_ENV) or app_schema
    if pgbouncer is None:
        pgbouncer = _flag(PGBOUNCER_ENV)
    for origin, candidate in (
        ("--database-url", url),
        (DATABASE_URL_ENV, os.environ.get(DATABASE_URL_ENV)),
        ("App(database_url=…)", app_url),
    ):
        if candidate:
            return Resolved(candidate, schema, pgbouncer, origin)
    server = embedded.start()
    return Resolved(server.url, schema, pgbouncer, "embedded", server)


def _flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigurationError(f"${name} must be 1 or 0 (true/false, yes/no), not {value!r}")


TCP_KEEPALIVE_SETTINGS = {
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "30000",
}


def _unique_statement_name() -> str:
    return f"__cronlock_{uuid4().hex}__"


def _redact(url: str) -> str:
    return re.sub(r"://([^:/@]*):[^@]*@", r"://\1:***@", url)


class Database:
    """A PostgreSQL database and the schema that holds cronlock's tables in it."""

    def __init__(
        self,
        url: str | URL,
        *,
        schema: str = SCHEMA,
        pgbouncer: bool = False,
        echo: bool = False,
        pool_size: int = 5,
    ) -> None:
        if not _SCHEMA_NAME.match(schema):
            raise ConfigurationError(
                f"invalid schema name {schema!r}: use lower-case letters, digits and _"
            )
        self.url = normalize_url(url)
        self.schema = schema
        self.pgbouncer = pgbouncer
        self.echo = echo
        self.pool_size = pool_size
        self._base: AsyncEngine | None = None
        self._engine: AsyncEngine | None = None
        self._quick: QuickConnections | None = None

    def __repr__(self) -> str:
        return f"Database({self.display_url!r}, schema={self.schema!r})"

    @property
    def display_url(self) -> str:
        """The URL as users write it, password hidden, for messages."""
        url = self.url
        shown = URL.create(
            "postgresql",
            username=url.username,
            password="***" if url.password else None,
            host=url.host,
            port=url.port,
            database=url.database,
            query=url.query,
        )
        return unquote(shown.render_as_string(hide_password=False))

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            url = self.url
            settings = {"application_name": "cronlock"}
            connect_args: dict[str, Any] = {"server_settings": settings}
            if not self.pgbouncer:
                # A host that vanishes (power loss, partition) holds its transaction, and so
                # its advisory lock, until the server notices: seconds with these, not the
                # kernel's two hours. PgBouncer rejects unknown startup parameters; behind it
                # its own tcp_keepalive settings apply.
                settings.update(TCP_KEEPALIVE_SETTINGS)
            if self.pgbouncer:
                # PgBouncer in transaction mode hands each transaction any server connection:
                # a named prepared statement may exist there already, or not at all. asyncpg
                # then prepares unnamed statements, and SQLAlchemy's names must be unique.
                url = url.update_query_dict({"prepared_statement_cache_size": "0"})
                connect_args["statement_cache_size"] = 0
                connect_args["prepared_statement_name_func"] = _unique_statement_name
            self._base = create_async_engine(
                url, echo=self.echo, connect_args=connect_args, pool_size=self.pool_size
            )
            self._engine = self._base
            if self.schema != SCHEMA:
                self._engine = self._base.execution_options(
                    schema_translate_map={SCHEMA: self.schema}
                )
        return self._engine

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[AsyncConnection]:
        async with self.engine.connect() as conn:
            yield conn

    @property
    def quick(self) -> QuickConnections:
        """The connections of one-statement work (the one-job enqueue), kept off the pool."""
        if self._quick is None:
            self._quick = QuickConnections(self.engine)
        return self._quick

    def session(self, conn: AsyncConnection | None = None) -> AsyncSession:
        """An ORM session on its own pooled connection, or bound to ``conn``."""
        return AsyncSession(conn if conn is not None else self.engine, expire_on_commit=False)

    async def dispose(self) -> None:
        if self._quick is not None:
            await self._quick.close()
            self._quick = None
        if self._base is not None:
            await self._base.dispose()
            self._base = self._engine = None
