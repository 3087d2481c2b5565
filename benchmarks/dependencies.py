"""What job dependencies cost: a chain against independent jobs, a fan-in, and the enqueue.

    python -m benchmarks.dependencies [--server URL] [--chain 1000] [--fan-in 10000] [--rounds 3]

One scratch database and one app with a no-op job type. Each round, each case once (the
jobs table emptied before each, TRUNCATE), interleaved so the cases share the machine's moods:

- ``independent``: ``--chain`` jobs enqueued with one ``enqueue_many``, then drained in the
  strict mode (one lane); the drain is timed.
- ``chain``: ``--chain`` jobs, each enqueued with ``depends_on=[the one before]`` (one
  ``enqueue`` each, timed apart), then drained the same way: each job becomes due only when
  the one before it committed (issue 25 asks for ≥ 50 % of the independent rate).
- ``fan-in``: ``--fan-in`` parents (one ``enqueue_many``) and one child depending on all of
  them (its enqueue timed), drained in the batch mode (50 per transaction), beside
  ``fan-in baseline``: the same parents without the child. The child must run once, after
  every parent completed, and no edge may be left.
- ``enqueue``: 300 single enqueues with ``depends_on=[one completed parent]`` against 300
  without (medians of each call's wall time).

The JSON result is written under ``benchmarks/results/`` (``dependencies-<time>.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text

import cronlock
from cronlock import schema

from .run import DEFAULT_SERVER, write_check
from .scratch import scratch_database

__all__ = ["main", "measure"]

_ENQUEUES = 300


async def _empty(app: cronlock.App) -> None:
    async with app.database.engine.begin() as conn:
        await conn.execute(text("TRUNCATE cronlock.jobs, cronlock.job_dependencies"))


async def _drained(app: cronlock.App, expected: int, **options: Any) -> float:
    started = time.perf_counter()
    result = await app.drain(**options)
    elapsed = time.perf_counter() - started
    assert result.stats["processed"] == expected, result.stats
    return elapsed


async def _independent(app: cronlock.App, n: int) -> dict[str, float]:
    await app.enqueue_many("noop", [{}] * n)
    seconds = await _drained(app, n)
    return {"drain_s": seconds, "jobs_per_s": n / seconds}


async def _chain(app: cronlock.App, n: int) -> dict[str, float]:
    started = time.perf_counter()
    last = await app.enqueue("noop", {})
    for _ in range(n - 1):
        last = await app.enqueue("noop", {}, depends_on=[last])
    enqueued = time.perf_counter() - started
    seconds = await _drained(app, n)
    return {"enqueue_s": enqueued, "drain_s": seconds, "jobs_per_s": n / seconds}


async def _fan_in(app: cronlock.App, n: int, *, child: bool) -> dict[str, float]:
    parents = await app.enqueue_many("noop", [{}] * n)
    figures: dict[str, float] = {}
    if child:
        started = time.perf_counter()
        joined = await app.enqueue("noop", {"join": True}, depends_on=parents)
        figures["child_enqueue_ms"] = (time.perf_counter() - started) * 1e3
    seconds = await _drained(app, n + child, commit_mode="batch", batch_size=50)
    figures |= {"drain_s": seconds, "jobs_per_s": (n + child) / seconds}
    if child:
        async with app.database.connect() as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT c.status, c.parents_left, c.started_at >= "
                        "(SELECT max(completed_at) FROM cronlock.jobs WHERE id <> c.id) AS after, "
                        "(SELECT count(*) FROM cronlock.job_dependencies) AS edges "
                        "FROM cronlock.jobs AS c WHERE c.id = :id"
                    ),
                    {"id": joined.id},
                )
            ).one()
        assert tuple(row) == ("completed", 0, True, 0), row
    return figures


async def _enqueues(app: cronlock.App) -> dict[str, float]:
    parent = await app.enqueue("noop", {})
    await _drained(app, 1)
    plain, dependent = [], []
    for _ in range(_ENQUEUES):
        started = time.perf_counter()
        await app.enqueue("noop", {})
        plain.append(time.perf_counter() - started)
        started = time.perf_counter()
        await app.enqueue("noop", {}, depends_on=[parent])
        dependent.append(time.perf_counter() - started)
    return {
        "plain_ms": statistics.median(plain) * 1e3,
        "depends_on_ms": statistics.median(dependent) * 1e3,
    }


async def measure(server: str, chain: int, fan_in: int, rounds: int) -> dict[str, Any]:
    async with scratch_database(server, "dependencies") as url:
        app = cronlock.App()

        @app.job("noop")
        async def noop(_session: object, _payload: object) -> None:
            return None

        database = app.use_database(url)
        await schema.upgrade(database)
        cases = {
            "independent": lambda: _independent(app, chain),
            "chain": lambda: _chain(app, chain),
            "fan-in": lambda: _fan_in(app, fan_in, child=True),
            "fan-in baseline": lambda: _fan_in(app, fan_in, child=False),
            "enqueue": lambda: _enqueues(app),
        }
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
        names = list(cases)
        try:
            for round_ in range(rounds):
                turn = round_ % len(names)
                for name in names[turn:] + names[:turn]:
                    await _empty(app)
                    runs[name].append(await cases[name]())
        finally:
            await app.aclose()
    medians = {
        name: {key: statistics.median(run[key] for run in found) for key in found[0]}
        for name, found in runs.items()
    }
    return {
        "medians": medians,
        "chain_vs_independent": medians["chain"]["jobs_per_s"]
        / medians["independent"]["jobs_per_s"],
        "fan_in_vs_baseline": medians["fan-in"]["jobs_per_s"]
        / medians["fan-in baseline"]["jobs_per_s"],
        "runs": runs,
    }


async def _main(args: argparse.Namespace) -> None:
    started = datetime.now(UTC)
    results = await measure(args.server, args.chain, args.fan_in, args.rounds)
    for name, figures in results["medians"].items():
        shown = ", ".join(f"{key} {value:,.2f}" for key, value in figures.items())
        print(f"{name}: {shown}")
    print(f"chain / independent: {results['chain_vs_independent']:.0%}")
    print(f"fan-in / baseline: {results['fan_in_vs_baseline']:.0%}")
    out = await write_check(
        "dependencies",
        started,
        args.server,
        {
            "chain": args.chain,
            "fan_in": args.fan_in,
            "rounds": args.rounds,
            "python": platform.python_version(),
            **results,
        },
    )
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--server", default=DEFAULT_SERVER)
    parser.add_argument("--chain", type=int, default=1000, help="jobs in the chain")
    parser.add_argument("--fan-in", type=int, default=10_000, help="parents of the one child")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every case")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
