"""No module of the package but ``cronlock/pg.py`` reaches past SQLAlchemy's or asyncpg's API.

The driver boundary (``pg.py``) is the one place that imports asyncpg, SQLAlchemy's private
helpers and modules, or reads the internals the hot paths need; everything else goes through
it. The scan reads the code (its syntax tree), not the prose: a docstring may name them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import cronlock
import cronlock_bench

PACKAGE = Path(cronlock.__file__).resolve().parent
BENCH = Path(cronlock_bench.__file__).resolve().parent
BOUNDARY = PACKAGE / "pg.py"

# Attributes read only behind the boundary: the session's and identity map's own dicts, the
# compiled statement's parameter order, the dialect's connect arguments, and the ways to the
# driver's connection under SQLAlchemy's.
PRIVATE_ATTRIBUTES = {
    "_new",
    "_deleted",
    "_modified",
    "_transaction",
    "positiontup",
    "construct_params",
    "create_connect_args",
    "driver_connection",
    "dbapi_connection",
    "get_raw_connection",
    "raw_connection",
}
# Names that are SQLAlchemy's async plumbing rather than its API.
PRIVATE_NAMES = {"greenlet_spawn", "await_only", "await_"}
# Modules imported only behind the boundary: the driver, SQLAlchemy's utilities, its asyncpg
# dialect, its default execution machinery and its pool. (Its compiler is public: a
# ``@compiles`` extension takes one, as cronlock_bench/sql.py's VACUUM does.)
PRIVATE_MODULES = (
    "asyncpg",
    "sqlalchemy.util",
    "sqlalchemy.dialects.postgresql.asyncpg",
    "sqlalchemy.engine.default",
    "sqlalchemy.pool",
)


def _private_module(name: str) -> bool:
    if any(name == m or name.startswith(m + ".") for m in PRIVATE_MODULES):
        return True
    # Any private module of SQLAlchemy's (sqlalchemy.orm._typing, sqlalchemy.sql._elements…).
    return name.startswith("sqlalchemy.") and any(p.startswith("_") for p in name.split("."))


def offences(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        where = f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRIBUTES:
            found.append(f"{where}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in PRIVATE_NAMES:
            found.append(f"{where}: {node.id}")
        elif isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if _private_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _private_module(node.module):
                found.append(f"{where}: from {node.module} import …")
            found += [
                f"{where}: from {node.module} import {a.name}"
                for a in node.names
                if a.name in PRIVATE_NAMES or a.name.startswith("_")
            ]
    return found


def test_only_the_boundary_reaches_past_the_libraries_api() -> None:
    # cronlock_bench (`cronlock bench`, in the same wheel) goes through the boundary too.
    modules = sorted(p for p in [*PACKAGE.rglob("*.py"), *BENCH.rglob("*.py")] if p != BOUNDARY)
    assert len(modules) > 30  # the whole package, subpackages included
    assert [o for path in modules for o in offences(path)] == []


def test_the_scan_sees_what_the_boundary_does() -> None:
    # The boundary itself does every kind of thing the scan looks for, so a scan that found
    # nothing there would find nothing anywhere.
    seen = " ".join(offences(BOUNDARY))
    for needle in ("._new", "._modified", ".positiontup", ".create_connect_args"):
        assert needle in seen
    for needle in ("greenlet_spawn", "import asyncpg", "from sqlalchemy.util"):
        assert needle in seen
