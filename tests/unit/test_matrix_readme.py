"""The docs' "Features in every mode" table (docs/explanation/guarantees.md, once the README's)
says what the feature-by-mode matrix says (``tests/support/matrix.py``, run by
``tests/integration/test_matrix.py``): ✓ where a feature works, its one-line refusal where it
is refused, ✗ where it is known broken (until the cell is flipped to ``WORKS``, which makes the
table's ✗ a ✓)."""

from __future__ import annotations

from pathlib import Path

import pytest
from matrix import (
    BROKEN,
    CELLS,
    MATRIX,
    README_SECTION,
    WORKS,
    KnownBroken,
    Refused,
    TableError,
    every,
    parse_table,
    render,
    table_of,
)

# The table moved from the README to the docs site's guarantees page (issue 28).
README = Path(__file__).resolve().parents[2] / "docs" / "explanation" / "guarantees.md"


def test_the_readme_table_is_the_matrix() -> None:
    table = parse_table(README.read_text())
    expected = table_of(MATRIX)
    assert list(table) == list(expected), "the README's rows (in order) are the matrix's"
    for feature, cells in expected.items():
        assert table[feature] == cells, (
            f"README row {feature!r} differs from the matrix; paste matrix.render(MATRIX)"
        )


def test_every_row_has_all_six_cells() -> None:
    assert len(CELLS) == 6
    for feature, row in MATRIX.items():
        assert set(row) == set(CELLS), feature


def test_a_table_round_trips_refusals_and_known_broken_cells() -> None:
    matrix = {
        "works": every(),
        "refused in lease": every(lease_exclusive=Refused("no, not here"), lease_shared=WORKS),
        "broken": every(KnownBroken("why")),
    }
    readme = f"# x\n\n{README_SECTION}\n\nSome words.\n\n{render(matrix)}\n\n## Next\n| a |\n"
    table = parse_table(readme)
    assert table == table_of(matrix)
    assert table["refused in lease"]["lease"] == "refused: no, not here"
    assert table["refused in lease"]["lease, shared"] == "✓"
    assert set(table["broken"].values()) == {BROKEN}


def test_a_missing_section_or_a_ragged_row_is_said() -> None:
    with pytest.raises(TableError, match="no section"):
        parse_table("# nothing here\n")
    ragged = f"\n{README_SECTION}\n\n| feature | strict |\n|---|---|\n| a | ✓ | ✓ |\n"
    with pytest.raises(TableError, match="3 cells where the header has 2"):
        parse_table(ragged)
    with pytest.raises(ValueError, match="no cell"):
        every(lease_sharde=WORKS)
