"""What typed payloads cost at enqueue: ``enqueue_many`` of N plain dicts beside N typed ones.

    python -m benchmarks.typed_enqueue [--server URL] [--n 10000] [--rounds 5] [--check-rounds 20]

One scratch database, one app with an untyped job type and two typed ones (a pydantic model
and a dataclass of the same five fields). Every round runs each way once, each round starting
one way further on, so the ways are interleaved and share the machine's moods; before each
the jobs table is emptied (TRUNCATE), so each inserts into the same empty table. A way is one
``App.enqueue_many`` call of N payloads, committed, timed on the client's clock and its CPU
(``time.process_time``); the payloads (dicts, or instances built from them) are made before
the clock starts: building a model is the caller's work, checking it is cronlock's. They are
built once and frozen out of the garbage collector's sight (``gc.freeze``), and a collection
runs before each way, so that no way pays for another's objects. Each way's overhead is
given twice: its median against the dicts' median, and the median of its ratio to the dicts
of the same round (paired). Then the checks alone, ``enqueue.prepare`` of the same N payloads
without a database, in ``--check-rounds`` interleaved rounds: what a way's checks add over
the dicts' own, as a share of the dicts' whole ``enqueue_many``, is the validation's cost
with the server's noise (which dominates the end-to-end spread on a shared machine) left
out.

- ``dicts (untyped)``: the baseline, a job type without a model.
- ``pydantic instances`` / ``pydantic dicts``: ``payload=`` a pydantic model, given instances
  (dumped, then their JSON validated) or dicts (encoded, then validated).
- ``dataclass instances`` / ``dataclass dicts``: ``payload=`` a dataclass.

The JSON result is written under ``benchmarks/results/`` (``typed-enqueue-<time>.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pydantic
from sqlalchemy import text

import cronlock
from cronlock import schema
from cronlock.queue.enqueue import prepare

from .run import DEFAULT_SERVER, write_check
from .scratch import scratch_database

__all__ = ["main", "measure"]


class EmailModel(pydantic.BaseModel):
    to: str
    subject: str
    body: str = ""
    user_id: int
    tags: list[str] = []


@dataclass
class EmailData:
    to: str
    subject: str
    user_id: int
    body: str = ""
    tags: list[str] = field(default_factory=list)


def _payload(i: int) -> dict[str, Any]:
    return {
        "to": f"user{i}@example.com",
        "subject": "Welcome aboard",
        "body": "Hello, and thanks for signing up. Your account is ready.",
        "user_id": 100_000 + i,
        "tags": ["welcome", "onboarding"],
    }


BASELINE = "dicts (untyped)"
# Each way: its job type and how its N payloads are made (before the clock starts).
WAYS: dict[str, tuple[str, Callable[[dict[str, Any]], Any]]] = {
    BASELINE: ("plain", dict),
    "pydantic instances": ("pydantic", lambda p: EmailModel(**p)),
    "pydantic dicts": ("pydantic", dict),
    "dataclass instances": ("dataclass", lambda p: EmailData(**p)),
    "dataclass dicts": ("dataclass", dict),
}


async def measure(server: str, n: int, rounds: int, check_rounds: int) -> dict[str, Any]:
    raw = [_payload(i) for i in range(n)]
    async with scratch_database(server, "typed_enqueue") as url:
        app = cronlock.App()

        async def handler(_session: object, _payload: object) -> None:
            return None

        app.job("plain")(handler)
        app.job("pydantic", payload=EmailModel)(handler)
        app.job("dataclass", payload=EmailData)(handler)
        database = app.use_database(url)
        await schema.upgrade(database)
        made = {name: [make(p) for p in raw] for name, (_, make) in WAYS.items()}
        # The 50,000 payloads live through the run: out of the collector's sight, so that
        # no way pays for collections that traverse the others' payloads.
        gc.collect()
        gc.freeze()
        wall: dict[str, list[float]] = {name: [] for name in WAYS}
        cpu: dict[str, list[float]] = {name: [] for name in WAYS}
        checks: dict[str, list[float]] = {name: [] for name in WAYS}
        try:
            names = list(WAYS)
            for round_ in range(rounds + 1):  # the first round warms up, uncounted
                # Each round starts one way further on: no way always runs first or last.
                turn = round_ % len(names)
                for name in names[turn:] + names[:turn]:
                    job_type, payloads = WAYS[name][0], made[name]
                    async with database.engine.begin() as conn:
                        await conn.execute(text("TRUNCATE cronlock.jobs"))
                    gc.collect()  # the previous way's garbage is not this one's to collect
                    started, began = time.perf_counter(), time.process_time()
                    answers = await app.enqueue_many(job_type, payloads)
                    elapsed, used = time.perf_counter() - started, time.process_time() - began
                    assert len(answers) == n
                    if round_:
                        wall[name].append(elapsed * 1e3)
                        cpu[name].append(used / n * 1e6)
            # The checks alone are the client's CPU only: many short interleaved rounds.
            for round_ in range(check_rounds):
                turn = round_ % len(names)
                for name in names[turn:] + names[:turn]:
                    gc.collect()
                    started = time.perf_counter()
                    prepare(app.job_types, WAYS[name][0], made[name])
                    checks[name].append((time.perf_counter() - started) * 1e3)
        finally:
            await app.aclose()
            gc.unfreeze()
    dicts, dict_checks = wall[BASELINE], statistics.median(checks[BASELINE])
    return {
        name: {
            "wall_ms": _spread(wall[name]),
            "client_cpu_us_per_job": _spread(cpu[name]),
            "prepare_ms": _spread(checks[name]),
            "overhead_vs_dicts": statistics.median(wall[name]) / statistics.median(dicts) - 1,
            # Round by round against the dicts of the same round (the machine's moods are
            # shared within a round), then the median of those.
            "paired_overhead_vs_dicts": statistics.median(
                way / base - 1 for way, base in zip(wall[name], dicts, strict=True)
            ),
            # What the checks add (their median over the dicts' own), as a share of the dicts'
            # whole enqueue_many: the validation's cost without the server's noise in it.
            "checks_share_of_enqueue": (statistics.median(checks[name]) - dict_checks)
            / statistics.median(dicts),
        }
        for name in WAYS
    }


def _spread(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": values,
    }


def _table(results: dict[str, Any]) -> str:
    lines = [
        "| way | enqueue_many, ms | vs dicts: medians, paired | client CPU µs/job "
        "| checks alone (prepare), ms | checks added / enqueue_many |",
        "|---|---|---|---|---|---|",
    ]
    for name, figures in results.items():
        wall, cpu, checks = (
            figures["wall_ms"],
            figures["client_cpu_us_per_job"],
            figures["prepare_ms"],
        )
        lines.append(
            f"| {name} | {wall['median']:,.0f} ({wall['min']:,.0f}..{wall['max']:,.0f}) "
            f"| {figures['overhead_vs_dicts']:+.1%}, {figures['paired_overhead_vs_dicts']:+.1%} "
            f"| {cpu['median']:,.1f} ({cpu['min']:,.1f}..{cpu['max']:,.1f}) "
            f"| {checks['median']:,.0f} ({checks['min']:,.0f}..{checks['max']:,.0f}) "
            f"| {figures['checks_share_of_enqueue']:+.1%} |"
        )
    return "\n".join(lines)


async def _main(args: argparse.Namespace) -> None:
    started = datetime.now(UTC)
    results = await measure(args.server, args.n, args.rounds, args.check_rounds)
    print(_table(results))
    out = await write_check(
        "typed-enqueue",
        started,
        args.server,
        {
            "n": args.n,
            "rounds": args.rounds,
            "check_rounds": args.check_rounds,
            "python": platform.python_version(),
            "pydantic": pydantic.VERSION,
            "ways": results,
        },
    )
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--server", default=DEFAULT_SERVER)
    parser.add_argument("--n", type=int, default=10_000, help="payloads per enqueue_many")
    parser.add_argument("--rounds", type=int, default=5, help="counted rounds (one more warms up)")
    parser.add_argument("--check-rounds", type=int, default=20, help="rounds of the checks alone")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
