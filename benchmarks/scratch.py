"""Scratch databases: every measured run gets a fresh database, dropped afterwards.

A fresh database per run means no system sees another's tables, dead tuples or warmed
caches of its own previous run, and nothing is left behind when the harness stops.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from cronlock import schema
from cronlock.database import Database

__all__ = ["database_url", "scratch_database", "with_schema"]


def database_url(server_url: str, name: str) -> str:
    """``server_url`` pointing at the database ``name`` instead."""
    parts = urlsplit(server_url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def _quoted(name: str) -> str:
    # Identifiers cannot be bound parameters; the name is ours (a prefix and a uuid).
    if not name.replace("_", "").isalnum():
        raise ValueError(f"unexpected database name {name!r}")
    return '"' + name + '"'


@asynccontextmanager
async def scratch_database(server_url: str, prefix: str = "bench") -> AsyncIterator[str]:
    """Create an empty database on the server of ``server_url``; yield its URL; drop it."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server_url)
    try:
        await admin.execute("CREATE DATABASE " + _quoted(name))
    finally:
        await admin.close()
    try:
        yield database_url(server_url, name)
    finally:
        admin = await asyncpg.connect(server_url)
        try:
            await admin.execute("DROP DATABASE IF EXISTS " + _quoted(name) + " WITH (FORCE)")
        finally:
            await admin.close()


async def with_schema(url: str) -> None:
    """cronlock's schema, migrated to the newest revision, in the database of ``url``."""
    database = Database(url)
    try:
        await schema.upgrade(database)
    finally:
        await database.dispose()
