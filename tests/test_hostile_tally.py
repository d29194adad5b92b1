"""The tallies of the hostile rounds (benchmarks/hostile_round3.md, issue 37; benchmarks/hostile_round4.md, issue 48;
benchmarks/hostile_round5.md, issue 60) hold: every case names a test that exists, no case is silent, a hang, a crash,
data loss or code execution now, at most 2 stay unhelpful (each with its reason), and each summary's counts are its
table's."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: each round's page and the fewest cases its table lists
TALLIES = {
    ROOT / "benchmarks" / "hostile_round3.md": 60,
    ROOT / "benchmarks" / "hostile_round4.md": 20,
    ROOT / "benchmarks" / "hostile_round5.md": 43,
}
CLASSES = ("silent", "hang", "crash", "data loss", "code execution", "unhelpful", "good")
BAD = ("silent", "hang", "crash", "data loss", "code execution")


def cases(tally: Path) -> list[dict[str, str]]:
    """The table's rows: number, surface, input, before, now, class (now), test."""
    rows = []
    for line in tally.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].isdigit():
            number, surface, case, before, now, kind, test = cells
            rows.append(
                {"n": number, "surface": surface, "case": case, "before": before, "now": now, "class": kind,
                 "test": test}
            )  # fmt: skip
    return rows


@pytest.mark.parametrize("tally", TALLIES, ids=lambda path: path.name)
def test_every_case_is_classified_and_none_is_bad(tally: Path) -> None:
    rows = cases(tally)
    assert len(rows) >= TALLIES[tally]
    assert [int(row["n"]) for row in rows] == list(range(1, len(rows) + 1))
    for row in rows:
        assert row["class"] in CLASSES and row["before"].split(":")[0] in CLASSES, row
        assert row["class"] not in BAD, row
    unhelpful = [row for row in rows if row["class"] == "unhelpful"]
    assert len(unhelpful) <= 2
    text = tally.read_text(encoding="utf-8")
    for row in unhelpful:  # each named below the table, with the reason it stays
        assert re.search(rf"^- case {row['n']}\b.*\bbecause\b", text, re.MULTILINE), row


@pytest.mark.parametrize("tally", TALLIES, ids=lambda path: path.name)
def test_every_case_names_a_test_that_exists(tally: Path) -> None:
    defined: dict[str, set[str]] = {}
    for row in cases(tally):
        for reference in re.findall(r"`([^`]+)`", row["test"]):
            file, _, name = reference.partition("::")
            if file not in defined:
                tree = ast.parse((ROOT / "tests" / file).read_text(encoding="utf-8"))
                defined[file] = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
            assert name.startswith("test_") and name in defined[file], (row["n"], reference)
        assert re.search(r"`[^`]+::test_", row["test"]), row


@pytest.mark.parametrize("tally", TALLIES, ids=lambda path: path.name)
def test_the_summary_counts_are_the_tables(tally: Path) -> None:
    rows = cases(tally)
    text = tally.read_text(encoding="utf-8")
    for column in ("before", "class"):
        counts = Counter(row[column].split(":")[0] for row in rows)
        line = "Before" if column == "before" else "Now"
        expected = ", ".join(f"{kind} {counts[kind]}" for kind in CLASSES)
        assert f"**{line}** ({len(rows)} cases): {expected}" in text
