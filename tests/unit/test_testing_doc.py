"""docs/how-to/testing.md shows code that runs: each of its Python blocks is, word for word, a
part of tests/integration/test_testing_kit.py (the suite runs that file). And the kit's server
is found where the page says: $CRONLOCK_TEST_DATABASE_URL, the ini option, then
$CRONLOCK_DATABASE_URL."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cronlock.errors import ConfigurationError
from cronlock.testing import server_url

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "how-to" / "testing.md"
EXAMPLE = ROOT / "tests" / "integration" / "test_testing_kit.py"


def test_every_python_block_of_the_page_is_in_the_example() -> None:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)
    example = EXAMPLE.read_text()
    assert len(blocks) >= 6
    missing = [block.splitlines()[0] for block in blocks if block not in example]
    assert missing == []


def test_the_server_is_found_in_the_documented_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CRONLOCK_TEST_DATABASE_URL", raising=False)
    monkeypatch.delenv("CRONLOCK_DATABASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match="CRONLOCK_TEST_DATABASE_URL"):
        server_url(None)
    monkeypatch.setenv("CRONLOCK_DATABASE_URL", "postgresql://app@db/fallback")
    assert server_url(None).database == "fallback"
    assert server_url("postgresql://me@db/ini").database == "ini"
    monkeypatch.setenv("CRONLOCK_TEST_DATABASE_URL", "postgresql://me@db/first")
    assert server_url("postgresql://me@db/ini").database == "first"
