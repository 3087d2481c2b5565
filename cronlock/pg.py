"""The driver boundary: everything that touches asyncpg or SQLAlchemy's internals.

Statements live in ``sql/`` as SQLAlchemy Core; the hot paths (the drainer's lanes, the lock
connection, the one-job enqueue) send them on a bare asyncpg connection, compiled once here
with the schema applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

from .sql.tables import SCHEMA

__all__ = ["AsyncpgStatement"]

_ASYNCPG = PGDialect_asyncpg()  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class AsyncpgStatement:
    """A Core statement compiled for a bare asyncpg connection: SQL text and argument order.

    For the few statements run outside SQLAlchemy (the lock connection): compiled once from
    the same Core statement, with the schema applied, so the SQL still lives only in ``sql/``.
    """

    sql: str
    compiled: SQLCompiler

    @classmethod
    def of(cls, statement: ClauseElement, schema: str) -> AsyncpgStatement:
        compiled = statement.compile(
            dialect=_ASYNCPG, schema_translate_map={SCHEMA: schema}, render_schema_translate=True
        )
        assert isinstance(compiled, SQLCompiler)
        return cls(str(compiled), compiled)

    def args(self, **params: Any) -> list[Any]:
        values = self.compiled.construct_params(params) or {}
        return [values[name] for name in self.compiled.positiontup or ()]
