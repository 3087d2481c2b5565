"""Worker memory while draining 100,000 jobs: is it flat? Is DrainStats' histogram bounded?

    python -m benchmarks.drain_memory [--server URL] [--n 100000] [--strict-n 20000]

For each commit mode a scratch database gets cronlock's schema and N no-op jobs (enqueued by
this process with ``enqueue_many``). A child process (``python -m benchmarks.drain_memory
--child``) then drains them with ``App.drain(commit_mode=…)``, the drain ``cronlock drain
--commit-mode …`` runs, and samples itself every 0.25 s: its RSS (``VmRSS`` in
/proc/self/status), the jobs done (``DrainStats``) and the number of buckets in DrainStats'
two latency histograms. The parent reports the RSS at the first samples past 10%, 50% and the
end of the run (10k, 50k and 100k jobs for N = 100,000), the growth from 10% to the end, and
the most buckets seen. Strict mode commits one job per transaction (~800 jobs/s here), so it
drains ``--strict-n`` jobs (20,000 by default) to keep the run short; the milestones scale.
The JSON result is written under ``benchmarks/results/`` (``drain-memory-<time>.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import cronlock
from cronlock import schema

from .run import DEFAULT_SERVER, write_check
from .scratch import scratch_database

__all__ = ["app", "main", "milestones"]

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_EVERY_S = 0.25
CHUNK = 10_000

app = cronlock.App()


@app.job("noop")
async def noop(_session: object, _payload: object) -> None:
    return None


def rss_kib() -> int:
    """This process's resident set size (VmRSS), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


async def _child(url: str, mode: str) -> None:
    """Drain every due job, printing one JSON sample per line, then the drain's report."""
    app.use_database(url)
    drainer = app.drainer(commit_mode=mode)
    started = time.monotonic()

    def sample() -> dict[str, Any]:
        stats = getattr(drainer, "stats", None)
        return {
            "t": round(time.monotonic() - started, 3),
            "done": stats.attempts if stats is not None else 0,
            "rss_kib": rss_kib(),
            "buckets": (len(stats.run_time.buckets) + len(stats.end_to_end.buckets))
            if stats is not None
            else 0,
        }

    async def sampler() -> None:
        while True:
            print(json.dumps(sample()), flush=True)
            await asyncio.sleep(SAMPLE_EVERY_S)

    sampling = asyncio.create_task(sampler())
    try:
        result = await drainer.drain()
        sampling.cancel()
        print(json.dumps(sample()), flush=True)  # the end: drained, pool still open
    finally:
        sampling.cancel()
        await app.aclose()
    print(json.dumps({"report": result.stats, "status": result.status.value}), flush=True)


async def _seed(url: str, n: int) -> float:
    seeder = cronlock.App()
    seeder.job("noop")(noop)
    database = seeder.use_database(url)
    await schema.upgrade(database)
    started = time.perf_counter()
    try:
        for first in range(0, n, CHUNK):
            count = min(CHUNK, n - first)
            async with database.engine.begin() as conn:
                await seeder.enqueue_many_tx(conn, "noop", [{}] * count)
    finally:
        await seeder.aclose()
    return time.perf_counter() - started


def milestones(samples: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """RSS at the first samples past 10% and 50% of ``n`` and at the end; growth; buckets."""
    marks: dict[str, Any] = {}
    for fraction in (0.1, 0.5):
        at = next((s for s in samples if s["done"] >= fraction * n), samples[-1])
        marks[f"{fraction:.0%}"] = {"done": at["done"], "rss_kib": at["rss_kib"]}
    marks["end"] = {"done": samples[-1]["done"], "rss_kib": samples[-1]["rss_kib"]}
    return {
        "milestones": marks,
        "growth_10pct_to_end_kib": marks["end"]["rss_kib"] - marks["10%"]["rss_kib"],
        "start_rss_kib": samples[0]["rss_kib"],
        "max_rss_kib": max(s["rss_kib"] for s in samples),
        "max_buckets": max(s["buckets"] for s in samples),
    }


async def _drain(server: str, mode: str, n: int) -> dict[str, Any]:
    async with scratch_database(server, "drain_memory") as url:
        seed_s = await _seed(url, n)
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "benchmarks.drain_memory",
            "--child",
            url,
            mode,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"the {mode} drain exited {child.returncode}")
    lines = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    report = lines.pop()
    if report["status"] != "completed" or lines[-1]["done"] != n:
        raise RuntimeError(f"the {mode} drain did not finish its {n} jobs: {report}")
    return {
        "mode": mode,
        "n": n,
        "seed_s": seed_s,
        **milestones(lines, n),
        "report": report["report"],
        "samples": lines,
    }


def _summary(run: dict[str, Any]) -> str:
    marks = run["milestones"]
    cells = ", ".join(
        f"{name} ({mark['done']:,} jobs) {mark['rss_kib'] / 1024:.1f} MiB"
        for name, mark in marks.items()
    )
    return (
        f"{run['mode']}, {run['n']:,} jobs: RSS at {cells}; growth from 10% to the end "
        f"{run['growth_10pct_to_end_kib']:+,} KiB; max {run['max_rss_kib'] / 1024:.1f} MiB; "
        f"histogram buckets at most {run['max_buckets']}; "
        f"{run['report'].get('throughput_per_sec')} jobs/s"
    )


async def _main(args: argparse.Namespace) -> None:
    started = datetime.now(UTC)
    runs = [
        await _drain(args.server, "batch", args.n),
        await _drain(args.server, "strict", args.strict_n),
    ]
    for run in runs:
        print(_summary(run))
    out = await write_check(
        "drain-memory", started, args.server, {"sample_every_s": SAMPLE_EVERY_S, "runs": runs}
    )
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", default=DEFAULT_SERVER)
    parser.add_argument("--n", type=int, default=100_000, help="jobs drained in batch mode")
    parser.add_argument("--strict-n", type=int, default=20_000, help="jobs drained strictly")
    parser.add_argument("--child", nargs=2, metavar=("URL", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(_child(*args.child))
    else:
        asyncio.run(_main(args))


if __name__ == "__main__":
    main()
