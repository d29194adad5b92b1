"""Problems from a user's JSON-lines file: ``{"prompt", "answer", "solution", "difficulty"}`` per line.

Each non-blank line is one JSON object with a non-empty string ``prompt`` and an ``answer`` (a string, or a
number that is stored as its text), and optionally ``solution`` (gold reasoning text) and ``difficulty``
(a number in [0.1, 1.0]). Either every row gives a difficulty or none does. Other keys are ignored.

The file must be UTF-8 (a byte-order mark is skipped) with lines of at most ``max_line_bytes`` bytes
(:data:`~grpo_gym.validation.MAX_LINE_BYTES`, 16 MiB, by default); anything else is an error naming the file
and the line. A prompt longer than the env's window costs only ``O(context_length)`` tokens per reset (the env
keeps its newest part), so long rows are fine up to that limit.
"""

from __future__ import annotations

import json
import math
import os
import re
from bisect import bisect_right
from typing import Any, NamedTuple

import numpy as np

from grpo_gym.tasks.base import MAX_DIFFICULTY, Problem, Task, Verdict, check_difficulty
from grpo_gym.validation import MAX_LINE_BYTES, check_int, check_path, read_lines

MAX_NUMBER_CHARS = 64
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+\.?")


class Row(NamedTuple):
    """One validated line of the file."""

    prompt: str
    answer: str
    solution: str | None
    difficulty: float | None
    line: int


def parse_number(text: str) -> int | float | None:
    """Read a decimal number (``42``, ``-3.5``, ``1e-3``, ``7.``), or ``None``; length-capped, never raises.

    Integers (no fraction or exponent) come back as ``int`` so they compare exactly.
    """
    s = text.strip()
    if not s or len(s) > MAX_NUMBER_CHARS or not s.isascii() or _NUMBER.fullmatch(s) is None:
        return None
    if _INTEGER.fullmatch(s):
        return int(s.rstrip("."))
    value = float(s)
    return value if math.isfinite(value) else None


def _normalise(text: str) -> str:
    return " ".join(text.split()).casefold()


def _check_row(obj: Any, line: int, where: str) -> Row:
    """Validate one decoded line; ``ValueError`` naming the line and the fix otherwise."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}:{line}: each line must be a JSON object, got {type(obj).__name__}")
    for key in ("prompt", "answer"):
        if key not in obj:
            raise ValueError(f'{where}:{line}: missing key "{key}"; every line needs "prompt" and "answer"')
    prompt, answer = obj["prompt"], obj["answer"]
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f'{where}:{line}: "prompt" must be a non-empty string')
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError(f'{where}:{line}: "answer" must be a non-empty string (or a number)')
    solution = obj.get("solution")
    if solution is not None and not isinstance(solution, str):
        raise ValueError(f'{where}:{line}: "solution" must be a string (gold reasoning text) when given')
    difficulty = obj.get("difficulty")
    if difficulty is not None:
        if isinstance(difficulty, bool) or not isinstance(difficulty, (int, float)):
            raise ValueError(f'{where}:{line}: "difficulty" must be a number in [0.1, 1.0]')
        try:
            difficulty = check_difficulty(difficulty)
        except ValueError as error:
            raise ValueError(f"{where}:{line}: {error}") from None
    return Row(prompt, answer.strip(), solution, difficulty, line)


def load_rows(path: str | os.PathLike[str], max_line_bytes: int = MAX_LINE_BYTES) -> list[Row]:
    """Read and validate the file at ``path``; ``ValueError`` (naming the line and the fix) on any problem.

    :param path: the JSON-lines file
    :param max_line_bytes: the longest accepted line, in bytes (see the module docstring)
    """
    where = check_path("path", path, what="a JSON-lines file")
    if not os.path.isfile(where):
        raise ValueError(f"jsonl task: no file at {where!r}; pass path= to a JSON-lines file")
    rows: list[Row] = []
    for line, text in read_lines(where, max_line_bytes=max_line_bytes, what="jsonl task file"):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}:{line}: not valid JSON ({error.msg}); write one object per line") from None
        except RecursionError:
            raise ValueError(f"{where}:{line}: JSON nested too deeply; write one flat object per line") from None
        rows.append(_check_row(obj, line, where))
    if not rows:
        raise ValueError(f'{where}: the file has no rows; add lines like {{"prompt": "2+2?", "answer": "4"}}')
    graded = [row.difficulty is not None for row in rows]
    if any(graded) and not all(graded):
        missing = rows[graded.index(False)].line
        raise ValueError(f'{where}:{missing}: no "difficulty"; either every line gives one or none does')
    return rows


class JsonlTask(Task):
    """Problems read from a JSON-lines file (see the module docstring for the format).

    Sampling: when rows carry difficulties, uniform among rows with ``difficulty <= level`` (the easiest
    rows when none qualifies), so hardness is monotone in the level; otherwise uniform over all rows.
    Verifying: numeric comparison when both sides read as numbers (integers exactly; otherwise within
    ``1e-6 * max(1, |reference|)``), else exact match after collapsing whitespace and case-folding.

    :param path: the JSON-lines file
    :param max_line_bytes: the longest accepted line, in bytes (16 MiB by default)
    """

    name = "jsonl"

    def __init__(self, path: str | os.PathLike[str], max_line_bytes: int = MAX_LINE_BYTES):
        self.path = check_path("path", path, what="a JSON-lines file")
        self.max_line_bytes = check_int("max_line_bytes", max_line_bytes, low=1)
        rows = load_rows(self.path, self.max_line_bytes)
        self.graded = rows[0].difficulty is not None
        if self.graded:
            rows.sort(key=lambda row: row.difficulty)  # type: ignore[arg-type, return-value]
        self.rows = rows
        self._levels = [row.difficulty or MAX_DIFFICULTY for row in rows]
        self._easiest = self._levels.count(self._levels[0])

    def __len__(self) -> int:
        return len(self.rows)

    def sample(self, difficulty: float, rng: np.random.Generator) -> Problem:
        """Draw one row eligible at ``difficulty`` (one ``rng.integers`` call)."""
        difficulty = check_difficulty(difficulty)
        if self.graded:
            eligible = bisect_right(self._levels, difficulty + 1e-9) or self._easiest
        else:
            eligible = len(self.rows)
        index = int(rng.integers(eligible))
        row = self.rows[index]
        return Problem(
            prompt=row.prompt,
            answer=row.answer,
            task=self.name,
            difficulty=difficulty,
            solution=row.solution,
            metadata={"line": row.line, "row_difficulty": row.difficulty},
        )

    def verify(self, problem: Problem, answer: str) -> Verdict:
        """Correct iff ``answer`` matches ``problem.answer`` numerically, or as normalised text."""
        if not isinstance(answer, str):
            return Verdict(False, "answer is not text")
        if not answer.strip():
            return Verdict(False, "empty answer")
        if self.answers_agree(problem, answer, problem.answer):
            return Verdict(True)
        return Verdict(False, "wrong value" if parse_number(answer) is not None else "does not match the answer")

    def solution(self, problem: Problem) -> tuple[str, str]:
        """``(the row's solution or "", the answer)``."""
        return problem.solution or "", problem.answer

    def answers_agree(self, problem: Problem, first: str, second: str) -> bool:
        """Numeric agreement when both read as numbers, else equal after normalising whitespace and case."""
        a, b = parse_number(first), parse_number(second)
        if a is not None and b is not None:
            if isinstance(a, int) and isinstance(b, int):
                return a == b
            return abs(a - b) <= 1e-6 * max(1.0, abs(b))
        return _normalise(first) == _normalise(second)
