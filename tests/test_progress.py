"""Progress: a bar on a terminal, a line per tenth of the work elsewhere (a file, a pipe)."""

from __future__ import annotations

import io

from algorithms.common.progress import ProgressBar, ProgressLines, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_lines_per_tenth_when_the_output_is_not_a_terminal() -> None:
    out = io.StringIO()
    shown = progress(50, "cold start", out)
    assert isinstance(shown, ProgressLines)
    for step in range(1, 51):
        shown.update(step)
    lines = out.getvalue().splitlines()
    assert len(lines) == 10 and lines[0].startswith("cold start: 5/50 (10%), ") and "s left" in lines[0]
    assert lines[-1].startswith("cold start: 50/50 (100%)")
    shown.update(50)  # nothing new to say
    assert len(out.getvalue().splitlines()) == 10


def test_a_jump_past_several_tenths_prints_one_line() -> None:
    out = io.StringIO()
    shown = ProgressLines(16, "GRPO", out)
    shown.update(8)
    shown.update(16)
    assert [line.split(",")[0] for line in out.getvalue().splitlines()] == ["GRPO: 8/16 (50%)", "GRPO: 16/16 (100%)"]


def test_work_past_the_total_leaves_no_negative_time() -> None:
    out = io.StringIO()
    ProgressLines(64, "GRPO", out).update(128)  # one iteration of 128 completions for -n 64
    assert out.getvalue().startswith("GRPO: 128/64 (200%), ") and out.getvalue().endswith("about 0 s left\n")


def test_a_bar_on_a_terminal() -> None:
    shown = progress(4, "x", Terminal())
    assert isinstance(shown, ProgressBar)
    shown.update(3)
    shown.close()
