"""The lease mode on no-op jobs, batched, beside PgQueuer tuned and cronlock's strict and batch.

    python -m benchmarks.lease_drain [--server URL] [--n 10000] [--rounds 5]
        [--variants strict,batch,lease:50,lease:500,pgqueuer:100,pgqueuer:500,pgqueuer:1000]

The harness's drain workload (``benchmarks.agent drain``, as ``benchmarks.run`` runs it): per
run a fresh agent process on a fresh scratch database enqueues N no-op jobs in bulk and drains
them with one worker; jobs/s is N over the window from the first claim to the last
completion, both read from the system's own tables. Here the variants take turns, round by
round, so a noisy neighbour on the shared machine hits every one alike. ``lease:B`` is
cronlock's lease commit mode with ``batch_size`` B (claims of B jobs, committed; the no-op
handlers leave their sessions untouched, so their completions are written in one statement
per batch); ``pgqueuer:B`` is PgQueuer's ``QueueManager.run(batch_size=B)``, and its *tuned*
figure is the best of its medians in this run (the harness's sweep). The JSON result goes under
``benchmarks/results/`` (``lease-drain-<time>``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import UTC, datetime
from typing import Any

from .run import DEFAULT_SERVER, Runner, Variant, machine, summarise, versions, write_check

__all__ = ["main", "measure", "variant"]

DEFAULT_VARIANTS = "strict,batch,lease:50,lease:500,pgqueuer:100,pgqueuer:500,pgqueuer:1000"


def variant(spec: str) -> Variant:
    """``strict``, ``batch[:B]``, ``lease[:B]``, ``pgqueuer:B`` as the harness's Variant."""
    name, _, size = spec.partition(":")
    if name == "pgqueuer":
        return Variant("pgqueuer", f"batch_size={size}", {"batch_size": int(size)})
    if name not in ("strict", "batch", "lease"):
        raise SystemExit(f"unknown variant {spec!r}")
    options: dict[str, Any] = {"commit_mode": name}
    if size:
        options["batch_size"] = int(size)
    return Variant("cronlock", spec, options)


async def measure(
    runner: Runner, variants: list[Variant], n: int, rounds: int
) -> dict[str, dict[str, Any]]:
    entries: dict[str, dict[str, Any]] = {
        v.key: {"system": v.system, "label": v.label, "options": v.options, "runs": []}
        for v in variants
    }
    errors: dict[str, list[str]] = {v.key: [] for v in variants}
    for round_ in range(1, rounds + 1):
        for v in variants:
            try:
                run = await runner.agent("drain", v, "--n", str(n))
            except RuntimeError as exc:
                errors[v.key].append(str(exc))
                print(f"round {round_} {v.key:28} FAILED {exc}", flush=True)
                continue
            entries[v.key]["runs"].append(run)
            print(f"round {round_} {v.key:28} {run['jobs_per_s']:10,.0f} jobs/s", flush=True)
    for key, entry in entries.items():
        entry["summary"] = summarise(entry["runs"])
        entry["errors"] = errors[key]
    return entries


def _tuned(entries: dict[str, dict[str, Any]]) -> str | None:
    peers = [k for k, e in entries.items() if e["system"] == "pgqueuer" and e["summary"]]
    return max(peers, key=lambda k: entries[k]["summary"]["jobs_per_s"]["median"], default=None)


def _report(entries: dict[str, dict[str, Any]], tuned: str | None) -> str:
    lines = [f"{'variant':28} {'median jobs/s':>14}  (min..max)          p95 ms"]
    for key, entry in entries.items():
        if not entry["summary"]:
            lines.append(f"{key:28} {'failed':>14}")
            continue
        rate = entry["summary"]["jobs_per_s"]
        p95 = entry["summary"].get("p95_ms", {}).get("median")
        mark = "  <- pgqueuer tuned" if key == tuned else ""
        lines.append(
            f"{key:28} {rate['median']:14,.0f}  ({rate['min']:,.0f}..{rate['max']:,.0f})"
            f"  {p95 if p95 is None else round(p95, 1)}{mark}"
        )
    return "\n".join(lines)


async def _main(args: argparse.Namespace) -> None:
    started = datetime.now(UTC)
    variants = [variant(spec) for spec in args.variants.split(",")]
    runner = Runner(args.server, py312=None, log=False, prefix="lease_drain")
    load_start = os.getloadavg()
    entries = await measure(runner, variants, args.n, args.rounds)
    tuned = _tuned(entries)
    print(_report(entries, tuned))
    if args.no_write:
        return
    fields = {
        "command": "python -m benchmarks.lease_drain " + " ".join(args.argv),
        "n": args.n,
        "rounds": args.rounds,
        "machine": machine(),
        "versions": versions(None),
        "load_at_start": load_start,
        "load_at_end": os.getloadavg(),
        "pgqueuer_tuned": tuned,
        "entries": entries,
    }
    out = await write_check("lease-drain", started, args.server, fields)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--server", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_SERVER))
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--no-write", action="store_true", help="print only (tests)")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
