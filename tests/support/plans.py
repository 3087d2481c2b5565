"""A statement's plan as a prepared statement gets it: custom (planned for the values given)
or generic (planned for no values: what PostgreSQL may keep from a prepared statement's sixth
run on). The statement is prepared with SQL's PREPARE and explained as an EXECUTE with the
values written as literals: an EXPLAIN sent with protocol parameters is planned for their
values whatever plan_cache_mode says, so it always shows a custom plan."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

import asyncpg

from cronlock.pg import AsyncpgStatement

__all__ = ["PLAN_MODES", "plan_of"]

PLAN_MODES = ("force_custom_plan", "force_generic_plan")


def _element(value: Any) -> str:
    if value is None:
        return "NULL"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def _literal(value: Any) -> str:
    """``value`` as an SQL literal of unknown type (the prepared statement gives it one)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        text = "{" + ",".join(_element(item) for item in value) + "}"
    elif isinstance(value, str | uuid.UUID | datetime):
        text = str(value)
    else:
        raise TypeError(f"no literal for {value!r}")
    return "'" + text.replace("'", "''") + "'"


async def plan_of(
    raw: asyncpg.Connection, statement: AsyncpgStatement, args: list[Any], mode: str
) -> dict[str, Any]:
    """The top plan node of ``statement`` with ``args`` under plan_cache_mode ``mode``."""
    name = f"plan_{uuid.uuid4().hex[:12]}"
    await raw.execute(f"SET plan_cache_mode = {mode}")
    await raw.execute(f"PREPARE {name} AS {statement.sql}")
    try:
        values = ", ".join(_literal(arg) for arg in args)
        document = await raw.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE {name}({values})")
    finally:
        await raw.execute(f"DEALLOCATE {name}")
        await raw.execute("RESET plan_cache_mode")
    parsed = json.loads(document) if isinstance(document, str) else document
    plan: dict[str, Any] = parsed[0]["Plan"]
    return plan
