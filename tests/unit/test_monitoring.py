"""The monitoring kit (monitoring/) without running it: the committed dashboard is its
generator's output; every metric and label a panel or an alert reads is one cronlock exports
(read from cronlock/observe/prometheus.py, not from a list kept here), and the dashboard shows
every metric; each alert says what it means. tests/e2e/test_prometheus.py evaluates the same
queries on a real Prometheus.
"""

from __future__ import annotations

import pytest
import yaml
from monitoringkit import (
    DASHBOARD,
    ROOT,
    alert_queries,
    alert_rules,
    dashboard,
    exported_metrics,
    family,
    grouping_labels,
    metrics_read,
    operands,
    panel_queries,
    panels,
    selector_labels,
    variable_queries,
)

from monitoring.grafana import dashboard as generator


def test_the_committed_dashboard_is_the_generators_output() -> None:
    assert DASHBOARD.read_text() == generator.render(), (
        "monitoring/grafana/cronlock.json is stale: run python -m monitoring.grafana.dashboard"
    )


def test_the_generator_checks_the_committed_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert generator.main(["--check"]) == 0
    assert generator.main(["--bogus"]) == 2


def test_the_exporters_metrics_are_read_from_its_code() -> None:
    exported = exported_metrics()
    # The reader finds each kind of family: gauges, counters (name_total), histograms.
    assert exported["cronlock_jobs"] == {"queue", "status"}
    assert exported["cronlock_jobs_processed_total"] == {"queue"}
    assert exported["cronlock_task_duration_seconds_bucket"] == {"task", "le"}
    assert exported["cronlock_task_duration_seconds_count"] == {"task"}


def _queries() -> list[tuple[str, str]]:
    found = [(query.where, query.expr) for query in (*panel_queries(), *alert_queries())]
    found += [
        (f"variable {name}", f'{metric}{{{label}!=""}}')
        for name, metric, label in variable_queries()
    ]
    return found


def test_every_metric_and_label_the_kit_reads_is_exported() -> None:
    exported = exported_metrics()
    queries = _queries()
    assert len(queries) > 30
    for where, expr in queries:
        read = metrics_read(expr)
        assert read, f"{where} reads no cronlock metric: {expr}"
        unknown = read - set(exported)
        assert not unknown, f"{where} reads {sorted(unknown)}, which cronlock does not export"
        for metric, labels in selector_labels(expr):
            assert labels <= exported[metric], (
                f"{where}: {metric} has no {labels - exported[metric]}"
            )
        has = set().union(*(exported[metric] for metric in read))
        assert grouping_labels(expr) <= has, f"{where} groups by {grouping_labels(expr) - has}"


def test_the_dashboard_shows_every_exported_metric() -> None:
    exported = exported_metrics()
    shown = {
        family(name, exported) for query in panel_queries() for name in metrics_read(query.expr)
    }
    assert {family(name, exported) for name in exported} == shown


def test_the_dashboards_panels() -> None:
    board = dashboard()
    found = panels(board)
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        covered = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not covered & cells, f"{panel['title']} overlaps another panel"
        cells |= covered
    for panel in found:
        assert panel["targets"], panel["title"]
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"


def test_every_alert_says_what_it_means() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        # One series per task or queue, however many cronlock targets are scraped.
        assert "max by (" in rule["expr"], rule["alert"]


def test_the_provisioning_points_at_the_dashboard_and_a_prometheus() -> None:
    provisioning = ROOT / "monitoring" / "grafana" / "provisioning"
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    assert [source["type"] for source in sources["datasources"]] == ["prometheus"]
    providers = yaml.safe_load((provisioning / "dashboards" / "cronlock.yml").read_text())
    assert [provider["type"] for provider in providers["providers"]] == ["file"]


def test_an_alert_is_split_into_its_conditions() -> None:
    expr = """
        max by (queue) (cronlock_oldest_due_job_age_seconds) > 600
        and on (queue)
        (max by (queue) (cronlock_drainers{state="active"}) > 0)
        and on (queue)
        max by (queue) (increase(a[10m]) + increase(b[10m])) == 0
        unless on (queue)
        max by (queue) (cronlock_queue_paused)
        or vector(1) >= bool 2
    """
    assert operands(expr) == [
        "max by (queue) (cronlock_oldest_due_job_age_seconds)",
        'max by (queue) (cronlock_drainers{state="active"})',
        "max by (queue) (increase(a[10m]) + increase(b[10m]))",
        "max by (queue) (cronlock_queue_paused)",
        "vector(1)",
    ]
    # A comparison inside a function, or between two vectors, stays.
    assert operands("clamp_min(x > 1, 0)") == ["clamp_min(x > 1, 0)"]
    assert operands("(a) > (b)") == ["(a) > (b)"]
    assert operands('x{state="and or"} > 1') == ['x{state="and or"}']
