"""Tasks whose problems are rows of data (a JSON-lines file, a dataset): sampling by difficulty, verifying, eval splits.

:class:`RowTask` holds validated :class:`Row` objects and does what the ``jsonl`` and ``dataset`` tasks share:

- **sampling**: when rows carry difficulties, uniform among rows with ``difficulty <= level`` (the easiest rows
  when none qualifies), so hardness is monotone in the level; otherwise uniform over all rows;
- **verifying**: numeric comparison when both sides read as numbers (integers exactly; otherwise within ``1e-6``
  relative, with a ``1e-12`` absolute floor: :func:`~grpo_gym.tasks.base.numbers_agree`), else exact match after
  collapsing whitespace and case-folding;
- **held-out problems**: from the eval split (``eval_data=``) when one is given: the rows eligible at the level,
  all of them or ``n`` of them chosen by the seed. Without one they are drawn from the training rows, with a
  warning, and :attr:`RowTask.eval_source` (shown in the held-out table) says ``"training rows"``.
"""

from __future__ import annotations

import math
import numbers
import warnings
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from grpo_gym.tasks.base import (
    HELD_OUT_SEED,
    MAX_DIFFICULTY,
    RESERVED_COLUMNS,
    Problem,
    Task,
    Verdict,
    check_difficulty,
    numbers_agree,
    parse_number,
)
from grpo_gym.validation import MAX_JSON_DEPTH, check_int, unicode_error


class Row(NamedTuple):
    """One validated row.

    :param prompt: the question
    :param answer: the reference answer, as text
    :param solution: gold reasoning text, or ``None``
    :param difficulty: the row's level in [0.1, 1.0], or ``None`` (ungraded data)
    :param line: where it came from (the file's line, or the row's 1-based index)
    :param columns: the row's own columns as plain JSON values, passed to reward functions (``None``: the
        ``jsonl`` task, whose rows have no other columns)
    :param messages: a conversational prompt's messages (``[{"role", "content"}]``), or ``None``; ``prompt`` is
        then the text of its last user message
    """

    prompt: str
    answer: str
    solution: str | None
    difficulty: float | None
    line: int
    columns: dict[str, Any] | None = None
    messages: list[dict[str, str]] | None = None


def checked_text(value: Any, at: str, what: str) -> Any:
    """``value`` as given; ``ValueError`` naming the row (``at``) and the column (``what``) when it is text that is not
    valid Unicode (a lone surrogate: no tokenizer can encode it)."""
    problem = unicode_error(value) if isinstance(value, str) else None
    if problem is not None:
        raise ValueError(f"{at}: {what} holds {problem}, which no tokenizer can encode; fix that text in the data")
    return value


#: the R1-Zero template's tags, which the cold start puts around a row's solution and answer
TEMPLATE_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def checked_solution(solution: Any, at: str, what: str) -> Any:
    """``solution`` as given; ``ValueError`` naming the row and the column when it holds a template tag: the cold
    start's target is ``<think>solution</think><answer>answer</answer>`` with the row's own answer, so a tagged
    solution (an ``<answer>`` of its own, agreeing or not) would teach a completion the template scores 0."""
    found = [tag for tag in TEMPLATE_TAGS if isinstance(solution, str) and tag in solution]
    if found:
        raise ValueError(
            f"{at}: {what} holds {', '.join(found)}: a solution is the gold reasoning alone (the cold start writes "
            "<think>solution</think><answer>answer</answer> with the row's answer); remove the tags and the answer "
            "block from it"
        )
    return solution


def answer_as_text(value: Any, at: str, what: str) -> Any:
    """A numeric answer as its text (``7`` -> ``"7"``), other values as given; ``ValueError`` naming the row and the
    column for NaN or an infinity (no answer can be checked against them)."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        if not math.isfinite(value):
            raise ValueError(f"{at}: {what} holds {value!r}, not a finite number; give the row a real answer")
        return str(value)
    return checked_text(value, at, what)


def _normalise(text: str) -> str:
    return " ".join(text.split()).casefold()


def plain(value: Any, depth: int = 0) -> Any:
    """``value`` as plain JSON data: numbers, strings, booleans, ``None``, lists and string-keyed dicts (numpy
    values become Python ones; anything else its ``str``), so problems stay JSON-serialisable and cheap to pickle.
    NaN and the infinities stay floats, as a dataset's column gives them to a TRL reward function (``json`` writes
    and reads them back). A value nested deeper than :data:`~grpo_gym.validation.MAX_JSON_DEPTH` levels is a
    ``ValueError`` (it could not be saved, copied for each reward function or read back)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if depth >= MAX_JSON_DEPTH:
        raise ValueError(f"a value nested deeper than {MAX_JSON_DEPTH} levels (lists and dicts), which is never read")
    if isinstance(value, np.ndarray):
        return plain(value.tolist(), depth)
    if isinstance(value, np.generic):
        return plain(value.item(), depth)
    if isinstance(value, Mapping):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, depth + 1) for v in value]
    return str(value)


class RowSet:
    """Rows sorted by difficulty (when graded), and which of them are eligible at a level."""

    def __init__(self, rows: Sequence[Row]) -> None:
        rows = list(rows)
        self.graded = rows[0].difficulty is not None
        if self.graded:
            rows.sort(key=lambda row: row.difficulty)  # type: ignore[arg-type, return-value]
        self.rows = rows
        self._levels = [row.difficulty or MAX_DIFFICULTY for row in rows]
        self._easiest = self._levels.count(self._levels[0])

    def __len__(self) -> int:
        return len(self.rows)

    def eligible(self, difficulty: float) -> int:
        """How many of the first rows may be drawn at ``difficulty``."""
        if not self.graded:
            return len(self.rows)
        return bisect_right(self._levels, difficulty + 1e-9) or self._easiest


class RowTask(Task):
    """Problems read from rows (see the module docstring). Subclasses load and validate the rows.

    :param rows: the training rows (at least one)
    :param eval_rows: the eval split, or ``None``
    """

    name = "rows"

    def __init__(self, rows: Sequence[Row], eval_rows: Sequence[Row] | None = None) -> None:
        self._train = RowSet(rows)
        self._eval = RowSet(eval_rows) if eval_rows else None
        self._warned_no_eval = False

    @property
    def rows(self) -> list[Row]:
        """The training rows (sorted by difficulty when graded)."""
        return self._train.rows

    @property
    def eval_rows(self) -> list[Row]:
        """The eval split's rows (empty without one)."""
        return self._eval.rows if self._eval is not None else []

    @property
    def graded(self) -> bool:
        """Whether the rows carry difficulties."""
        return self._train.graded

    def __len__(self) -> int:
        return len(self._train)

    def _problem(self, row: Row, difficulty: float) -> Problem:
        metadata: dict[str, Any] = {"line": row.line, "row_difficulty": row.difficulty}
        if row.columns is not None:
            metadata["columns"] = row.columns
        if row.messages is not None:
            metadata["messages"] = row.messages
        return Problem(
            prompt=row.prompt,
            answer=row.answer,
            task=self.name,
            difficulty=difficulty,
            solution=row.solution,
            metadata=metadata,
        )

    def sample(self, difficulty: float, rng: np.random.Generator) -> Problem:
        """Draw one row eligible at ``difficulty`` (one ``rng.integers`` call)."""
        difficulty = check_difficulty(difficulty)
        index = int(rng.integers(self._train.eligible(difficulty)))
        return self._problem(self._train.rows[index], difficulty)

    @property
    def eval_source(self) -> str:  # type: ignore[override]
        """``"eval split"`` with ``eval_data``, else ``"training rows"``."""
        return "eval split" if self._eval is not None else "training rows"

    def eval_problems(self, n: int, difficulty: float, seed: int = 0) -> list[Problem]:
        """The eval split's rows eligible at ``difficulty`` (``n`` of them chosen by ``seed`` when there are more,
        in row order); without an eval split, ``n`` problems drawn from the training rows, with a warning."""
        if self._eval is None:
            if not self._warned_no_eval:
                self._warned_no_eval = True
                warnings.warn(
                    f"task {self.name!r} has no eval split: its held-out problems are drawn from the training rows; "
                    "pass eval_data= (in task_kwargs) for a real held-out split",
                    UserWarning,
                    stacklevel=2,
                )
            return super().eval_problems(n, difficulty, seed)
        n = check_int("n", n, low=0)  # type: ignore[assignment]
        seed = check_int("seed", seed, low=0)  # type: ignore[assignment]
        difficulty = check_difficulty(difficulty)
        rows = self._eval.rows[: self._eval.eligible(difficulty)]
        if n < len(rows):
            picks = np.random.default_rng(HELD_OUT_SEED + seed).choice(len(rows), size=n, replace=False)
            rows = [rows[i] for i in sorted(picks.tolist())]
        return [self._problem(row, difficulty) for row in rows]

    def reward_columns(self, problem: Problem) -> dict[str, Any]:
        """The row's own columns by their names (as TRL passes a dataset's), then ``answer`` and ``difficulty``
        when the data has no column of that name; rows without columns (``jsonl``): the default fields."""
        columns = problem.metadata.get("columns")
        if not isinstance(columns, dict):
            return super().reward_columns(problem)
        passed = {key: value for key, value in columns.items() if key not in RESERVED_COLUMNS}
        passed.setdefault("answer", problem.answer)
        passed.setdefault("difficulty", problem.difficulty)
        return passed

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
        """``(the row's solution or "", the answer)``; an empty reasoning gets a stand-in at the cold start."""
        return problem.solution or "", problem.answer

    def answers_agree(self, problem: Problem, first: str, second: str) -> bool:
        """Numeric agreement when both read as numbers, else equal after normalising whitespace and case."""
        numeric = numbers_agree(first, second)
        return numeric if numeric is not None else _normalise(first) == _normalise(second)
