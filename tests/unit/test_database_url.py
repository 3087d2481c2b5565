"""The URLs people already have are accepted and always drive asyncpg."""

from __future__ import annotations

import pytest

from cronlock import ConfigurationError, Database
from cronlock.database import normalize_url, url_options


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


def test_libpq_sslmode_is_read_by_asyncpg_as_libpq_reads_it() -> None:
    given = url_options(normalize_url("postgresql://h/db?sslmode=verify-full&sslrootcert=/ca"))
    assert dict(given.url.query) == {}
    assert given.connect_args == {"dsn": "postgresql://?sslmode=verify-full&sslrootcert=%2Fca"}
    assert url_options(normalize_url("postgresql://h/db?ssl=require")).connect_args == {
        "dsn": "postgresql://?sslmode=require"
    }


def test_the_libpq_options_people_put_in_urls_are_mapped_to_asyncpg() -> None:
    # Issue 16, point 4: these crashed every command with a TypeError from asyncpg.connect.
    given = url_options(
        normalize_url(
            "postgresql://u@h/db?connect_timeout=5&application_name=billing"
            "&options=-c%20statement_timeout%3D5s%20--search-path%3Dapp"
            "&keepalives=1&keepalives_idle=7&target_session_attrs=read-write"
            "&dbname=other&host=/run/pg&port=5433&command_timeout=30"
        )
    )
    assert given.connect_args == {
        "timeout": 5.0,
        "command_timeout": 30.0,
        "dsn": "postgresql://?target_session_attrs=read-write",
    }
    assert given.server_settings == {
        "application_name": "billing",
        "statement_timeout": "5s",
        "search_path": "app",
        "tcp_keepalives_idle": "7",
    }
    assert given.url.database == "other"
    assert dict(given.url.query) == {"host": "/run/pg", "port": "5433"}


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("foo=1", "unknown database URL option 'foo' (cronlock understands application_name,"),
        ("connect_timeout=soon", "connect_timeout='soon': expected a number of at least 1"),
        ("options=-j", "options='-j': only settings are supported"),
        ("options=-c", "options='-c': -c needs name=value"),
        ("keepalives=0", "keepalives=0: cronlock keeps TCP keepalives on"),
    ],
)
def test_an_option_cronlock_cannot_honour_is_refused_in_one_line(query: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        Database(f"postgresql://u@h/db?{query}")
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "url",
    ["postgresql://u:hunter@2#x@host/db", "postgresql://u:hunter@2@host:5432/db?sslmode=require"],
)
def test_a_password_with_an_unencoded_at_sign_is_refused_and_never_shown(url: str) -> None:
    # Issue 16, point 5: p@ss#word was shown as postgresql://u:***@ss#word@host.
    with pytest.raises(ConfigurationError) as raised:
        Database(url)
    message = str(raised.value)
    assert "hunter" not in message and "2#x" not in message and "@2" not in message
    assert "postgresql://***@host" in message
    assert "percent-encoded (@ as %40, # as %23" in message


def test_an_encoded_password_connects_as_written_and_is_hidden() -> None:
    database = Database("postgresql://u:p%40ss%23word@host/db?sslpassword=secret")
    assert database.url.password == "p@ss#word"
    assert database.display_url == "postgresql://u:***@host/db?sslpassword=***"
    assert Database("postgresql://u:p#ss@host/db").display_url == "postgresql://u:***@host/db"


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
