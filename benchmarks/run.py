"""One command for the whole comparison: ``python -m benchmarks.run [--quick] [--full]``.

For every system (raw asyncpg baselines, cronlock, procrastinate, pgqueuer, oban-py) and every
workload it runs each measurement ``--repeats`` times, each time in a fresh agent process on a
fresh scratch database, and keeps every run plus its median and min..max. Peers are measured
with their default settings and with the best of a small sweep of their documented
throughput knob (procrastinate ``concurrency``, pgqueuer ``batch_size``, oban queue ``limit``);
the sweep's own figures are kept too. oban-py needs Python >= 3.12: its agent runs under
``--python312`` (a 3.12 virtualenv with ``pip install '.[bench]'``). The result is one JSON file
under ``benchmarks/results/``; ``python -m benchmarks.report`` turns it into BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import asyncpg

from .scratch import scratch_database
from .stats import spread

__all__ = ["Plan", "main", "plan_for"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_SERVER = "postgresql://root@127.0.0.1:5432/postgres"
DEFAULT_PY312 = ROOT / ".venv-bench312" / "bin" / "python"
PG_SETTINGS = (
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_sync_method",
    "commit_delay",
    "shared_buffers",
    "work_mem",
    "max_wal_size",
    "checkpoint_timeout",
    "wal_level",
    "max_connections",
    "jit",
)
PEER_PACKAGES = ("procrastinate", "pgqueuer", "psycopg", "asyncpg", "sqlalchemy", "cronlock")

# A 100,000-job drain of a peer is skipped (and said so) when it would take longer than this.
BIG_N_BUDGET_S = 240

# Each peer's documented throughput knob, swept around the value issue 5 names.
SWEEPS: dict[str, tuple[str, list[int]]] = {
    "procrastinate": ("concurrency", [5, 10, 20]),
    "pgqueuer": ("batch_size", [100, 500, 1000]),
    "oban": ("limit", [50, 100, 200]),
    "cronlock-batch": ("batch_size", [200, 500]),
}


@dataclass(frozen=True)
class Variant:
    """A system with one set of options, under a short label for the tables."""

    system: str
    label: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.system}:{self.label}"


@dataclass
class Plan:
    """What one invocation measures."""

    drain_ns: list[int]
    big_n: int | None  # 100,000 (--full): measured for baselines, cronlock and tuned peers
    sweep_n: int
    repeats: int
    enqueue_bulk: int
    enqueue_single: int
    rates: list[float]
    latency_seconds: float
    recovery_repeats: int
    savepoint_items: int
    systems: list[str]


def plan_for(args: argparse.Namespace) -> Plan:
    quick = bool(args.quick)
    return Plan(
        drain_ns=[100, 1000] if quick else [100, 1000, 10_000],
        big_n=100_000 if args.full else None,
        sweep_n=1000 if quick else 10_000,
        repeats=args.repeats,
        enqueue_bulk=1000 if quick else 10_000,
        enqueue_single=200 if quick else 1000,
        rates=[50.0, 500.0],
        latency_seconds=2.0 if quick else 10.0,
        recovery_repeats=3 if quick else 10,
        savepoint_items=1000 if quick else 10_000,
        systems=args.systems,
    )


class Runner:
    """Runs agents, one scratch database each, and collects their JSON."""

    def __init__(
        self, server: str, py312: Path | None, log: bool = True, prefix: str = "bench"
    ) -> None:
        self.server = server
        self.py312 = py312
        self.log = log
        self.prefix = prefix  # of the scratch databases' names

    def interpreter(self, system: str) -> str:
        if system == "oban":
            if self.py312 is None or not self.py312.exists():
                raise RuntimeError(
                    "oban-py needs Python >= 3.12: create a virtualenv with "
                    "`pip install '.[bench]'` under Python 3.12 and pass --python312"
                )
            return str(self.py312)
        return sys.executable

    async def agent(self, workload: str, variant: Variant, *extra: str) -> dict[str, Any]:
        """One run of ``workload`` on a fresh scratch database."""
        async with scratch_database(self.server, self.prefix) as url:
            argv = [
                self.interpreter(variant.system),
                "-m",
                "benchmarks.agent",
                workload,
                variant.system,
                url,
                json.dumps(variant.options),
                *extra,
            ]
            # The cwd is neutral so that ``-m`` does not put this checkout's cronlock first.
            env = {**os.environ, "PYTHONPATH": _agent_path()}
            load_before = os.getloadavg()[0]
            process = await asyncio.create_subprocess_exec(
                *argv,
                cwd=tempfile.gettempdir(),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            out, err = await process.communicate()
            if process.returncode != 0:
                tail = err.decode(errors="replace").strip().splitlines()[-3:]
                raise RuntimeError(f"{workload} {variant.key} failed: {' | '.join(tail)}")
            result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
            result["load1_before"] = load_before
            result["database"] = url.rsplit("/", 1)[-1]  # dropped by now; names the run
            return result

    async def repeat(
        self, workload: str, variant: Variant, times: int, *extra: str
    ) -> dict[str, Any]:
        """``times`` runs of one measurement; every run kept, failures recorded."""
        runs: list[dict[str, Any]] = []
        errors: list[str] = []
        for _ in range(times):
            try:
                runs.append(await self.agent(workload, variant, *extra))
            except Exception as exc:
                errors.append(str(exc))
        entry: dict[str, Any] = {
            "workload": workload,
            "system": variant.system,
            "label": variant.label,
            "options": variant.options,
            "args": list(extra),
            "runs": runs,
            "errors": errors,
            "summary": summarise(runs),
        }
        if self.log:
            short = {k: round(v["median"], 1) for k, v in entry["summary"].items()}
            print(
                f"{workload:10} {variant.key:28} {' '.join(extra):22} {short} "
                f"{'ERRORS: ' + errors[0][:200] if errors else ''}",
                flush=True,
            )
        return entry


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median and min..max of every numeric field the runs share."""
    if not runs:
        return {}
    keys = [k for k, v in runs[0].items() if isinstance(v, int | float) and not isinstance(v, bool)]
    return {k: spread([float(r[k]) for r in runs if k in r]) for k in keys}


def baseline_variants() -> list[Variant]:
    return [
        Variant("raw", "per-job tx", {"mode": "strict"}),
        Variant("raw", "batch 500", {"mode": "batch", "batch_size": 500}),
        Variant("raw", "batch 50", {"mode": "batch", "batch_size": 50}),
    ]


def cronlock_variants() -> list[Variant]:
    return [
        Variant("cronlock", "strict", {"commit_mode": "strict"}),
        Variant("cronlock", "batch", {"commit_mode": "batch"}),
    ]


def default_variant(system: str) -> Variant:
    return Variant(system, "default", {})


def sweep_variants(system: str) -> list[Variant]:
    knob, values = SWEEPS[system]
    target = "cronlock" if system == "cronlock-batch" else system
    base = {"commit_mode": "batch"} if system == "cronlock-batch" else {}
    return [Variant(target, f"{knob}={v}", {**base, knob: v}) for v in values]


def best(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    ok = [e for e in entries if e["summary"]]
    return max(ok, key=lambda e: e["summary"]["jobs_per_s"]["median"]) if ok else None


async def measure(plan: Plan, runner: Runner) -> dict[str, Any]:
    """Every measurement of the plan, in an order that keeps like with like."""
    results: dict[str, Any] = {
        "drain": [],
        "sweep": [],
        "enqueue": [],
        "latency": [],
        "recovery": [],
        "savepoints": [],
        "missing": [],
    }
    r = plan.repeats

    async def drains(variant: Variant, ns: list[int]) -> None:
        for n in ns:
            results["drain"].append(await runner.repeat("drain", variant, r, "--n", str(n)))

    async def latencies(variant: Variant) -> None:
        for rate in plan.rates:
            # One producer keeps up with 50/s; 500/s needs a few on a busy 2-core machine.
            producers = "1" if rate <= 100 else "4"
            entry = await runner.repeat(
                "latency",
                variant,
                r,
                "--rate",
                str(rate),
                "--seconds",
                str(plan.latency_seconds),
                "--producers",
                producers,
            )
            results["latency"].append(entry)

    async def enqueues(variant: Variant) -> None:
        entry = await runner.repeat(
            "enqueue",
            variant,
            r,
            "--n",
            str(plan.enqueue_bulk),
            "--single",
            str(plan.enqueue_single),
        )
        results["enqueue"].append(entry)

    big = [plan.big_n] if plan.big_n else []
    if "raw" in plan.systems:
        for variant in baseline_variants():
            await drains(variant, plan.drain_ns + big)
        await enqueues(baseline_variants()[0])
        await latencies(baseline_variants()[0])

    if "cronlock" in plan.systems:
        from .systems.cronlock_queue import queue_available

        if queue_available():
            for variant in cronlock_variants():
                await drains(variant, plan.drain_ns + big)
                await latencies(variant)
            sweep = [
                await runner.repeat("drain", v, r, "--n", str(plan.sweep_n))
                for v in sweep_variants("cronlock-batch")
            ]
            results["sweep"].extend(sweep)
            await enqueues(cronlock_variants()[0])
            results["recovery"].append(
                await runner.repeat(
                    "recovery",
                    cronlock_variants()[0],
                    plan.recovery_repeats,
                    "--rate",
                    "100",
                    "--seconds",
                    "4",
                )
            )
        else:
            results["missing"].append(
                "cronlock queue: issue 3's job queue is not in this cronlock yet "
                "(drain, enqueue, latency and recovery of cronlock were not measured)"
            )
        results["savepoints"].append(
            await runner.repeat(
                "savepoints", Variant("cronlock", "run.item()"), r, "--n", str(plan.savepoint_items)
            )
        )
        # The raw loop right after cronlock's, so that the ratio compares like with like.
        results["savepoints"].append(
            await runner.repeat(
                "savepoints",
                Variant("raw", "asyncpg savepoints"),
                r,
                "--n",
                str(plan.savepoint_items),
            )
        )

    for system in ("procrastinate", "pgqueuer", "oban"):
        if system not in plan.systems:
            continue
        try:
            runner.interpreter(system)
        except RuntimeError as exc:
            results["missing"].append(f"{system}: {exc}")
            continue
        default = default_variant(system)
        await drains(default, plan.drain_ns)
        sweep = [
            await runner.repeat("drain", v, r, "--n", str(plan.sweep_n))
            for v in sweep_variants(system)
        ]
        results["sweep"].extend(sweep)
        chosen = best(sweep)
        await enqueues(default)
        await latencies(default)
        if chosen is None:
            results["missing"].append(f"{system}: every tuned run failed")
            continue
        tuned = Variant(system, "tuned " + chosen["label"], chosen["options"])
        tuned_big = big
        expected = plan.big_n / chosen["summary"]["jobs_per_s"]["median"] if big else 0
        if expected > BIG_N_BUDGET_S:
            # At a few hundred jobs/s one 100,000-job drain takes many minutes per run.
            tuned_big = []
            results["missing"].append(
                f"{system} tuned at N={plan.big_n:,}: skipped, about {expected:.0f} s per run "
                f"at its N={plan.sweep_n:,} rate (budget {BIG_N_BUDGET_S} s)"
            )
        await drains(tuned, [n for n in plan.drain_ns if n != plan.sweep_n] + tuned_big)
        # The sweep's runs at sweep_n are the tuned variant's figure there.
        results["drain"].append({**chosen, "label": tuned.label})
        await latencies(tuned)
    return results


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as info:
        mem_kb = int(next(line for line in info if line.startswith("MemTotal")).split()[1])
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


async def postgres(server: str) -> dict[str, Any]:
    conn = await asyncpg.connect(server)
    try:
        version = await conn.fetchval("SELECT version()")
        rows = await conn.fetch(
            "SELECT name, setting, unit, source FROM pg_settings WHERE name = ANY($1::text[])",
            list(PG_SETTINGS),
        )
    finally:
        await conn.close()
    settings = {
        row["name"]: {"value": row["setting"], "unit": row["unit"], "source": row["source"]}
        for row in rows
    }
    return {"version": version, "settings": settings}


def versions(py312: Path | None) -> dict[str, str]:
    found: dict[str, str] = {}
    for name in PEER_PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    if py312 is not None and py312.exists():
        probe = subprocess.run(
            [
                str(py312),
                "-c",
                "import platform; from importlib.metadata import version; "
                "print(version('oban'), version('psycopg'), platform.python_version())",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0:
            oban, psycopg, python = probe.stdout.split()
            found["oban"] = oban
            found["oban psycopg"] = psycopg
            found["oban python"] = python
    return found


def cronlock_source() -> dict[str, Any]:
    """Which cronlock the agents import (a branch's worktree can be measured before it lands)."""
    probe = subprocess.run(
        [sys.executable, "-c", "import cronlock, os; print(os.path.dirname(cronlock.__file__))"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tempfile.gettempdir(),
        env={**os.environ, "PYTHONPATH": _agent_path()},
    )
    where = Path(probe.stdout.strip()).parent if probe.returncode == 0 else None
    if where is None:
        return {"path": None}
    git = subprocess.run(
        ["git", "-C", str(where), "log", "-1", "--format=%H %s"],
        capture_output=True,
        text=True,
        check=False,
    )
    dirty = subprocess.run(
        ["git", "-C", str(where), "status", "--porcelain", "--", "cronlock", "migrations"],
        capture_output=True,
        text=True,
        check=False,
    )
    return {
        "path": str(where),
        "commit": git.stdout.strip() or None,
        "uncommitted_changes": bool(dirty.stdout.strip()),
    }


async def write_check(name: str, started: datetime, server: str, fields: dict[str, Any]) -> Path:
    """Write a standalone check's result (``benchmarks/results/NAME-<time>.json``), with the
    server's version and settings and the cronlock measured; its path."""
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{name}-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    document = {
        "started": started.isoformat(),
        **fields,
        "postgres": await postgres(server),
        "cronlock": cronlock_source(),
    }
    out.write_text(json.dumps(document, indent=2) + "\n")
    return out


def _agent_path() -> str:
    # The repository last: a PYTHONPATH given by the caller (a worktree of a branch not landed
    # yet) decides which cronlock is measured.
    return os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(ROOT)) if p)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    p.add_argument("--server", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_SERVER))
    p.add_argument("--quick", action="store_true", help="small N, short latency runs")
    p.add_argument("--full", action="store_true", help="also drain 100,000 jobs")
    p.add_argument("--repeats", type=int, default=3, help="runs per figure (>= 3 for the report)")
    p.add_argument(
        "--systems",
        nargs="+",
        default=["raw", "cronlock", "procrastinate", "pgqueuer", "oban"],
        choices=["raw", "cronlock", "procrastinate", "pgqueuer", "oban"],
    )
    p.add_argument("--python312", type=Path, default=DEFAULT_PY312, help="runs oban-py")
    p.add_argument("--out", type=Path, help="the JSON file (default: results/<time>.json)")
    p.add_argument("--profile", action="store_true", help="profile one cronlock savepoint run")
    p.add_argument(
        "--redo",
        nargs="+",
        metavar="SYSTEM:LABEL:N",
        help="only these drains (e.g. cronlock:strict:100000), written as a supplement",
    )
    return p


async def _main(args: argparse.Namespace) -> Path:
    plan = plan_for(args)
    runner = Runner(args.server, args.python312)
    started = datetime.now(UTC)
    meta: dict[str, Any] = {
        "command": "python -m benchmarks.run " + shlex.join(sys.argv[1:]),
        "started_at": started.isoformat(timespec="seconds"),
        "load_at_start": os.getloadavg(),
        "machine": machine(),
        "postgres": await postgres(args.server),
        "versions": versions(args.python312),
        "cronlock_source": cronlock_source(),
        "plan": plan.__dict__,
    }
    clock = time.monotonic()
    if args.redo:
        results = await redo(args.redo, plan.repeats, runner)
        meta["supplement"] = True
    else:
        results = await measure(plan, runner)
    if args.profile:
        results["profile"] = await profile(runner, plan.savepoint_items)
    meta["load_at_end"] = os.getloadavg()
    meta["seconds"] = round(time.monotonic() - clock, 1)
    out = args.out or RESULTS / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, **results}, indent=1) + "\n")
    return out


async def redo(specs: list[str], repeats: int, runner: Runner) -> dict[str, Any]:
    """Only the drains named ``SYSTEM:LABEL:N`` (a supplement to a full run's file).

    For a figure whose runs failed for a reason outside the system measured; the report
    merges the supplement over the full run and says so.
    """
    known = {v.key: v for v in baseline_variants() + cronlock_variants()}
    entries = []
    for spec in specs:
        system, label, n = spec.rsplit(":", 2)
        variant = known.get(f"{system}:{label}")
        if variant is None:
            raise SystemExit(f"unknown drain variant {system}:{label} (known: {sorted(known)})")
        entries.append(await runner.repeat("drain", variant, repeats, "--n", n))
    return {"drain": entries}


async def profile(runner: Runner, items: int) -> dict[str, Any]:
    """One cProfile'd cronlock savepoint run; its text summary goes into the results."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "savepoints-cronlock.pstats"
        run = await runner.agent(
            "savepoints",
            Variant("cronlock", "run.item()"),
            "--n",
            str(items),
            "--profile",
            str(path),
        )
    return {"savepoints_cronlock": run}


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    out = asyncio.run(_main(args))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
