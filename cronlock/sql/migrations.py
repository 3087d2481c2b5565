"""Reading alembic's version table (alembic owns and writes it)."""

from __future__ import annotations

from sqlalchemy import Column, MetaData, String, Table, select

from .tables import SCHEMA, VERSION_TABLE

__all__ = ["SCHEMA_REVISION"]

# alembic owns this table; it is declared here only to read it.
_alembic_version = Table(
    VERSION_TABLE, MetaData(schema=SCHEMA), Column("version_num", String(32), primary_key=True)
)

SCHEMA_REVISION = select(_alembic_version.c.version_num)
