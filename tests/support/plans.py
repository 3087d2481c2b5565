"""A statement's plan as a prepared statement gets it: custom (planned for the values given)
or generic (planned for no values: what PostgreSQL may keep from a prepared statement's sixth
run on). The statement is prepared with SQL's PREPARE and explained as an EXECUTE with the
values written as literals (benchmarks/plans.py says why, and writes them)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg

from benchmarks.plans import literal
from cronlock.pg import AsyncpgStatement

__all__ = ["PLAN_MODES", "plan_of"]

PLAN_MODES = ("force_custom_plan", "force_generic_plan")


async def plan_of(
    raw: asyncpg.Connection, statement: AsyncpgStatement, args: list[Any], mode: str
) -> dict[str, Any]:
    """The top plan node of ``statement`` with ``args`` under plan_cache_mode ``mode``."""
    name = f"plan_{uuid.uuid4().hex[:12]}"
    await raw.execute(f"SET plan_cache_mode = {mode}")
    await raw.execute(f"PREPARE {name} AS {statement.sql}")
    try:
        values = ", ".join(literal(arg) for arg in args)
        document = await raw.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE {name}({values})")
    finally:
        await raw.execute(f"DEALLOCATE {name}")
        await raw.execute("RESET plan_cache_mode")
    parsed = json.loads(document) if isinstance(document, str) else document
    plan: dict[str, Any] = parsed[0]["Plan"]
    return plan
