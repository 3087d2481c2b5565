"""Every example runs: each fenced ``python`` block of README.md and docs/**/*.md (issue 28).

The conventions, for whoever writes the docs:

- a ```python block is run as a script, in a subprocess (``sys.executable``, in an empty
  temporary directory, the repository on PYTHONPATH) with ``CRONLOCK_DATABASE_URL`` set to a
  freshly migrated database of its own; it must exit 0 within 60 s;
- ``<!-- check: typecheck -->`` on the line just before the fence: type-checked only, with mypy
  (strict; one mypy run for every such block), for an example that needs a server or a
  service the suite does not start;
- ``<!-- check: skip REASON -->``: not checked (listed as skipped, with its reason: keep rare);
- ``<!-- check: continue -->``: the block is appended to the page's previous python block and
  checked with it, as that block is (so a page can explain a script in parts);
- a pymdownx snippet line inside a block (``--8<-- "path"``, ``"path:START:END"`` lines or
  ``"path:NAME"`` for a ``--8<-- [start:NAME]`` section) is replaced by the file's text (paths
  from the repository's root, as mkdocs.yml's ``base_path``).

Each check is its own test, named by the file and line of its (first) block.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 60
TYPECHECK_TIMEOUT = 300
LANGUAGES = frozenset({"python", "py"})
CHECKS = frozenset({"typecheck", "skip", "continue"})

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*)$")
_CHECK = re.compile(r"^\s*<!--\s*check:\s*(?P<word>[\w-]+)(?:\s+(?P<reason>.*?))?\s*-->\s*$")
_SNIPPET = re.compile(
    r"""^(?P<indent>\s*)-{1,}8<-{1,}\s+(?P<quote>["'])(?P<spec>.+)(?P=quote)\s*$"""
)


@dataclass
class Block:
    """One fenced python block: where it is, what it holds, what its annotation says."""

    path: str  # from the repository's root
    line: int  # the fence's, 1-based
    code: str
    check: str | None = None  # "typecheck", "skip", "continue" or None (run)
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class Example:
    """What is checked as one script: a block and the blocks that continue it."""

    blocks: list[Block] = field(default_factory=list)

    @property
    def mode(self) -> str:
        check = self.blocks[0].check
        return check if check in ("typecheck", "skip") else "run"

    @property
    def name(self) -> str:
        first = self.blocks[0]
        more = "".join(f"+{block.line}" for block in self.blocks[1:])
        return f"{first.where}{more}"

    @property
    def script(self) -> str:
        return "".join(f"# --- {block.where}\n{block.code}\n" for block in self.blocks)

    def locate(self, line: int) -> str:
        """Where line ``line`` (1-based) of the script is in the Markdown (a snippet's lines
        count as its one line's)."""
        start = 1
        for block in self.blocks:
            length = block.code.count("\n") + 2  # the header line, the code, the blank line
            if line < start + length:
                offset = max(line - start - 1, 0)
                if "8<-" in block.code:
                    return block.where
                return f"{block.path}:{block.line + 1 + offset}"
            start += length
        return self.name

    def explain(self, output: str, script_name: str) -> str:
        """``output`` with each reference to a line of the script given its Markdown line."""

        def mapped(match: re.Match[str]) -> str:
            return f"{match[0]} [{self.locate(int(match['line']))}]"

        name = re.escape(script_name)
        return re.sub(rf'{name}"?(?::|, line )(?P<line>\d+)', mapped, output)


def markdown_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [path for path in files if path.is_file()]


def parse_blocks(text: str, path: str) -> list[Block]:
    """The page's python blocks, in order (fences of other languages are passed over whole,
    so that a python fence shown inside one is not taken for a block)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        language = (opening["info"].split() or [""])[0].lstrip("{.").lower()
        start = index
        body: list[str] = []
        index += 1
        while index < len(lines):
            closing = lines[index].strip()
            if closing.startswith(fence) and set(closing) == {fence[0]}:
                break
            line = lines[index]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            index += 1
        index += 1
        if language not in LANGUAGES:
            continue
        block = Block(path=path, line=start + 1, code="\n".join(body) + "\n")
        annotation = _CHECK.match(lines[start - 1]) if start > 0 else None
        if annotation is not None:
            block.check = annotation["word"]
            block.reason = annotation["reason"] or ""
        blocks.append(block)
    return blocks


def resolve_snippets(code: str, root: Path = ROOT) -> str:
    """``code`` with each snippet line replaced by what it names."""
    out: list[str] = []
    for line in code.splitlines():
        snippet = _SNIPPET.match(line)
        if snippet is None:
            out.append(line)
            continue
        spec = snippet["spec"]
        name, _, selector = spec.partition(":")
        text = (root / name).read_text(encoding="utf-8")
        included = text.splitlines()
        if re.fullmatch(r"\d*(:\d*)?", selector) and selector:
            first, _, last = selector.partition(":")
            included = included[int(first or 1) - 1 : int(last) if last else None]
        elif selector:
            begin = next(
                (i for i, text_line in enumerate(included) if f"[start:{selector}]" in text_line),
                None,
            )
            assert begin is not None, f"no section {selector!r} in {name}"
            end = next(
                i for i, text_line in enumerate(included) if f"[end:{selector}]" in text_line
            )
            included = included[begin + 1 : end]
        out += [snippet["indent"] + text_line for text_line in included]
    return "\n".join(out) + "\n"


def collect() -> tuple[list[Example], list[str]]:
    """Every example of the docs, and what is wrong with the annotations (for a test)."""
    examples: list[Example] = []
    problems: list[str] = []
    for markdown in markdown_files():
        path = markdown.relative_to(ROOT).as_posix()
        last: Example | None = None
        for block in parse_blocks(markdown.read_text(encoding="utf-8"), path):
            if block.check is not None and block.check not in CHECKS:
                problems.append(f"{block.where}: unknown check {block.check!r}")
            if block.check == "skip" and not block.reason:
                problems.append(f"{block.where}: a skip says why (<!-- check: skip REASON -->)")
            try:
                block.code = resolve_snippets(block.code)
            except (OSError, AssertionError, StopIteration) as exc:
                problems.append(f"{block.where}: snippet: {exc!r}")
            if block.check == "continue":
                if last is None:
                    problems.append(f"{block.where}: continues no earlier python block")
                    continue
                last.blocks.append(block)
                continue
            last = Example([block])
            examples.append(last)
    return examples, problems


EXAMPLES, PROBLEMS = collect()


def _by_mode(mode: str) -> list[Any]:
    return [pytest.param(example, id=example.name) for example in EXAMPLES if example.mode == mode]


def test_annotations_are_well_formed() -> None:
    assert PROBLEMS == []


@pytest.mark.parametrize("example", _by_mode("run"))
def test_example_runs(example: Example, database_url: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(example.script, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONLOCK_")}
    env["PYTHONPATH"] = str(ROOT)
    env["CRONLOCK_DATABASE_URL"] = database_url
    try:
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        output = "".join(str(part) for part in (exc.stdout, exc.stderr) if part)
        pytest.fail(f"{example.name} still ran after {RUN_TIMEOUT} s:\n{output}")
    output = example.explain(f"{done.stdout}\n{done.stderr}", script.name)
    assert done.returncode == 0, f"{example.name} exited {done.returncode}:\n{output}"


@pytest.fixture(scope="module")
def typecheck_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """mypy's errors for every typecheck example, by example name (one run for all)."""
    examples = [example for example in EXAMPLES if example.mode == "typecheck"]
    work = tmp_path_factory.mktemp("typecheck")
    files = {}
    for number, example in enumerate(examples):
        script = work / f"docs_example_{number}.py"
        script.write_text(example.script, encoding="utf-8")
        files[script.name] = example.name
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--show-error-codes",
            "--cache-dir",
            # One per xdist worker: two mypy runs never share a cache directory.
            str(ROOT / ".mypy_cache" / f"docs-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"),
            *(str(work / name) for name in files),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "MYPYPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=TYPECHECK_TIMEOUT,
        check=False,
    )
    assert checked.returncode in (0, 1), f"mypy failed to run:\n{checked.stdout}{checked.stderr}"
    errors: dict[str, list[str]] = {name: [] for name in files.values()}
    for line in checked.stdout.splitlines():
        source = Path(line.split(":", 1)[0]).name
        if source in files:
            example = next(e for e in examples if e.name == files[source])
            errors[files[source]].append(example.explain(line, source))
    return errors


@pytest.mark.parametrize("example", _by_mode("typecheck"))
def test_example_typechecks(example: Example, typecheck_errors: dict[str, list[str]]) -> None:
    assert typecheck_errors[example.name] == [], "\n" + example.script


@pytest.mark.parametrize("example", _by_mode("skip"))
def test_example_skipped(example: Example) -> None:
    pytest.skip(f"{example.name}: {example.blocks[0].reason}")


# -- the collector itself --------------------------------------------------------------------


def _page(*parts: str) -> str:
    return "\n".join(parts) + "\n"


def test_blocks_are_found_with_their_annotations() -> None:
    page = _page(
        "# Title",
        "```python",
        "print(1)",
        "```",
        "<!-- check: typecheck -->",
        "```py title='x'",
        "x: int = 1",
        "```",
        "````markdown",
        "```python",
        "not a block",
        "```",
        "````",
        "- a list",
        "",
        "    <!-- check: skip needs a mail server -->",
        "    ```python",
        "    send()",
        "    ```",
        "```sh",
        "echo",
        "```",
    )
    blocks = parse_blocks(page, "docs/x.md")
    assert [(b.line, b.check, b.reason, b.code) for b in blocks] == [
        (2, None, "", "print(1)\n"),
        (6, "typecheck", "", "x: int = 1\n"),
        (17, "skip", "needs a mail server", "send()\n"),
    ]


def test_snippets_are_read(tmp_path: Path) -> None:
    (tmp_path / "ex.py").write_text(
        _page("a = 1", "# --8<-- [start:part]", "b = 2", "# --8<-- [end:part]", "c = 3")
    )
    assert resolve_snippets('--8<-- "ex.py"\nx = 0\n', tmp_path).splitlines()[0] == "a = 1"
    assert resolve_snippets('  --8<-- "ex.py:part"', tmp_path) == "  b = 2\n"
    assert resolve_snippets("--8<-- 'ex.py:1:2'", tmp_path) == "a = 1\n# --8<-- [start:part]\n"


def test_examples_are_named_by_file_and_line() -> None:
    names = [example.name for example in EXAMPLES]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"[\w./-]+\.md:\d+(\+\d+)*", name) for name in names)


def test_a_continued_example_names_its_markdown_lines() -> None:
    page = _page("# t", "", "```python", "a = 1", "```", "<!-- check: continue -->", "```python")
    example = Example(parse_blocks(page + _page("b = 2", "1 / 0", "```"), "x.md"))
    assert example.name == "x.md:3+7"
    traceback = 'File "/tmp/t/example.py", line 6, in <module>'
    assert example.explain(traceback, "example.py").endswith("line 6 [x.md:9], in <module>")
