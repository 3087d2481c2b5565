"""The bench's report: one JSON-able dict (``--json``), and the table people read.

Every figure is a median with its min..max over ``--repeats`` (``median``, ``min``, ``max``,
``runs``); a section that was not run is ``null``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .options import BenchOptions
from .stats import percentile, spread

__all__ = ["render", "summarise"]


def _spread_of(runs: Sequence[dict[str, Any]], key: str) -> dict[str, Any] | None:
    values = [run[key] for run in runs if run.get(key) is not None]
    return dict(spread(values)) if values else None


def summarise(
    about: dict[str, Any], options: BenchOptions, results: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    report: dict[str, Any] = {**about, "options": options.to_dict()}
    enqueue = results.get("enqueue")
    report["enqueue"] = enqueue and {
        "bulk": {"jobs": enqueue[0]["bulk_jobs"], "jobs_per_s": _spread_of(enqueue, "bulk_per_s")},
        "single": {
            "jobs": enqueue[0]["single_jobs"],
            "jobs_per_s": _spread_of(enqueue, "single_per_s"),
        },
    }
    drains = results.get("drain")
    report["drain"] = drains and [
        {
            "mode": mode.value,
            "n": n,
            **{key: _spread_of(runs, key) for key in ("seconds", "jobs_per_s", "p95_ms", "wall_s")},
        }
        for mode in options.modes
        for n in options.sizes
        if (runs := [r for r in drains if r["mode"] == mode.value and r["n"] == n])
    ]
    latency = results.get("latency")
    report["latency"] = latency and {
        "rate": options.latency_rate,
        "seconds": options.latency_seconds,
        "jobs": latency[0]["jobs"],
        **{
            key: _spread_of(latency, key)
            for key in ("achieved_rate", "p50_ms", "p95_ms", "p99_ms", "max_ms")
        },
    }
    periodic = results.get("periodic")
    report["periodic"] = periodic and {
        "items": options.items,
        **{key: _spread_of(periodic, key) for key in ("seconds", "items_per_s")},
    }
    recovery = results.get("recovery")
    if recovery:
        kills = [s for run in recovery for s in run["seconds"]]
        report["recovery"] = {
            "kills": len(kills),
            "rate": options.latency_rate,
            "seconds": dict(spread(kills)),
            "p95_s": percentile(kills, 95),
            "each_s": kills,
        }
    else:
        report["recovery"] = None
    return report


def _figure(value: dict[str, Any] | None, fmt: str, unit: str = "") -> str:
    if value is None:
        return "-"
    text = format(value["median"], fmt) + unit
    if value["runs"] > 1:
        text += f" ({format(value['min'], fmt)}..{format(value['max'], fmt)})"
    return text


def _table(rows: Sequence[tuple[str, ...]], right: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def render(report: dict[str, Any]) -> list[str]:
    """The report as the lines of a table (figures: median, and min..max over repeats)."""
    lines = [
        f"cronlock bench — cronlock {report['cronlock']}, PostgreSQL {report['postgresql']} "
        f"(fsync {report['fsync']}, synchronous_commit {report['synchronous_commit']}), "
        f"{report['cores']} cores, {report['platform']}, Python {report['python']}",
        f"database {report['database']}, scratch schema {report['schema']} (dropped)",
    ]
    repeats = report["options"]["repeats"]
    if repeats > 1:
        lines.append(f"figures: median (min..max) of {repeats} runs")
    if report["drain"]:
        lines += [
            "",
            "drain, no-op jobs, one worker (time: first started_at → last completed_at "
            "in the database; p95: a job's started → committed)",
        ]
        rows: list[tuple[str, ...]] = [("mode", "N jobs", "time", "jobs/s", "p95")]
        for entry in report["drain"]:
            rows.append(
                (
                    entry["mode"],
                    f"{entry['n']:,}",
                    _figure(entry["seconds"], ".3f", " s"),
                    _figure(entry["jobs_per_s"], ",.0f"),
                    _figure(entry["p95_ms"], ".1f", " ms"),
                )
            )
        lines += _table(rows, {1, 2, 3, 4})
    lines.append("")
    rows = []  # the other sections: what, how much, the figures
    if report["enqueue"]:
        bulk, single = report["enqueue"]["bulk"], report["enqueue"]["single"]
        rows.append(
            (
                "enqueue",
                f"bulk, {bulk['jobs']:,} jobs in one statement",
                _figure(bulk["jobs_per_s"], ",.0f", " jobs/s"),
            )
        )
        rows.append(
            (
                "enqueue",
                f"one at a time, {single['jobs']:,} jobs each committed on its own",
                _figure(single["jobs_per_s"], ",.0f", " jobs/s"),
            )
        )
    latency = report["latency"]
    if latency:
        achieved = latency["achieved_rate"]["median"]
        short = f", achieved {achieved:.0f}/s" if achieved < 0.95 * latency["rate"] else ""
        rows.append(
            (
                "latency",
                f"enqueue → completed, idle worker, {latency['rate']:g} jobs/s "
                f"({latency['jobs']:,} jobs{short})",
                f"p50 {_figure(latency['p50_ms'], '.1f')}, p95 "
                f"{_figure(latency['p95_ms'], '.1f')}, p99 {_figure(latency['p99_ms'], '.1f')} ms",
            )
        )
    periodic = report["periodic"]
    if periodic:
        rows.append(
            (
                "periodic",
                f"{periodic['items']:,} items, an UPDATE each in its own savepoint",
                f"{_figure(periodic['seconds'], '.3f', ' s')}, "
                f"{_figure(periodic['items_per_s'], ',.0f', ' items/s')}",
            )
        )
    recovery = report["recovery"]
    if recovery:
        each = ", ".join(f"{s * 1000:.0f}" for s in recovery["each_s"])
        rows.append(
            (
                "recovery",
                f"SIGKILL of the active worker → first job completed by the standby "
                f"({recovery['kills']} kill{'s' if recovery['kills'] > 1 else ''})",
                f"median {recovery['seconds']['median'] * 1000:.0f} ms, p95 "
                f"{recovery['p95_s'] * 1000:.0f} ms ({each} ms)",
            )
        )
    if rows:
        lines += _table(rows, set())
    return lines
