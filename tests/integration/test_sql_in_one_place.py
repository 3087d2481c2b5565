"""Invariant 6 and the style rule: every SQL statement lives in cronlock/sql/, parameterised
(and ``cronlock bench``'s in cronlock_bench/sql.py, its package's one home for SQL)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import cronlock
import cronlock_bench

PACKAGE = Path(cronlock.__file__).resolve().parent
BENCH = Path(cronlock_bench.__file__).resolve().parent
SQL_START = re.compile(
    r"^\s*(select\s.+\sfrom|insert\s+into|update\s+\S+\s+set|delete\s+from|with\s+\w+\s+as"
    r"|(create|alter|drop)\s+(table|index|schema|function|trigger)|truncate|lock\s+table"
    r"|listen\s|notify\s|set\s+(local\s+)?\w+\s*(=|to))",
    re.IGNORECASE | re.DOTALL,
)
# cronlock/sql/ is SQL's one home: tables.py declares DDL (check constraints, server defaults,
# the NOTIFY trigger), the other modules hold the statements.
SQL_HOME = PACKAGE / "sql"
BENCH_SQL = BENCH / "sql.py"
STATEMENT_MODULES = [*sorted(p for p in SQL_HOME.glob("*.py") if p.name != "tables.py"), BENCH_SQL]


def _modules() -> list[Path]:
    found = [*PACKAGE.rglob("*.py"), *BENCH.rglob("*.py")]
    return sorted(p for p in found if "_migrations" not in p.parts)


def test_no_sql_strings_outside_queries() -> None:
    offenders = []
    for path in _modules():
        if SQL_HOME in path.parents or path == BENCH_SQL:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and SQL_START.match(node.value)
            ):
                offenders.append(f"{path.name}:{node.lineno}: {node.value[:40]!r}")
            if (
                isinstance(node, ast.ImportFrom)
                and any(alias.name == "text" for alias in node.names)
                and node.module == "sqlalchemy"
            ):
                offenders.append(f"{path.name}:{node.lineno}: imports sqlalchemy.text")
    assert offenders == []


@pytest.mark.parametrize(
    "module", STATEMENT_MODULES, ids=[str(p.relative_to(PACKAGE.parent)) for p in STATEMENT_MODULES]
)
def test_statements_format_nothing_into_sql(module: Path) -> None:
    tree = ast.parse(module.read_text())
    # A column alias built from a constant is an identifier SQLAlchemy quotes itself.
    aliases = {
        id(node.args[0])
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "label"
        and node.args
    }
    formatted = [
        node.lineno
        for node in ast.walk(tree)
        if id(node) not in aliases
        and (
            isinstance(node, ast.JoinedStr)
            or (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod))
            or (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "format"
            )
        )
    ]
    assert formatted == [], f"{module} formats strings at lines {formatted}"
