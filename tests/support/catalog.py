"""A schema's shape read from PostgreSQL's catalogs, to compare two databases exactly."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from cronlock import Database
from cronlock.sql.tables import VERSION_TABLE

# Test-only catalog reads: what PostgreSQL itself says the schema is.
_QUERIES = {
    "columns": """
        SELECT table_name, column_name, data_type, udt_name, is_nullable, column_default,
               is_identity, identity_generation, character_maximum_length
        FROM information_schema.columns WHERE table_schema = :schema AND table_name <> :version
        ORDER BY table_name, column_name""",
    "constraints": """
        SELECT c.relname, con.conname, pg_get_constraintdef(con.oid)
        FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid
        WHERE con.connamespace = (SELECT oid FROM pg_namespace WHERE nspname = :schema)
          AND c.relname <> :version
        ORDER BY 1, 2""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = :schema AND tablename <> :version ORDER BY 1, 2""",
    "triggers": """
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = :schema)
          AND NOT t.tgisinternal
        ORDER BY 1, 2""",
    "functions": """
        SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p
        WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = :schema) ORDER BY 1""",
    "tables": """
        SELECT relname, relkind FROM pg_class
        WHERE relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = :schema)
          AND relkind IN ('r', 'v', 'm', 'S') AND relname <> :version
        ORDER BY 1""",
}


async def fingerprint(database: Database, schema: str = "cronlock") -> dict[str, list[Any]]:
    async with database.connect() as conn:
        return {
            name: [
                tuple(row)
                for row in await conn.execute(
                    text(query), {"schema": schema, "version": VERSION_TABLE}
                )
            ]
            for name, query in _QUERIES.items()
        }
