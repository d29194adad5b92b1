"""The task contract: a :class:`Problem` (picklable data), a :class:`Task` (sampler, verifier, gold solver).

A task family maps a ``difficulty`` in ``[MIN_DIFFICULTY, MAX_DIFFICULTY]`` to problem hardness monotonically,
checks an answer string without ever executing it, and writes a gold step-by-step solution (the cold-start
SFT data). Tasks hold no per-episode state, so one instance can serve many environments.

Beyond that contract a task says which fields of a problem reward functions receive (:meth:`Task.reward_columns`),
whether the rule-based consistency score applies to a problem (:meth:`Task.concludes`), and where its held-out
problems come from (:meth:`Task.eval_problems`, :attr:`Task.eval_source`).
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from grpo_gym.validation import ReturnTypeError, check_float, check_int, show_value, unicode_error

MIN_DIFFICULTY = 0.1
MAX_DIFFICULTY = 1.0

HELD_OUT_SEED = 10**12
"""Held-out problems of procedural tasks come from seeds ``HELD_OUT_SEED + seed * n + i``; training draws its seeds
from the env's own generator, so they are different draws."""

MAX_NUMBER_CHARS = 64
RESERVED_COLUMNS = frozenset(
    {"prompt", "prompts", "completion", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"}
)
"""Names a problem column cannot take when passed to a reward function (the call's own keyword arguments)."""

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+\.?")


def parse_number(text: str) -> int | float | None:
    """Read a decimal number (``42``, ``-3.5``, ``1e-3``, ``7.``), or ``None``; length-capped, never raises.

    Integers (no fraction or exponent) come back as ``int`` so they compare exactly.
    """
    s = text.strip() if isinstance(text, str) else ""
    if not s or len(s) > MAX_NUMBER_CHARS or not s.isascii() or _DECIMAL.fullmatch(s) is None:
        return None
    if _INTEGER.fullmatch(s):
        return int(s.rstrip("."))
    value = float(s)
    return value if math.isfinite(value) else None


REL_TOLERANCE = 1e-6
"""Two non-integer numeric answers agree when they differ by at most ``1e-6`` of the larger magnitude ..."""
ABS_TOLERANCE = 1e-12
"""... or by at most ``1e-12`` (so ``0`` matches ``1e-15``, but ``1e-9`` does not match ``2e-9``)."""


def numbers_agree(first: str, second: str) -> bool | None:
    """Whether two answers agree as numbers, or ``None`` when either does not read as one (:func:`parse_number`).

    Integers compare exactly; otherwise ``math.isclose`` with a relative tolerance of :data:`REL_TOLERANCE` and an
    absolute floor of :data:`ABS_TOLERANCE`: tiny answers are compared by their own scale, never swallowed by a
    fixed absolute tolerance."""
    a, b = parse_number(first), parse_number(second)
    if a is None or b is None:
        return None
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return math.isclose(a, b, rel_tol=REL_TOLERANCE, abs_tol=ABS_TOLERANCE)


def check_difficulty(difficulty: float, name: str = "difficulty") -> float:
    """Return ``difficulty`` as a float; ``ArgumentError`` (a ``ValueError``) outside [0.1, 1.0] or not a number.

    :param difficulty: the level to check (a real number; strings and booleans are refused)
    :param name: the argument's name in the message
    """
    return check_float(  # type: ignore[return-value]
        name,
        difficulty,
        low=MIN_DIFFICULTY,
        high=MAX_DIFFICULTY,
        hint="clip it before passing it (DynamicCurriculum keeps it in range)",
    )


@dataclass
class Problem:
    """One verifiable problem. Plain data: picklable, so it crosses ``SubprocVecEnv`` boundaries.

    :param prompt: the question shown to the model (without the R1-Zero template around it)
    :param answer: the reference answer, as a canonical string
    :param task: the name of the task family that made it (a key of the task registry)
    :param difficulty: the level it was generated at, in [0.1, 1.0]
    :param seed: the seed it was generated from (``None`` for rows read from a file)
    :param solution: an optional gold reasoning text (used by the ``jsonl`` task when the file gives one)
    :param metadata: task-specific data the verifier needs (e.g. the countdown numbers); ``"messages"``: the
        conversation of a conversational dataset's row (then ``prompt`` is its last user message's text)
    """

    prompt: str
    answer: str
    task: str
    difficulty: float
    seed: int | None = None
    solution: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_input(self) -> str | list[dict[str, str]]:
        """What the env lays out as the first turn: the conversation (``[{"role", "content"}]`` messages) of a
        conversational row, else the question text (see :mod:`grpo_gym.templates`)."""
        messages = self.metadata.get("messages")
        return messages if isinstance(messages, list) else self.prompt


def check_prompt(problem: Problem) -> None:
    """``ValueError`` naming the problem (its data row, when it came from one) unless its prompt is text that a
    tokenizer can encode: a string without lone surrogates."""
    prompt = problem.prompt
    error = unicode_error(prompt) if isinstance(prompt, str) else f"a {type(prompt).__name__}, not text"
    if error is not None:
        line = problem.metadata.get("line") if isinstance(problem.metadata, dict) else None
        source = f" (row {line} of task {problem.task!r})" if line is not None else f" (task {problem.task!r})"
        raise ValueError(f"the problem's prompt{source} holds {error}: no tokenizer can encode it; fix the task")


@dataclass(frozen=True)
class Verdict:
    """The verifier's judgement of one answer: ``correct`` and, when not, a short human-readable reason.

    ``score`` gives partial credit: a number in [0, 1] that becomes the ``task`` reward component (``None``:
    1 when ``correct``, else 0). Full credit (``score == 1``) is what counts as success.
    """

    correct: bool
    reason: str = ""
    score: float | None = None


#: the task methods the reward's ``consistency`` and ``task`` components call
SCORING_HOOKS = ("verify", "concludes", "conclusion", "key_terms", "answers_agree")


def scores_with_user_code(task: Task) -> bool:
    """Whether any of ``task``'s :data:`SCORING_HOOKS` is code from outside ``grpo_gym`` (a user's task, or a
    built-in one with a method overridden): the reward then bounds those components by ``reward_timeout``."""
    modules = [str(getattr(getattr(task, hook), "__module__", "")) for hook in SCORING_HOOKS]
    return not all(module.startswith("grpo_gym.") for module in modules)


class Task(ABC):
    """A procedurally generated, verifiable task family.

    Subclasses set ``name`` and implement :meth:`sample`, :meth:`verify` and :meth:`solution`. The other
    methods have defaults that suit numeric tasks and can be overridden.
    """

    name: ClassVar[str] = "task"

    @abstractmethod
    def sample(self, difficulty: float, rng: np.random.Generator) -> Problem:
        """Draw one problem at ``difficulty`` using only ``rng`` (same rng state, same problem)."""

    @abstractmethod
    def verify(self, problem: Problem, answer: str) -> Verdict:
        """Judge the text inside the ``<answer>`` tag. Never executes it; never raises on any string."""

    @abstractmethod
    def solution(self, problem: Problem) -> tuple[str, str]:
        """Return a gold ``(reasoning, answer)`` pair; ``verify(problem, answer)`` must be correct."""

    def tool_solution(self, problem: Problem, tools: Collection[str]) -> tuple[list[dict[str, Any]], str, str] | None:
        """A gold solution that calls tools, for the cold start of an env with ``tools`` (their names): the calls of
        the first turn (``{"name": ..., "arguments": {...}}`` dicts) and the answer turn's ``(reasoning, answer)``.
        ``None`` (the default): the task has none with these tools, and the cold start uses :meth:`solution`."""
        return None

    def sample_seeded(self, difficulty: float, seed: int) -> Problem:
        """Draw the problem of ``seed`` and record it, so ``sample_seeded(d, problem.seed)`` remakes it.

        :param difficulty: the level, in [0.1, 1.0]
        :param seed: seeds ``np.random.default_rng(seed)``, the only randomness used
        """
        seed = check_int("seed", seed, low=0)
        problem = self.sample(check_difficulty(difficulty), np.random.default_rng(seed))
        if not isinstance(problem, Problem):
            raise ReturnTypeError(
                f"task {self.name!r}'s sample returned {show_value(problem)}, not a grpo_gym.tasks.Problem: return "
                "Problem(prompt, answer, task, difficulty)"
            )
        problem.seed = seed
        return problem

    def conclusion(self, problem: Problem, reasoning: str) -> str | None:
        """What the reasoning concluded: by default its last number (``None`` when it states none)."""
        numbers = _NUMBER.findall(reasoning[-4096:])
        return numbers[-1] if numbers else None

    def concludes(self, problem: Problem) -> bool:
        """Whether :meth:`conclusion` can say what a reasoning about ``problem`` concluded, so that the rule-based
        consistency score applies (otherwise that component is ``None``: not applicable). By default: when the
        reference answer is a number (the conclusion is the reasoning's last number)."""
        return parse_number(problem.answer) is not None

    def key_terms(self, problem: Problem) -> list[str]:
        """Terms a reasoning about this problem mentions: by default the numbers in the prompt."""
        return _NUMBER.findall(problem.prompt)

    def answers_agree(self, problem: Problem, first: str, second: str) -> bool:
        """Whether two answer strings say the same thing (default: equal after stripping spaces)."""
        return "".join(first.split()) == "".join(second.split())

    def reward_columns(self, problem: Problem) -> dict[str, Any]:
        """The problem's fields as reward functions receive them (TRL passes a dataset's columns the same way): by
        default ``answer``, ``difficulty`` and the entries of ``problem.metadata`` (names in
        :data:`RESERVED_COLUMNS` left out)."""
        columns = {key: value for key, value in problem.metadata.items() if key not in RESERVED_COLUMNS}
        columns.update(answer=problem.answer, difficulty=problem.difficulty)
        return columns

    def column_names(self, difficulty: float) -> list[str] | None:
        """The names of :meth:`reward_columns` of one problem drawn at ``difficulty`` (the sampler state is put
        back), or ``None`` when the task cannot draw one here."""
        state = self.get_state()
        try:
            return list(self.reward_columns(self.sample(difficulty, np.random.default_rng(0))))
        except Exception:
            return None
        finally:
            self.set_state(state)

    #: where :meth:`eval_problems` takes its problems from, as the held-out table shows it
    eval_source: ClassVar[str] = "new seeds"

    def eval_problems(self, n: int, difficulty: float, seed: int = 0) -> list[Problem]:
        """``n`` held-out problems at ``difficulty``, the same set every time for the same ``seed``: by default the
        problems of seeds ``HELD_OUT_SEED + seed * n + i`` (procedural tasks; a task with a small problem space can
        still repeat a training problem by content). Tasks read from data return their eval split.

        :param n: how many problems (a task with an eval split may return fewer: all of its eligible rows)
        :param difficulty: the level, in [0.1, 1.0]
        :param seed: selects the set
        """
        n = check_int("n", n, low=0)  # type: ignore[assignment]
        seed = check_int("seed", seed, low=0)  # type: ignore[assignment]
        return [self.sample_seeded(difficulty, HELD_OUT_SEED + seed * n + i) for i in range(n)]

    def get_state(self) -> dict[str, Any] | None:
        """The task's own sampler state as JSON-serialisable data, or ``None`` when it has none (the default:
        built-in tasks draw only from the ``rng`` they are given). A task that keeps state between draws (a
        cursor, a shuffled order) returns it here and restores it in :meth:`set_state`, so that
        ``R1ZeroEnv.get_state()`` / ``set_state()`` continue it exactly."""
        return None

    def set_state(self, state: dict[str, Any] | None) -> None:
        """Restore what :meth:`get_state` returned (the default accepts only ``None``)."""
        if state is not None:
            raise ValueError(f"task {self.name!r} keeps no sampler state, but the saved state holds {state!r}")

    def feedback(self, problem: Problem, verdict: Verdict) -> str:
        """The message a multi-turn episode appends after a wrong answer."""
        reason = f" ({verdict.reason})" if verdict.reason else ""
        return f"That is not correct{reason}. Think again and answer."
