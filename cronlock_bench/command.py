"""``cronlock bench``, the command: its options, and the run (``cronlock_bench``) it prints."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from cronlock.cli.context import EXIT_FAILED, Options, exit_with, pass_options, run
from cronlock.queue.drainer import DEFAULT_BATCH_SIZE

from . import BenchFailed, bench_options, render, run_bench
from .options import parse_modes, parse_sections, parse_sizes
from .progress import Bar, Lines

__all__ = ["bench"]


@click.command()
@click.option("--quick", is_flag=True, help="Small sizes and a short latency run (about 15 s).")
@click.option(
    "--sizes",
    metavar="N,N,…",
    help="Jobs per drain run [default: 100,1000,10000,100000; --quick: 100,1000].",
)
@click.option("--modes", metavar="MODE,…", help="Commit modes to drain in [default: strict,batch].")
@click.option(
    "--batch-size",
    type=click.IntRange(1, 10_000),
    help=f"Jobs per batch in batch mode ({DEFAULT_BATCH_SIZE}).",
)
@click.option(
    "--latency-rate",
    type=click.FloatRange(0, 10_000, min_open=True),
    help="Jobs/s sent one at a time to an idle worker (also during recovery) [default: 50].",
)
@click.option(
    "--latency-seconds",
    type=click.FloatRange(0, 3600, min_open=True),
    help="How long the latency run sends [default: 10; --quick: 2].",
)
@click.option(
    "--items",
    type=click.IntRange(1, 1_000_000),
    help="Items of the periodic run [default: 10000; --quick: 1000].",
)
@click.option(
    "--recovery-kills",
    type=click.IntRange(0, 100),
    help="SIGKILLs of the active worker, 0 to skip [default: 3; --quick: 1].",
)
@click.option(
    "--repeats",
    type=click.IntRange(1, 100),
    help="Runs of everything, interleaved; figures are median (min..max) [default: 1].",
)
@click.option(
    "--only",
    metavar="SECTION,…",
    help="Sections to run: enqueue,drain,latency,periodic,recovery [default: all].",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object on stdout instead of the table."
)
@click.option("--fail-at", hidden=True, help="Fail this section (tests of the cleanup).")
@pass_options
def bench(
    options: Options,
    quick: bool,
    sizes: str | None,
    modes: str | None,
    batch_size: int | None,
    latency_rate: float | None,
    latency_seconds: float | None,
    items: int | None,
    recovery_kills: int | None,
    repeats: int | None,
    only: str | None,
    as_json: bool,
    fail_at: str | None,
) -> None:
    """Measure cronlock on this database: enqueue and drain rates, latency, a periodic run,
    recovery after SIGKILL of the active worker; print a table (or --json).

    It works in a fresh schema, cronlock_bench_<random hex>, with its own queue, and never
    touches cronlock's own schema or jobs; two `cronlock worker` processes are started for
    latency and recovery. The schema is dropped and the workers are killed at the end, also
    when a step fails or on Ctrl-C/SIGTERM. --app, --schema and --pgbouncer are not used
    (point it at PostgreSQL itself; its user needs CREATE on the database).

    Exit codes: 0 measured, 1 a step failed (or interrupted), 2 bad option or no database.
    The default run drains 100,000 jobs per commit mode (a few minutes);
    --quick takes about 15 s.
    """
    given: dict[str, Any] = {
        name: value
        for name, value in {
            "batch_size": batch_size,
            "latency_rate": latency_rate,
            "latency_seconds": latency_seconds,
            "items": items,
            "recovery_kills": recovery_kills,
            "repeats": repeats,
            "fail_at": fail_at,
        }.items()
        if value is not None
    }
    if sizes is not None:
        given["sizes"] = parse_sizes(sizes)
    if modes is not None:
        given["modes"] = parse_modes(modes)
    if only is not None:
        given["sections"] = parse_sections(only)
    settings = bench_options(quick=quick, **given)
    database = options.database()
    progress = Bar() if sys.stderr.isatty() and not as_json else Lines()
    try:
        url = database.url.render_as_string(hide_password=False)
        report = run(lambda: run_bench(url, settings, progress), database)
    except BenchFailed as exc:
        click.echo(f"cronlock bench: {exc}", err=True)
        exit_with(EXIT_FAILED)
    if as_json:
        click.echo(json.dumps(report))
    else:
        for line in render(report):
            click.echo(line)
