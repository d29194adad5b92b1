"""Every figure the README and the docs quote is the one benchmarks/RESULTS.md holds now (benchmarks/figures.py):
a page that quotes another fails here, named with its line; a re-measurement changes every page with one command."""

from __future__ import annotations

from pathlib import Path

from benchmarks.figures import FIGURES, RESULTS, current, mismatches, pages, quoted, rewrite, unrecorded


def test_every_quoted_figure_is_the_current_one() -> None:
    assert mismatches(current(RESULTS.read_text(encoding="utf-8")), pages()) == []


def test_every_figure_is_quoted_somewhere() -> None:
    used = {name for path in pages() for _, name, _ in quoted(path)}
    assert sorted(set(FIGURES) - used) == []


def test_a_changed_result_names_every_page_that_quotes_it() -> None:
    results = RESULTS.read_text(encoding="utf-8")
    figures = current(results)
    old = f"| after GRPO | {figures['demo.after']}"
    assert old in results
    changed = current(results.replace(old, "| after GRPO | 12.3%", 1))
    assert changed["demo.after"] == "12.3%" and changed["demo.before"] == figures["demo.before"]
    wrong = mismatches(changed, pages())
    quoting = {p.name for p in pages() if any(name == "demo.after" for _, name, _ in quoted(p))}
    assert {"README.md", "index.md", "getting-started.md", "benchmarks.md"} <= quoting
    for page in quoting:
        assert any(f"{page}:" in line and "demo.after as" in line and "RESULTS.md has 12.3%" in line for line in wrong)


def test_rewrite_puts_the_current_figure_in(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("from 1.0%<!--fig:demo.before--> to **+9.9<!--fig:demo.change--> points**")
    figures = {"demo.before": "46.0%", "demo.after": "66.5%", "demo.change": "+20.5"}
    assert rewrite(figures, page)
    assert page.read_text() == "from 46.0%<!--fig:demo.before--> to **+20.5<!--fig:demo.change--> points**"
    assert not rewrite(figures, page)


def test_an_unknown_figure_name_is_named(tmp_path: Path, monkeypatch) -> None:
    import benchmarks.figures as figures_module

    page = tmp_path / "page.md"
    page.write_text("0.5x<!--fig:no.such-->\n")
    monkeypatch.setattr(figures_module, "ROOT", tmp_path)
    assert mismatches({}, [page]) == ["page.md:1: quotes 'no.such', which is no figure of benchmarks/figures.py"]


def test_every_figure_a_page_writes_is_in_the_record() -> None:
    """Beyond the tagged figures: a number with a unit in a page's prose (35.2%, 0.53x, 8.3 minutes, 948 MiB) that
    RESULTS.md does not hold (measured by hand and never recorded, or changed in the record since) is named with its
    page and line."""
    results = RESULTS.read_text(encoding="utf-8")
    assert unrecorded(results, pages()) == []
    named = [line for line in unrecorded(results.replace("35.2%", "36.0%"), pages()) if "35.2%" in line]
    assert named and all(line.startswith("docs/benchmarks.md:") and "in no section" in line for line in named)


def test_the_figure_pattern_reads_numbers_with_their_units() -> None:
    from benchmarks.figures import FIGURE

    text = "at 35.2% and 0.53x, in 8.3 minutes, +27.0 points, 948 MiB, 174 tokens/s; 200 problems, K=4, 3e-5"
    assert [m[0] for m in FIGURE.finditer(text)] == [
        "35.2%", "0.53x", "8.3 minutes", "+27.0 points", "948 MiB", "174 tokens/s"
    ]  # fmt: skip
