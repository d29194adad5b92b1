"""Problems from a user's JSON-lines file: ``{"prompt", "answer", "solution", "difficulty"}`` per line.

Each non-blank line is one JSON object with a non-empty string ``prompt`` and an ``answer`` (a string, or a
number that is stored as its text), and optionally ``solution`` (gold reasoning text) and ``difficulty``
(a number in [0.1, 1.0]). Either every row gives a difficulty or none does. Other keys are ignored.

The file must be UTF-8 (a byte-order mark is skipped) with lines of at most ``max_line_bytes`` bytes
(:data:`~grpo_gym.validation.MAX_LINE_BYTES`, 16 MiB, by default); anything else is an error naming the file
and the line. A prompt longer than the env's window costs only ``O(context_length)`` tokens per reset (the env
keeps its newest part), so long rows are fine up to that limit.

``eval_data`` names a second file of the same format: the held-out split that ``grpo-gym eval`` and the held-out
table use. Without it, held-out problems are drawn from the training file, with a warning (see
:mod:`grpo_gym.tasks.rows`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from grpo_gym.tasks.base import MAX_NUMBER_CHARS, check_difficulty, parse_number
from grpo_gym.tasks.rows import Row, RowTask, answer_as_text, checked_solution, checked_text
from grpo_gym.validation import MAX_LINE_BYTES, check_int, check_path, read_lines

__all__ = ["MAX_NUMBER_CHARS", "JsonlTask", "Row", "load_rows", "parse_number"]


def _check_row(obj: Any, line: int, where: str) -> Row:
    """Validate one decoded line; ``ValueError`` naming the line and the fix otherwise."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}:{line}: each line must be a JSON object, got {type(obj).__name__}")
    for key in ("prompt", "answer"):
        if key not in obj:
            raise ValueError(f'{where}:{line}: missing key "{key}"; every line needs "prompt" and "answer"')
    at = f"{where}:{line}"
    prompt = checked_text(obj["prompt"], at, '"prompt"')
    answer = answer_as_text(obj["answer"], at, '"answer"')
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f'{where}:{line}: "prompt" must be a non-empty string')
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError(f'{where}:{line}: "answer" must be a non-empty string (or a number)')
    solution = checked_solution(checked_text(obj.get("solution"), at, '"solution"'), at, '"solution"')
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
        except ValueError:  # a number past Python's 4300 digits
            raise ValueError(f"{where}:{line}: not valid JSON (a number longer than 4300 digits)") from None
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


class JsonlTask(RowTask):
    """Problems read from a JSON-lines file (see the module docstring for the format, and
    :mod:`grpo_gym.tasks.rows` for sampling, verifying and the held-out split).

    :param path: the JSON-lines file
    :param max_line_bytes: the longest accepted line, in bytes (16 MiB by default)
    :param eval_data: a second JSON-lines file of the same format: the held-out split (``None``: none)
    """

    name = "jsonl"

    def __init__(
        self,
        path: str | os.PathLike[str],
        max_line_bytes: int = MAX_LINE_BYTES,
        eval_data: str | os.PathLike[str] | None = None,
    ):
        self.path = check_path("path", path, what="a JSON-lines file")
        self.max_line_bytes = check_int("max_line_bytes", max_line_bytes, low=1)
        self.eval_path = None if eval_data is None else check_path("eval_data", eval_data, what="a JSON-lines file")
        rows = load_rows(self.path, self.max_line_bytes)
        eval_rows = None if self.eval_path is None else load_rows(self.eval_path, self.max_line_bytes)
        super().__init__(rows, eval_rows)
