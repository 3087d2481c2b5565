"""The Grafana dashboard for cronlock's ``/metrics``, built with grafana-foundation-sdk.

``cronlock.json`` beside this file is this module's output, committed so that Grafana can
provision it straight from the repository (``provisioning/``); tests/unit/test_monitoring.py
checks that the two agree. After a change here, write it again:

    python -m monitoring.grafana.dashboard          # writes monitoring/grafana/cronlock.json
    python -m monitoring.grafana.dashboard --check  # exit 1 if the committed file differs

Every cronlock process reports the same numbers (the metrics are read from the database at
scrape time), so a query keeps one series per queue or task with ``max by``, never ``sum``:
scraping ``cronlock serve`` and a worker's ``--metrics-port`` both must not double anything.
The panels go from what an on-call person looks at first (the stats row: what is wrong now)
to the job queue (depth, throughput, latency, failures and retries, drainers) and the
periodic tasks (runs by outcome, slot by slot; overdue, failing, parked, duration, lateness).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard as dashboard_builder
from grafana_foundation_sdk.builders import prometheus as prometheus_builder
from grafana_foundation_sdk.builders import stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

__all__ = ["OUTPUT", "UID", "build", "render"]

OUTPUT = Path(__file__).with_name("cronlock.json")
UID = "cronlock"

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
QUEUE = 'queue=~"$queue"'
TASK = 'task=~"$task"'
# Grafana's own window for rate() and increase(): at least four scrape intervals.
WINDOW = "$__rate_interval"


def _query(expr: str, legend: str, ref_id: str = "A") -> prometheus_builder.Dataquery:
    return (
        prometheus_builder.Dataquery()
        .expr(expr)
        .legend_format(legend)
        .ref_id(ref_id)
        .datasource(DATASOURCE)
    )


def _thresholds(*steps: tuple[float | None, str]) -> dashboard_builder.ThresholdsConfig:
    return (
        dashboard_builder.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=value, color=color) for value, color in steps])
    )


_GREEN_THEN_RED = ((None, "green"), (1, "red"))


def _stat(
    panel_id: int,
    title: str,
    description: str,
    expr: str,
    *,
    unit: str = "short",
    steps: tuple[tuple[float | None, str], ...] = _GREEN_THEN_RED,
) -> stat.Panel:
    """A number for the top row: what is wrong now, green at 0."""
    return (
        stat.Panel()
        .id(panel_id)
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(_query(expr, title).instant())
        .unit(unit)
        .thresholds(_thresholds(*steps))
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.NONE)
        .reduce_options(common_builder.ReduceDataOptions().calcs(["lastNotNull"]))
        .height(4)
        .span(3)
    )


def _graph(
    panel_id: int,
    title: str,
    description: str,
    *queries: tuple[str, str],
    unit: str = "short",
    bars: bool = False,
    width: int = 8,
) -> timeseries.Panel:
    """A time series panel of ``queries`` (expression, legend); ``bars``: stacked bars, for
    counts per interval rather than levels."""
    panel = (
        timeseries.Panel()
        .id(panel_id)
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .min(0)
        .legend(
            common_builder.VizLegendOptions()
            .show_legend(True)
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
        )
        .tooltip(common_builder.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI))
        .height(8)
        .span(width)
    )
    for index, (expr, legend) in enumerate(queries):
        panel = panel.with_target(_query(expr, legend, ref_id=chr(ord("A") + index)))
    if bars:
        panel = (
            panel.draw_style(common.GraphDrawStyle.BARS)
            .fill_opacity(80)
            .stacking(common_builder.StackingConfig().mode(common.StackingMode.NORMAL))
        )
    else:
        panel = panel.line_interpolation(common.LineInterpolation.STEP_AFTER).fill_opacity(10)
    return panel


def _quantiles(metric: str, label: str, selector: str) -> list[tuple[str, str]]:
    return [
        (
            f"histogram_quantile({q}, max by ({label}, le) "
            f"(rate({metric}_bucket{{{selector}}}[{WINDOW}])))",
            f"{{{{{label}}}}} p{round(q * 100)}",
        )
        for q in (0.5, 0.95, 0.99)
    ]


def _stats() -> list[stat.Panel]:
    return [
        _stat(
            1,
            "Jobs due",
            "Jobs whose time has come and that no drainer has taken yet, in every selected "
            "queue (cronlock_jobs_due).",
            f"sum(max by (queue) (cronlock_jobs_due{{{QUEUE}}})) or vector(0)",
            steps=((None, "green"), (1000, "orange")),
        ),
        _stat(
            2,
            "Oldest due job",
            "How long the oldest due job has waited (cronlock_oldest_due_job_age_seconds).",
            f"max(cronlock_oldest_due_job_age_seconds{{{QUEUE}}}) or vector(0)",
            unit="s",
            steps=((None, "green"), (60, "orange"), (300, "red")),
        ),
        _stat(
            3,
            "Active drainers",
            "Live active drainers, in every selected queue (cronlock_drainers).",
            f'sum(max by (queue) (cronlock_drainers{{{QUEUE}, state="active"}})) or vector(0)',
            steps=((None, "red"), (1, "green")),
        ),
        _stat(
            4,
            "Unserved queues",
            "Queues whose jobs have been due for over two minutes with no live active drainer, "
            "and not paused (cronlock_queue_unserved).",
            f"count(max by (queue) (cronlock_queue_unserved{{{QUEUE}}}) > 0) or vector(0)",
        ),
        _stat(
            5,
            "Jobs failed",
            "Jobs that failed for good (retries exhausted) in the dashboard's time range "
            "(cronlock_jobs_failed_total).",
            f"sum(max by (queue) (increase(cronlock_jobs_failed_total{{{QUEUE}}}[$__range])))"
            " or vector(0)",
        ),
        _stat(
            6,
            "Overdue tasks",
            "Periodic tasks with a slot past its grace and no outcome: nobody ran it "
            "(cronlock_task_overdue_seconds > 0).",
            f"count(max by (task) (cronlock_task_overdue_seconds{{{TASK}}}) > 0) or vector(0)",
        ),
        _stat(
            7,
            "Failing tasks",
            "Periodic tasks whose last runs failed, with no success since "
            "(cronlock_task_consecutive_failures > 0).",
            f"count(max by (task) (cronlock_task_consecutive_failures{{{TASK}}}) > 0) or vector(0)",
        ),
        _stat(
            8,
            "Parked items",
            "Items left out of their task's runs after failing park_after runs in a row "
            "(cronlock_task_items_parked): `cronlock task parked TASK` lists them.",
            f"sum(max by (task) (cronlock_task_items_parked{{{TASK}}})) or vector(0)",
            steps=((None, "green"), (1, "orange")),
        ),
    ]


def _queue_panels() -> list[timeseries.Panel]:
    return [
        _graph(
            10,
            "Queue depth",
            "Jobs waiting by queue and status (pending, retrying; processing in the lease "
            "mode), and how many of them are due now.",
            (
                f"max by (queue, status) (cronlock_jobs{{{QUEUE}, "
                'status=~"pending|retrying|processing"})',
                "{{queue}} {{status}}",
            ),
            (f"max by (queue) (cronlock_jobs_due{{{QUEUE}}})", "{{queue}} due"),
        ),
        _graph(
            11,
            "Throughput",
            "Jobs completed per second, by queue.",
            (
                f"max by (queue) (rate(cronlock_jobs_processed_total{{{QUEUE}}}[{WINDOW}]))",
                "{{queue}} completed",
            ),
            unit="ops",
        ),
        _graph(
            12,
            "Latency: enqueue to completion",
            "Quantiles of completed_at - created_at (cronlock_job_latency_seconds), by queue: "
            "time waiting plus time running.",
            *_quantiles("cronlock_job_latency_seconds", "queue", QUEUE),
            unit="s",
        ),
        _graph(
            13,
            "Failures and retries",
            "Per second, by queue: jobs failed for good, retries scheduled after a failed "
            "attempt, jobs cancelled, and snoozes (a handler's JobSnooze).",
            (
                f"max by (queue) (rate(cronlock_jobs_failed_total{{{QUEUE}}}[{WINDOW}]))",
                "{{queue}} failed",
            ),
            (
                f"max by (queue) (rate(cronlock_jobs_retried_total{{{QUEUE}}}[{WINDOW}]))",
                "{{queue}} retried",
            ),
            (
                f"max by (queue) (rate(cronlock_jobs_cancelled_total{{{QUEUE}}}[{WINDOW}]))",
                "{{queue}} cancelled",
            ),
            (
                f"max by (queue) (rate(cronlock_jobs_snoozed_total{{{QUEUE}}}[{WINDOW}]))",
                "{{queue}} snoozed",
            ),
            unit="ops",
        ),
        _graph(
            14,
            "Oldest due job",
            "How long the oldest due job of each queue has waited: it climbs while nothing "
            "takes the queue's jobs.",
            (
                f"max by (queue) (cronlock_oldest_due_job_age_seconds{{{QUEUE}}})",
                "{{queue}}",
            ),
            unit="s",
        ),
        _graph(
            15,
            "Drainers",
            "Live drainers by queue and state (one active per exclusive queue, the others "
            "standing by; any number active on a shared queue), and two flags: paused (1 while "
            "an operator paused the queue) and unserved (1 while its due jobs have waited over "
            "two minutes with no active drainer).",
            (f"max by (queue, state) (cronlock_drainers{{{QUEUE}}})", "{{queue}} {{state}}"),
            (f"max by (queue) (cronlock_queue_paused{{{QUEUE}}})", "{{queue}} paused"),
            (f"max by (queue) (cronlock_queue_unserved{{{QUEUE}}})", "{{queue}} unserved"),
        ),
    ]


def _task_panels() -> list[timeseries.Panel]:
    return [
        _graph(
            20,
            "Runs by outcome",
            "The slot history: runs per interval by task and outcome (completed, partial, "
            "failed, skipped, missed, interrupted).",
            (
                f"max by (task, status) (increase(cronlock_task_runs_total{{{TASK}}}[{WINDOW}]))",
                "{{task}} {{status}}",
            ),
            bars=True,
            width=12,
        ),
        _graph(
            21,
            "Overdue",
            "How long past its grace each task's first slot with no outcome is (0: on "
            "schedule). Above 0, no host ran the slot.",
            (f"max by (task) (cronlock_task_overdue_seconds{{{TASK}}})", "{{task}}"),
            unit="s",
            width=12,
        ),
        _graph(
            22,
            "Consecutive failures",
            "Failed runs since each task's last success.",
            (f"max by (task) (cronlock_task_consecutive_failures{{{TASK}}})", "{{task}}"),
        ),
        _graph(
            23,
            "Since the last success",
            "Time since the last run that did the work (completed or partial) started.",
            (
                f"time() - max by (task) (cronlock_task_last_success_timestamp_seconds{{{TASK}}})",
                "{{task}}",
            ),
            unit="s",
        ),
        _graph(
            24,
            "Parked items and paused tasks",
            "Items parked (left out of runs after failing park_after runs in a row), and 1 "
            "while a task is paused (its slots are recorded skipped).",
            (f"max by (task) (cronlock_task_items_parked{{{TASK}}})", "{{task}} parked"),
            (f"max by (task) (cronlock_task_paused{{{TASK}}})", "{{task}} paused"),
        ),
        _graph(
            25,
            "Run duration",
            "Quantiles of how long runs took (cronlock_task_duration_seconds).",
            *_quantiles("cronlock_task_duration_seconds", "task", TASK),
            unit="s",
            width=12,
        ),
        _graph(
            26,
            "Lateness",
            "Quantiles of how long after its slot a run started (cronlock_task_lateness_"
            "seconds): the scheduler's or cron's delay, jitter included.",
            *_quantiles("cronlock_task_lateness_seconds", "task", TASK),
            unit="s",
            width=12,
        ),
    ]


def _label_variable(name: str, label: str, metric: str) -> dashboard_builder.QueryVariable:
    return (
        dashboard_builder.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(f"label_values({metric}, {name})")
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(model.VariableOption(text="All", value="$__all", selected=True))
    )


def build() -> model.Dashboard:
    """The dashboard."""
    board = (
        dashboard_builder.Dashboard("cronlock")
        .uid(UID)
        .description(
            "cronlock's job queue and periodic tasks, from the /metrics of cronlock serve "
            "or a worker's --metrics-port (monitoring/grafana in the repository)."
        )
        .tags(["cronlock"])
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .time("now-6h", "now")
        .refresh("1m")
        .with_variable(
            dashboard_builder.DatasourceVariable("datasource")
            .label("Prometheus")
            .type("prometheus")
        )
        .with_variable(_label_variable("queue", "Queue", "cronlock_jobs"))
        .with_variable(_label_variable("task", "Task", "cronlock_task_runs_total"))
        .with_row(dashboard_builder.Row("Now").id(100))
    )
    for number in _stats():
        board = board.with_panel(number)
    board = board.with_row(dashboard_builder.Row("Job queue").id(101))
    for graph in _queue_panels():
        board = board.with_panel(graph)
    board = board.with_row(dashboard_builder.Row("Periodic tasks").id(102))
    for graph in _task_panels():
        board = board.with_panel(graph)
    return board.build()


def render() -> str:
    """``build()`` as the JSON text of cronlock.json."""
    return json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv == ["--check"]:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run python -m monitoring.grafana.dashboard")
            return 1
        return 0
    if argv:
        print("usage: python -m monitoring.grafana.dashboard [--check]")
        return 2
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
