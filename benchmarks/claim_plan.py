"""The drainer's claim with 1,000,000 completed rows kept in ``jobs``: is its plan unchanged?

    python -m benchmarks.claim_plan [--server URL] [--rows 1000000] [--waiting 1000]

A scratch database gets cronlock's schema and ``--waiting`` due jobs; the claim is explained
and timed; then ``--rows`` completed jobs (older than the waiting ones, so an index on the
claim's order without the partial predicate would meet them first) are added with one
``generate_series`` INSERT, the table is ANALYZEd, and the claim is explained and timed again.
The claim is ``sql.JOB_CLAIM`` compiled as the drainer compiles it
(``AsyncpgStatement``) and run with the drainer's arguments, for the batch mode's limit
(50) and strict mode's (1), each as a custom plan (a prepared statement's first executions)
and as the generic plan (what it may switch to after five). Every EXPLAIN (ANALYZE, BUFFERS)
and every timed claim runs in a transaction that is rolled back, so the claimed rows stay due.

It prints each plan and a summary: the plan's shape (node types, relation, index) before and
after, whether it is the same, and the claim's execution time (EXPLAIN ANALYZE's, and the
median of ``--repeats`` claims timed on the client). The JSON result is written under
``benchmarks/results/`` (``claim-plan-<time>.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from datetime import UTC, datetime
from typing import Any

import asyncpg

from cronlock import schema, sql
from cronlock.database import Database
from cronlock.pg import AsyncpgStatement

from .plans import literal
from .run import DEFAULT_SERVER, write_check
from .scratch import scratch_database

__all__ = ["main", "measure", "shape"]

# Benchmark data, not cronlock's SQL: the waiting jobs due a minute ago, the completed ones a
# day older, all in the default queue.
SEED_WAITING = """
INSERT INTO cronlock.jobs (job_type, payload, status, run_at, created_at)
SELECT 'noop', '{}', 'pending', now() - interval '1 minute', now() - interval '1 minute'
FROM generate_series(1, $1::integer)
"""
SEED_COMPLETED = """
INSERT INTO cronlock.jobs
    (job_type, payload, status, run_at, created_at, started_at, completed_at, result)
SELECT 'noop', '{}', 'completed', t, t, t, t + interval '1 millisecond', 'null'
FROM (SELECT now() - interval '1 day' - i * interval '1 millisecond' AS t
      FROM generate_series(1, $1::integer) AS i) AS s
"""
ANALYZE = "ANALYZE cronlock.jobs"
TABLE_SIZE = "SELECT pg_total_relation_size('cronlock.jobs'), count(*) FROM cronlock.jobs"
LIMITS = {"batch": 50, "strict": 1}
PLAN_MODES = ("force_custom_plan", "force_generic_plan")


def shape(plan: dict[str, Any]) -> list[str]:
    """The plan's nodes in tree order, each as its type with the relation and index it reads."""
    node = plan.get("Plan", plan)
    label = node["Node Type"]
    if "Relation Name" in node:
        label += f" on {node['Relation Name']}"
    if "Index Name" in node:
        label += f" using {node['Index Name']}"
    if "Filter" in node:
        label += " (filter)"
    return [label] + [part for child in node.get("Plans", []) for part in shape(child)]


async def _explain(
    conn: Any, claim: AsyncpgStatement, args: list[Any], mode: str
) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of the claim as a prepared statement under ``mode``."""
    execute = f"EXECUTE bench_claim({', '.join(literal(arg) for arg in args)})"
    await conn.execute(f"SET plan_cache_mode = {mode}")
    await conn.execute("PREPARE bench_claim AS " + claim.sql)
    try:
        explained = []
        for options in ("ANALYZE, BUFFERS, FORMAT JSON", "ANALYZE, BUFFERS"):
            transaction = conn.transaction()
            await transaction.start()
            try:
                explained.append(await conn.fetch(f"EXPLAIN ({options}) {execute}"))
            finally:
                await transaction.rollback()
    finally:
        await conn.execute("DEALLOCATE bench_claim")
        await conn.execute("RESET plan_cache_mode")
    as_json, as_text = explained
    [document] = json.loads(as_json[0][0])
    return {
        "shape": shape(document),
        "execution_ms": document["Execution Time"],
        "planning_ms": document.get("Planning Time"),
        "text": "\n".join(row[0] for row in as_text),
    }


async def _timed(conn: Any, claim: AsyncpgStatement, args: list[Any], repeats: int) -> float:
    """The median wall time (ms) of the claim as the drainer sends it, prepared, rolled back."""
    statement = await conn.prepare(claim.sql)
    times = []
    for _ in range(repeats):
        transaction = conn.transaction()
        await transaction.start()
        try:
            started = time.perf_counter()
            rows = await statement.fetch(*args)
            times.append((time.perf_counter() - started) * 1000)
        finally:
            await transaction.rollback()
        if not rows:
            raise RuntimeError("the claim found no due job")
    return statistics.median(times)


async def _state(conn: Any, claim: AsyncpgStatement, repeats: int) -> dict[str, Any]:
    size, rows = await conn.fetchrow(TABLE_SIZE)
    plans: dict[str, Any] = {"table_rows": rows, "table_bytes": size}
    for mode_name, limit in LIMITS.items():
        args = claim.args(queue="default", limit=limit, now=None)
        for plan_mode in PLAN_MODES:
            key = f"{mode_name} (limit {limit}), {plan_mode.removeprefix('force_')}"
            plans[key] = await _explain(conn, claim, args, plan_mode)
        plans[f"{mode_name} (limit {limit}), client median ms"] = await _timed(
            conn, claim, args, repeats
        )
    return plans


async def measure(server: str, completed: int, waiting: int, repeats: int) -> dict[str, Any]:
    async with scratch_database(server, "claim_plan") as url:
        database = Database(url)
        try:
            await schema.upgrade(database)
        finally:
            await database.dispose()
        claim = AsyncpgStatement.of(sql.JOB_CLAIM, database.schema)
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(SEED_WAITING, waiting)
            await conn.execute(ANALYZE)
            before = await _state(conn, claim, repeats)
            started = time.perf_counter()
            await conn.execute(SEED_COMPLETED, completed)
            await conn.execute(ANALYZE)
            seeded_s = time.perf_counter() - started
            after = await _state(conn, claim, repeats)
        finally:
            await conn.close()
    return {"sql": claim.sql, "seed_completed_s": seeded_s, "before": before, "after": after}


def _compare(results: dict[str, Any]) -> list[dict[str, Any]]:
    before, after = results["before"], results["after"]
    rows = []
    for key, plan in before.items():
        if not isinstance(plan, dict):
            continue
        rows.append(
            {
                "claim": key,
                "same_shape": plan["shape"] == after[key]["shape"],
                "shape_before": plan["shape"],
                "shape_after": after[key]["shape"],
                "execution_ms_before": plan["execution_ms"],
                "execution_ms_after": after[key]["execution_ms"],
            }
        )
    return rows


def _report(results: dict[str, Any], completed: int, waiting: int) -> str:
    lines = [f"claim: {results['sql']}", ""]
    for state, label in (("before", "no completed rows"), ("after", f"{completed:,} completed")):
        figures = results[state]
        lines.append(
            f"== {waiting:,} waiting, {label}: {figures['table_rows']:,} rows, "
            f"{figures['table_bytes'] / 2**20:,.1f} MiB"
        )
        for key, plan in figures.items():
            if isinstance(plan, dict):
                lines += [f"-- {key}", plan["text"], ""]
    lines.append("| claim | same plan shape | execution ms before | after | shape after |")
    lines.append("|---|---|---|---|---|")
    for row in results["comparison"]:
        lines.append(
            f"| {row['claim']} | {'yes' if row['same_shape'] else '**no**'} "
            f"| {row['execution_ms_before']:.3f} | {row['execution_ms_after']:.3f} "
            f"| {' > '.join(row['shape_after'])} |"
        )
    for mode_name, limit in LIMITS.items():
        key = f"{mode_name} (limit {limit}), client median ms"
        lines.append(
            f"claim {mode_name} (limit {limit}), median on the client: "
            f"{results['before'][key]:.3f} ms before, {results['after'][key]:.3f} ms after"
        )
    return "\n".join(lines)


async def _main(args: argparse.Namespace) -> None:
    started = datetime.now(UTC)
    results = await measure(args.server, args.rows, args.waiting, args.repeats)
    results["comparison"] = _compare(results)
    print(_report(results, args.rows, args.waiting))
    same_shape = all(row["same_shape"] for row in results["comparison"])
    fields = {
        "completed_rows": args.rows,
        "waiting_rows": args.waiting,
        "repeats": args.repeats,
        **results,
        "same_shape": same_shape,
    }
    out = await write_check("claim-plan", started, args.server, fields)
    print(f"plan shape unchanged: {'yes' if same_shape else 'NO'}; wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", default=DEFAULT_SERVER)
    parser.add_argument("--rows", type=int, default=1_000_000, help="completed rows added")
    parser.add_argument("--waiting", type=int, default=1000, help="due jobs")
    parser.add_argument("--repeats", type=int, default=21, help="timed claims per case")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
