"""The URLs people already have are accepted and always drive asyncpg."""

from __future__ import annotations

import pytest

from cronlock import ConfigurationError, Database
from cronlock.database import normalize_url


@pytest.mark.parametrize(
    "url",
    [
        "postgres://u:p@db.example:5433/app",
        "postgresql://u:p@db.example:5433/app",
        "postgresql+asyncpg://u:p@db.example:5433/app",
    ],
)
def test_schemes_are_normalised(url: str) -> None:
    parsed = normalize_url(url)
    assert parsed.drivername == "postgresql+asyncpg"
    assert (parsed.host, parsed.port, parsed.database, parsed.username) == (
        "db.example",
        5433,
        "app",
        "u",
    )


def test_libpq_sslmode_becomes_asyncpg_ssl() -> None:
    assert dict(normalize_url("postgresql://h/db?sslmode=require").query) == {"ssl": "require"}


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://u@h/db", "unsupported database URL scheme 'mysql'"),
        ("not a url", "not a database URL"),
    ],
)
def test_bad_urls_are_clear_errors(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        normalize_url(url)


def test_display_url_hides_the_password() -> None:
    database = Database("postgres://alice:s3cret@db:5432/app")
    assert database.display_url == "postgresql://alice:***@db:5432/app"
    assert "s3cret" not in repr(database)


def test_schema_names_are_validated() -> None:
    with pytest.raises(ConfigurationError, match="invalid schema name"):
        Database("postgresql://h/db", schema='x"; DROP TABLE y; --')
