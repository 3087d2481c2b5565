"""cronlock's benchmark harness: cronlock, its peers and raw asyncpg, side by side.

``python -m benchmarks.run`` measures every system on one machine and one PostgreSQL, each run
on a scratch database of its own, and writes the figures as JSON under ``benchmarks/results/``;
``python -m benchmarks.report`` turns that JSON into BENCHMARKS.md's tables and the chart.
Nothing here is imported by the ``cronlock`` package: the peers are an optional extra.
"""
