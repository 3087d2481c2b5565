"""cronlock's pytest plugin: a migrated database per test and a clock both sides share.

Registered under the ``pytest11`` entry point ``cronlock`` (``-p no:cronlock`` turns it off).
Its fixtures, all synchronous (for synchronous and asynchronous tests alike), all prefixed
``cronlock_`` so that they never shadow a project's own:

- ``cronlock_server`` (session): the server's URL (``cronlock.testing.databases.server_url``:
  ``$CRONLOCK_TEST_DATABASE_URL``, the ini option ``cronlock_database_url``,
  ``$CRONLOCK_DATABASE_URL``). None configured fails the test that asked, in one line.
- ``cronlock_template_setup`` (session): None; override it with an ``async def setup(url)``
  to add your own tables or migrations to the template, once per session.
- ``cronlock_database_pool`` (session): the template and its copies (``DatabasePool``); with
  pytest-xdist, one per worker process.
- ``cronlock_database_url`` (function): the URL of a freshly migrated database of the test's
  own, dropped after it.
- ``cronlock_clock`` (function): a ``TestClock`` on that database, frozen at the real time of
  the test's start.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import URL

from ..errors import ConfigurationError
from .clock import TestClock
from .databases import DatabasePool, TemplateSetup, server_url

__all__ = [
    "cronlock_clock",
    "cronlock_database_pool",
    "cronlock_database_url",
    "cronlock_server",
    "cronlock_template_setup",
]

INI_URL = "cronlock_database_url"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        INI_URL,
        "PostgreSQL server for cronlock.testing's test databases (after "
        "$CRONLOCK_TEST_DATABASE_URL, before $CRONLOCK_DATABASE_URL)",
        default=None,
    )


@pytest.fixture(scope="session")
def cronlock_server(pytestconfig: pytest.Config) -> URL:
    """The server the test databases are made on."""
    configured = pytestconfig.getini(INI_URL) or None
    try:
        return server_url(configured)
    except ConfigurationError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def cronlock_template_setup() -> TemplateSetup | None:
    """What the template gets after cronlock's migrations (override it); None: nothing."""
    return None


@pytest.fixture(scope="session")
def cronlock_database_pool(
    cronlock_server: URL, cronlock_template_setup: TemplateSetup | None
) -> Iterator[DatabasePool]:
    """A template migrated once for the session (per xdist worker), and its copies."""
    pool = DatabasePool.create(cronlock_server, cronlock_template_setup)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def cronlock_database_url(cronlock_database_pool: DatabasePool) -> Iterator[str]:
    """The URL of a migrated database of this test's own (``app.use_database(url)``)."""
    with cronlock_database_pool.lease() as name:
        yield cronlock_database_pool.url(name)


@pytest.fixture
def cronlock_clock(cronlock_database_url: str) -> TestClock:
    """The test database's clock, frozen now; move it with ``set`` and ``advance``."""
    return TestClock(cronlock_database_url)
