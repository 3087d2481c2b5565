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
import shlex
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlencode
from uuid import uuid4

from sqlalchemy import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine

from .errors import ConfigurationError
from .pg import QuickConnections, UrlOptions
from .sql.tables import SCHEMA

if TYPE_CHECKING:
    from . import embedded

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


def normalize_url(url: str | URL) -> URL:
    """The SQLAlchemy asyncpg URL for a PostgreSQL URL as users write them, its options
    checked (``url_options`` says what becomes of each)."""
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except (ArgumentError, ValueError):
        raise ConfigurationError(f"not a database URL: {_redact(str(url))!r}") from None
    if isinstance(url, str):
        _check_encoding(parsed, url)
    if parsed.drivername not in _DRIVERS:
        raise ConfigurationError(
            f"unsupported database URL scheme {parsed.drivername!r}: "
            "use postgresql://user@host:port/dbname"
        )
    normal = parsed.set(drivername="postgresql+asyncpg")
    url_options(normal)  # an option cronlock cannot honour is refused now, in one line
    return normal


# libpq's connection keywords as people put them in URLs, and what cronlock does with each
# (asyncpg takes keywords, not a libpq query string; an option passed through unknown would
# crash every connection with a TypeError deep in SQLAlchemy).
# asyncpg reads these from a DSN exactly as libpq does: they are handed to it as one.
_LIBPQ_DSN = frozenset(
    {
        "sslmode",
        "sslcert",
        "sslkey",
        "sslrootcert",
        "sslcrl",
        "sslpassword",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "target_session_attrs",
        "krbsrvname",
        "gsslib",
        "passfile",
    }
)
# Where the server is and who connects (keywords of asyncpg.connect that SQLAlchemy passes
# on), and SQLAlchemy's own statement cache size: kept in the URL.
_PASSED = frozenset({"host", "port", "user", "password", "prepared_statement_cache_size"})
# libpq's client-side keepalives become the server's (as cronlock's own defaults are).
_KEEPALIVES = {
    "keepalives_idle": "tcp_keepalives_idle",
    "keepalives_interval": "tcp_keepalives_interval",
    "keepalives_count": "tcp_keepalives_count",
    "tcp_user_timeout": "tcp_user_timeout",
}
# asyncpg's own keywords, for postgresql+asyncpg:// URLs written for SQLAlchemy.
_ASYNCPG_NUMBERS: dict[str, type[int] | type[float]] = {
    "command_timeout": float,
    "statement_cache_size": int,
    "max_cached_statement_lifetime": float,
    "max_cacheable_statement_size": int,
}
_OTHERS = ("dbname", "connect_timeout", "application_name", "options", "keepalives", "ssl")
_KNOWN = ", ".join(sorted({*_LIBPQ_DSN, *_PASSED, *_KEEPALIVES, *_ASYNCPG_NUMBERS, *_OTHERS}))


def url_options(url: URL) -> UrlOptions:
    """What each option of ``url``'s query becomes for asyncpg; an unknown or malformed one
    is a ``ConfigurationError`` naming it."""
    passed: dict[str, str | tuple[str, ...]] = {}
    dsn: dict[str, str] = {}
    connect_args: dict[str, Any] = {}
    settings: dict[str, str] = {}
    for key, value in url.query.items():
        one = value[-1] if isinstance(value, tuple) else value
        if key in _PASSED:
            passed[key] = value
        elif key in _LIBPQ_DSN:
            dsn[key] = one
        elif key == "ssl":  # asyncpg's name for sslmode (SQLAlchemy users write it)
            dsn["sslmode"] = one
        elif key == "dbname":
            url = url.set(database=one)
        elif key == "connect_timeout":
            connect_args["timeout"] = float(_number(key, one, int, minimum=1))
        elif key == "application_name":
            settings["application_name"] = one
        elif key == "options":
            settings.update(_server_options(one))
        elif key in _KEEPALIVES:
            settings[_KEEPALIVES[key]] = str(_number(key, one, int, minimum=0))
        elif key == "keepalives":
            if one != "1":
                raise ConfigurationError(
                    f"database URL option keepalives={one}: cronlock keeps TCP keepalives on "
                    "(they are how a vanished host's locks are released); tune them with "
                    "keepalives_idle, keepalives_interval and keepalives_count"
                )
        elif key in _ASYNCPG_NUMBERS:
            connect_args[key] = _number(key, one, _ASYNCPG_NUMBERS[key], minimum=0)
        else:
            raise ConfigurationError(
                f"unknown database URL option {key!r} (cronlock understands {_KNOWN})"
            )
    if dsn:
        connect_args["dsn"] = "postgresql://?" + urlencode(dsn)
    return UrlOptions(url.set(query=passed), connect_args, settings)


def _number(key: str, value: str, kind: type[int] | type[float], *, minimum: int) -> int | float:
    try:
        number = kind(value)
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise ConfigurationError(
            f"database URL option {key}={value!r}: expected a number of at least {minimum}"
        )
    return number


def _server_options(value: str) -> dict[str, str]:
    """libpq's ``options`` (``-c name=value`` or ``--name=value``, any number of them) as
    session settings; anything else a server command line takes is refused."""
    settings: dict[str, str] = {}
    try:
        words = shlex.split(value)
    except ValueError:
        words = None
    pending = False
    for word in words or [""]:
        if pending:
            setting, pending = word, False
        elif word == "-c":
            pending = True
            continue
        elif word.startswith("-c") or word.startswith("--"):
            setting = word[2:]
        else:
            setting = ""
        name, equals, setting_value = setting.partition("=")
        if not (equals and name):
            raise ConfigurationError(
                f"database URL option options={value!r}: only settings are supported "
                "(-c name=value or --name=value, e.g. options=-c%20statement_timeout%3D5s)"
            )
        settings[name.replace("-", "_")] = setting_value
    if pending:
        raise ConfigurationError(f"database URL option options={value!r}: -c needs name=value")
    return settings


def _check_encoding(parsed: URL, url: str) -> None:
    """A password holding an unencoded ``@`` is read up to its first ``@``: the rest would be
    taken for the host, and shown as one in every error. Say so, showing none of it."""
    if parsed.host and "@" in parsed.host:
        scheme, _, rest = url.partition("://")
        after = rest.rpartition("@")[2]
        raise ConfigurationError(
            f"the database URL {scheme}://***@{after} has a user or password with a character "
            "that must be percent-encoded (@ as %40, # as %23, / as %2F, : as %3A)"
        )


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
    # Imported only when it is the database: a configured URL never needs it.
    from . import embedded

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
    """The URL with its whole credential hidden, up to the last ``@`` (a password may hold
    one, unencoded), and any password option of its query."""
    url = re.sub(r"://[^/?]*@", "://***@", url) if "@" in url else url
    return re.sub(r"((?:ssl)?password=)[^&]*", r"\1***", url)


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
            query={k: "***" if "password" in k else v for k, v in url.query.items()},
        )
        return unquote(shown.render_as_string(hide_password=False))

    @property
    def driver_options(self) -> UrlOptions:
        """What the URL's options become for asyncpg (``url_options``)."""
        return url_options(self.url)

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            given = self.driver_options
            url = given.url
            settings = {"application_name": "cronlock"}
            connect_args: dict[str, Any] = {**given.connect_args, "server_settings": settings}
            if not self.pgbouncer:
                # A host that vanishes (power loss, partition) holds its transaction, and so
                # its advisory lock, until the server notices: seconds with these, not the
                # kernel's two hours. PgBouncer rejects unknown startup parameters; behind it
                # its own tcp_keepalive settings apply.
                settings.update(TCP_KEEPALIVE_SETTINGS)
            settings.update(given.server_settings)  # the URL's own win
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
