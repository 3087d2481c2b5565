"""The monitoring kit as its tests read it: the queries of the Grafana dashboard and the alert
rules, taken from the files Grafana and Prometheus load (monitoring/grafana/cronlock.json,
monitoring/prometheus/cronlock-rules.yml); the metrics cronlock exports, read from the code
that exports them (cronlock/observe/prometheus.py); and PromQL taken apart just enough to
name the metrics and labels an expression reads and to split an alert into its conditions.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "monitoring" / "grafana" / "cronlock.json"
RULES = ROOT / "monitoring" / "prometheus" / "cronlock-rules.yml"
RULE_TESTS = ROOT / "monitoring" / "prometheus" / "cronlock-rules.test.yml"
EXPORTER = ROOT / "cronlock" / "observe" / "prometheus.py"


@dataclass(frozen=True)
class Query:
    """One PromQL expression of the kit: a panel's target or an alert's ``expr``."""

    where: str  # "panel 'Queue depth' A", "alert CronlockTaskOverdue"
    expr: str


def dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return board


def panels(board: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every panel but the rows themselves, those inside collapsed rows included."""
    found: list[dict[str, Any]] = []
    for panel in (board or dashboard())["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def panel_queries(board: dict[str, Any] | None = None) -> list[Query]:
    return [
        Query(f"panel {panel['title']!r} {target['refId']}", target["expr"])
        for panel in panels(board)
        for target in panel.get("targets", [])
    ]


_LABEL_VALUES = re.compile(r"^label_values\((\w+),\s*(\w+)\)$")


def variable_queries(board: dict[str, Any] | None = None) -> list[tuple[str, str, str]]:
    """The query variables' ``label_values(METRIC, LABEL)``: (variable, metric, label)."""
    found = []
    for variable in (board or dashboard())["templating"]["list"]:
        if variable["type"] != "query":
            continue
        matched = _LABEL_VALUES.match(variable["query"])
        assert matched, f"variable {variable['name']}: not label_values(): {variable['query']}"
        found.append((variable["name"], matched[1], matched[2]))
    return found


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def alert_queries() -> list[Query]:
    return [Query(f"alert {rule['alert']}", rule["expr"]) for rule in alert_rules()]


# -- the metrics cronlock exports ------------------------------------------------------------

_FAMILIES = {"GaugeMetricFamily": "gauge", "CounterMetricFamily": "counter"}


def exported_metrics(source: Path = EXPORTER) -> dict[str, frozenset[str]]:
    """Each sample name cronlock's /metrics has, and its labels, read from the calls that
    make the families in ``source``: ``GaugeMetricFamily(name, …, labels=[…])``,
    ``CounterMetricFamily`` (its samples are ``name_total``) and ``_histogram(name, …,
    label, …)`` (``_bucket`` with ``le``, ``_sum``, ``_count``)."""
    found: dict[str, frozenset[str]] = {}
    for node in ast.walk(ast.parse(source.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id not in (*_FAMILIES, "_histogram") or not node.args:
            continue
        if not isinstance(node.args[0], ast.Constant):
            continue  # _histogram's own HistogramMetricFamily(name, …)
        name = node.args[0].value
        assert isinstance(name, str), ast.dump(node)
        kind = _FAMILIES.get(node.func.id)
        if kind is not None:
            labels: frozenset[str] = frozenset()
            for keyword in node.keywords:
                if keyword.arg == "labels":
                    labels = frozenset(ast.literal_eval(keyword.value))
            found[f"{name}_total" if kind == "counter" else name] = labels
        elif node.func.id == "_histogram":
            label = ast.literal_eval(node.args[2])
            found[f"{name}_bucket"] = frozenset({label, "le"})
            found[f"{name}_sum"] = found[f"{name}_count"] = frozenset({label})
    return found


def family(sample: str, exported: dict[str, frozenset[str]]) -> str:
    """The family a sample name belongs to (``cronlock_job_latency_seconds_bucket`` →
    ``cronlock_job_latency_seconds``)."""
    for suffix in ("_bucket", "_sum", "_count"):
        base = sample.removesuffix(suffix)
        if base != sample and f"{base}_bucket" in exported:
            return base
    return sample.removesuffix("_total")


# -- PromQL, taken apart ----------------------------------------------------------------------

_METRIC = re.compile(r"\b(cronlock_\w+)")
_SELECTOR = re.compile(r"\b(cronlock_\w+)\s*\{([^}]*)\}")
_MATCHER = re.compile(r'(\w+)\s*(?:=~|!~|!=|=)\s*"')
_GROUPING = re.compile(r"\b(?:by|on|ignoring|without)\s*\(([^)]*)\)")


def metrics_read(expr: str) -> set[str]:
    return set(_METRIC.findall(expr))


def selector_labels(expr: str) -> list[tuple[str, set[str]]]:
    """Each ``metric{…}`` of ``expr`` with the label names its matchers name."""
    return [(metric, set(_MATCHER.findall(body))) for metric, body in _SELECTOR.findall(expr)]


def grouping_labels(expr: str) -> set[str]:
    """The labels named by ``by (…)``, ``on (…)``, ``ignoring (…)`` and ``without (…)``."""
    return {label.strip() for group in _GROUPING.findall(expr) for label in group.split(",")} - {""}


_OPENERS, _CLOSERS = "([{", ")]}"
_SET_OPERATOR = re.compile(r"(and|or|unless)\b\s*(?:(?:on|ignoring)\s*\([^)]*\))?\s*")
_COMPARISON = re.compile(r"(==|!=|>=|<=|>|<)\s*(?:bool\s+)?[-+]?\d+(?:\.\d+)?\s*$")


def _depths(expr: str) -> list[int]:
    """The bracket depth at each character of ``expr`` (quoted strings are depth 1)."""
    depths, depth, quote = [], 0, ""
    for char in expr:
        if quote:
            depths.append(depth + 1)
            if char == quote:
                quote = ""
            continue
        if char in "\"'":
            quote = char
            depths.append(depth + 1)
            continue
        if char in _CLOSERS:
            depth -= 1
        depths.append(depth)
        if char in _OPENERS:
            depth += 1
    return depths


def _unwrap(expr: str) -> str:
    """``expr`` without whitespace around it and without parentheses that hold all of it."""
    expr = expr.strip()
    while expr.startswith("(") and expr.endswith(")"):
        inner = _depths(expr)[1:-1]
        if inner and min(inner) < 1:
            break  # "(a) > (b)": the first parenthesis closes before the end
        expr = expr[1:-1].strip()
    return expr


def operands(expr: str) -> list[str]:
    """An alert's conditions: ``expr`` split at its top-level ``and``, ``or`` and ``unless``
    (with their ``on (…)``/``ignoring (…)``), each without a top-level comparison with a
    number (``> 0``, ``== 0``): what each condition reads, which has series whether or not
    the condition holds now. ``A > 600 and on (queue) B unless on (queue) C`` gives
    ``[A, B, C]``."""
    expr = _unwrap(expr)
    depths = _depths(expr)
    parts, start, index = [], 0, 0
    while index < len(expr):
        matched = _SET_OPERATOR.match(expr, index)
        at_word = index > 0 and expr[index - 1].isspace()
        if matched and at_word and depths[index] == 0:
            parts.append(expr[start:index])
            start = index = matched.end()
            continue
        index += 1
    parts.append(expr[start:])
    if len(parts) > 1:
        return [piece for part in parts for piece in operands(part)]
    compared = _COMPARISON.search(expr)
    if compared and depths[compared.start()] == 0:
        expr = expr[: compared.start()]
    return [_unwrap(expr)]
