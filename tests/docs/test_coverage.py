"""The docs site covers the whole surface: every CLI command, public name, HTTP route, metric
and environment variable (issue 28), checked on the site as built, not by eye.

The site is built once for this module (``mkdocs build`` in a subprocess, from the repository's
mkdocs.yml; a branch without one builds the reference pages alone with ``REFERENCE_CONFIG``).
What each check expects is read from the code itself: the click group walked, ``__all__``,
the application's OpenAPI schema and routes, a scrape of a migrated database, the
``CRONLOCK_*`` names in cronlock's source. The last tests hold the checks themselves to
noticing one entry gone.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from cronlock import App, Database, Run
from cronlock.cli import cli
from cronlock.observe.prometheus import scrape

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
PUBLIC_MODULES = ("cronlock", "cronlock.http", "cronlock.testing")
ENV_NAME = re.compile(r"\bCRONLOCK_[A-Z0-9_]*[A-Z0-9]\b")
BUILD_TIMEOUT = 120

# The settings the reference pages need, for a checkout without the site's mkdocs.yml.
REFERENCE_CONFIG: dict[str, Any] = {
    "site_name": "cronlock",
    "docs_dir": str(DOCS),
    "exclude_docs": "*.py\n",
    "theme": {"name": "material"},
    "markdown_extensions": [
        "attr_list",
        "tables",
        {"toc": {"permalink": True}},
        "mkdocs-click",
        {"pymdownx.snippets": {"base_path": [str(ROOT)], "check_paths": True}},
        "pymdownx.superfences",
    ],
    "plugins": [
        "search",
        {"mkdocstrings": {"handlers": {"python": {"paths": [str(ROOT)]}}}},
    ],
    "hooks": [str(REFERENCE / "hooks.py")],
}


# -- the site, parsed ------------------------------------------------------------------------


@dataclass
class Page:
    """One built page: its element ids, its headings' text, its table rows (cells' text,
    code spans kept as `x`) and all its text."""

    ids: set[str] = field(default_factory=set)
    headings: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    text: str = ""


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self._heading: list[str] | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "id" and value:
                self.page.ids.add(value)
        if re.fullmatch(r"h[1-6]", tag):
            self._heading = []
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "code":
            self._data("`")

    def handle_endtag(self, tag: str) -> None:
        if tag == "code":
            self._data("`")
        elif re.fullmatch(r"h[1-6]", tag) and self._heading is not None:
            self.page.headings.append(" ".join("".join(self._heading).split()).rstrip("¶ "))
            self._heading = None
        elif tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.page.rows.append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        self._data(data)

    def _data(self, data: str) -> None:
        for part in (self._heading, self._cell, self._text):
            if part is not None:
                part.append(data)


def read_page(html: str) -> Page:
    reader = _Reader()
    reader.feed(html)
    reader.close()
    reader.page.text = " ".join("".join(reader._text).split())
    return reader.page


@dataclass
class Site:
    pages: dict[str, Page]  # by the source page's path under docs/, "reference/cli.md"

    def page(self, source: str) -> Page:
        assert source in self.pages, f"docs/{source} is not on the built site"
        return self.pages[source]

    @property
    def text(self) -> str:
        return "\n".join(page.text for page in self.pages.values())

    @property
    def ids(self) -> set[str]:
        return {anchor for page in self.pages.values() for anchor in page.ids}

    @property
    def headings(self) -> set[str]:
        return {heading for page in self.pages.values() for heading in page.headings}


def _source_of(html: Path, site_dir: Path) -> str:
    """The docs/ page a built page came from (mkdocs' directory URLs: a/b/index.html is
    a/b.md or a/b/index.md; the home page index.md or README.md)."""
    relative = html.relative_to(site_dir).parent.as_posix()
    if relative == ".":
        return "README.md" if (DOCS / "README.md").is_file() else "index.md"
    return f"{relative}.md" if (DOCS / f"{relative}.md").is_file() else f"{relative}/index.md"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    """The docs site, built now (about 10 s)."""
    work = tmp_path_factory.mktemp("site")
    config = ROOT / "mkdocs.yml"
    if not config.is_file():
        config = work / "mkdocs.yml"
        config.write_text(yaml.safe_dump(REFERENCE_CONFIG))
    site_dir = work / "site"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONLOCK_")}
    env["PYTHONPATH"] = str(ROOT)
    env["NO_MKDOCS_2_WARNING"] = "1"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "-f", str(config), "-d", str(site_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )
    assert built.returncode == 0, f"mkdocs build failed:\n{built.stdout}\n{built.stderr}"
    pages = {
        _source_of(html, site_dir): read_page(html.read_text(encoding="utf-8"))
        for html in sorted(site_dir.rglob("index.html"))
        if (site_dir / "search") not in html.parents
    }
    return Site(pages)


# -- what the code has -----------------------------------------------------------------------


def command_paths() -> list[str]:
    """Every command of the click group, "cronlock jobs list" and the like."""

    def walk(command: click.Command, path: list[str], ctx: click.Context) -> Iterator[str]:
        yield " ".join(path)
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, name
                if not sub.hidden:
                    yield from walk(sub, [*path, name], click.Context(sub, ctx, info_name=name))

    return list(walk(cli, ["cronlock"], click.Context(cli, info_name="cronlock")))


def public_names() -> list[str]:
    """Every public name, qualified: cronlock.__all__, and each public module's."""
    names = []
    for module_name in PUBLIC_MODULES:
        if importlib.util.find_spec(module_name) is None:
            continue  # cronlock.testing, once it exists
        module = importlib.import_module(module_name)
        names += [f"{module_name}.{name}" for name in module.__all__]
    return names


def _api() -> Any:
    from cronlock.http import create_api

    return create_api(App(), token="coverage")


def api_operations() -> list[str]:
    """Every operation of the OpenAPI schema, "GET /jobs/{job_id}"."""
    paths = _api().openapi()["paths"]
    return [
        f"{method.upper()} {path}"
        for path, item in paths.items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    ]


def other_routes() -> list[str]:
    """The routes outside the schema: FastAPI's own pages, the dashboard's (mounted at
    /dashboard)."""
    from cronlock.http import DASHBOARD_PATH, create_dashboard

    paths = [
        route.path
        for route in _api().routes
        if hasattr(route, "path") and not getattr(route, "include_in_schema", True)
    ]
    dashboard = create_dashboard(App(), token="coverage").routes
    return sorted({*paths, *(DASHBOARD_PATH + route.path for route in dashboard)})  # type: ignore[attr-defined]


def env_names() -> list[str]:
    """Every CRONLOCK_* name in cronlock's source (code, templates)."""
    found: set[str] = set()
    for package in ("cronlock", "cronlock_bench"):
        for path in (ROOT / package).rglob("*"):
            if path.suffix in (".py", ".html", ".js") and path.is_file():
                found.update(ENV_NAME.findall(path.read_text(encoding="utf-8")))
    return sorted(found)


def metric_families(families: list[Any]) -> dict[str, list[str]]:
    """Each metric's exposed name (a counter's with _total) and its labels."""
    exposed = {}
    for family in families:
        name = f"{family.name}_total" if family.type == "counter" else family.name
        exposed[name] = list(family._labelnames)
    return exposed


# -- the checks ------------------------------------------------------------------------------


def missing_commands(site: Site, paths: list[str]) -> list[str]:
    assert "::: mkdocs-click" not in site.page("reference/cli.md").text, (
        "mkdocs.yml's markdown_extensions must list mkdocs-click"
    )
    headings = {heading.strip("`") for heading in site.headings}
    return [path for path in paths if path not in headings]


def missing_names(site: Site, names: list[str]) -> list[str]:
    assert "::: cronlock" not in site.page("reference/python-api.md").text, (
        "mkdocs.yml's plugins must list mkdocstrings"
    )
    ids = site.ids
    return [name for name in names if name not in ids]


def missing_operations(site: Site, operations: list[str]) -> list[str]:
    headings = set(site.page("reference/http-api.md").headings)
    assert "Endpoints" in headings, "mkdocs.yml's hooks must list docs/reference/hooks.py"
    return [operation for operation in operations if operation not in headings]


def missing_in_text(site: Site, source: str, words: list[str]) -> list[str]:
    text = site.page(source).text
    return [word for word in words if f"`{word}`" not in text]


def missing_metrics(site: Site, metrics: dict[str, list[str]]) -> list[str]:
    """Metrics with no row of their own (Metric, Type, Labels, Meaning) whose Labels are
    exactly theirs."""
    rows = {row[0].strip("`"): row for row in site.page("reference/metrics.md").rows if row}
    missing = []
    for name, labels in metrics.items():
        row = rows.get(name)
        if row is None or len(row) < 3 or set(re.findall(r"`([^`]+)`", row[2])) != set(labels):
            missing.append(name)
    return missing


def missing_env(site: Site, names: list[str]) -> list[str]:
    rows = {row[0].strip("`") for row in site.page("reference/configuration.md").rows if row}
    return [name for name in names if name not in rows]


def documented_rows(site: Site, source: str, prefix: str) -> set[str]:
    """What the page's tables have rows for (their first cell), so that none documents a
    name the code no longer has."""
    names = {row[0].strip("`") for row in site.page(source).rows if row}
    return {name for name in names if name.startswith(prefix)}


def test_every_command_is_documented(site: Site) -> None:
    paths = command_paths()
    assert "cronlock jobs list" in paths
    assert missing_commands(site, paths) == []


def test_every_public_name_is_documented(site: Site) -> None:
    names = public_names()
    assert "cronlock.App" in names and "cronlock.http.create_api" in names
    assert missing_names(site, names) == []


def test_every_api_operation_is_documented(site: Site) -> None:
    operations = api_operations()
    assert "POST /jobs" in operations
    assert missing_operations(site, operations) == []


def test_every_other_route_is_documented(site: Site) -> None:
    routes = other_routes()
    assert "/openapi.json" in routes and "/dashboard/jobs" in routes
    assert missing_in_text(site, "reference/http-api.md", routes) == []


async def test_every_metric_is_documented_with_its_labels(site: Site, database: Database) -> None:
    app = App()

    @app.periodic("docs-check", cron="*/5 * * * *")
    async def every_five(run: Run) -> None: ...

    metrics = metric_families(await scrape(database, app.tasks.values()))
    assert metrics["cronlock_jobs"] == ["queue", "status"]
    assert "cronlock_jobs_processed_total" in metrics
    assert missing_metrics(site, metrics) == []
    assert documented_rows(site, "reference/metrics.md", "cronlock_") - set(metrics) == set()


def test_every_environment_variable_is_documented(site: Site) -> None:
    names = env_names()
    assert "CRONLOCK_DATABASE_URL" in names
    assert missing_env(site, names) == []
    assert documented_rows(site, "reference/configuration.md", "CRONLOCK_") - set(names) == set()


# -- the checks can fail ---------------------------------------------------------------------


def test_a_missing_entry_is_noticed(site: Site) -> None:
    """Each check names what a page lacks: one row, heading or anchor taken out of a
    well-formed page is reported."""
    metrics = site.page("reference/metrics.md")
    dropped_metric = [row for row in metrics.rows if row and row[0] != "`cronlock_jobs_due`"]
    assert missing_metrics(
        _replace(site, "reference/metrics.md", rows=dropped_metric),
        {"cronlock_jobs_due": ["queue"], "cronlock_jobs": ["queue", "status"]},
    ) == ["cronlock_jobs_due"]
    relabelled = [
        [*row[:2], "`queue`", *row[3:]] if row and row[0] == "`cronlock_jobs`" else row
        for row in metrics.rows
    ]
    assert missing_metrics(
        _replace(site, "reference/metrics.md", rows=relabelled),
        {"cronlock_jobs": ["queue", "status"]},
    ) == ["cronlock_jobs"]

    config = site.page("reference/configuration.md")
    rows = [row for row in config.rows if row and row[0] != "`CRONLOCK_SCHEMA`"]
    assert missing_env(_replace(site, "reference/configuration.md", rows=rows), env_names()) == [
        "CRONLOCK_SCHEMA"
    ]

    cli_page = site.page("reference/cli.md")
    headings = [h for h in cli_page.headings if h.strip("`") != "cronlock task run-now"]
    assert missing_commands(
        _replace(site, "reference/cli.md", headings=headings), command_paths()
    ) == ["cronlock task run-now"]

    http = site.page("reference/http-api.md")
    headings = [h for h in http.headings if h != "DELETE /queues/{name}"]
    assert missing_operations(
        _replace(site, "reference/http-api.md", headings=headings), api_operations()
    ) == ["DELETE /queues/{name}"]

    without = Site(
        {
            source: _replace(site, source, ids=page.ids - {"cronlock.Backoff"}).pages[source]
            for source, page in site.pages.items()
        }
    )
    assert missing_names(without, public_names()) == ["cronlock.Backoff"]


def _replace(site: Site, source: str, **changes: Any) -> Site:
    page = site.page(source)
    changed = Page(
        ids=changes.get("ids", page.ids),
        headings=changes.get("headings", page.headings),
        rows=changes.get("rows", page.rows),
        text=changes.get("text", page.text),
    )
    return Site({**site.pages, source: changed})
