"""Multi-digit integer arithmetic, the default task: ``"What is 37+48*2?"`` → ``"133"``.

Hardness grows monotonically with difficulty through the level table :data:`LEVELS`: more operands, more
digits, wider operators (``+``, then ``+ -``, then ``+ - *`` with the usual precedence) and, at the top
levels, an optional parenthesised sub-expression (only where it changes the order of evaluation). The
right operand of ``*`` is kept short (``mul_digits``) so products stay learnable. Answers are computed
with Python ints from the drawn operands (never by evaluating a string). The gold reasoning is one
``a op b=c`` step per operation in evaluation order, e.g. ``"48*2=96, 37+96=133"``; its last number is
the answer. With the ``calculator`` tool, the gold solution calls it on the expression and answers with its
result (:meth:`ArithmeticTask.tool_solution`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection
from typing import Any, NamedTuple

import numpy as np

from grpo_gym.tasks.base import Problem, Task, Verdict, check_difficulty
from grpo_gym.tasks.safe_expr import evaluate

MAX_ANSWER_CHARS = 64


class Level(NamedTuple):
    """The generator's parameters from difficulty ``start`` up to the next level's start."""

    start: float
    operators: str
    min_operands: int
    max_operands: int
    min_digits: int
    max_digits: int
    mul_digits: int
    paren_prob: float


LEVELS: tuple[Level, ...] = (
    Level(0.10, "+", 2, 2, 1, 2, 1, 0.0),
    Level(0.20, "+-", 2, 2, 1, 2, 1, 0.0),
    Level(0.30, "+-", 2, 3, 1, 2, 1, 0.0),
    Level(0.40, "+-*", 2, 3, 1, 2, 1, 0.0),
    Level(0.50, "+-*", 3, 3, 1, 2, 1, 0.0),
    Level(0.60, "+-*", 3, 4, 1, 3, 1, 0.0),
    Level(0.70, "+-*", 3, 4, 2, 3, 1, 0.25),
    Level(0.80, "+-*", 4, 4, 2, 3, 2, 0.25),
    Level(0.90, "+-*", 4, 5, 2, 4, 2, 0.5),
    Level(1.00, "+-*", 5, 5, 2, 4, 2, 0.5),
)
"""Each parameter is non-decreasing down the table, so hardness is monotone in difficulty."""

_STARTS = [level.start - 1e-9 for level in LEVELS]
_MAX_OPERANDS = max(level.max_operands for level in LEVELS)
_UNIFORMS = 4 + 3 * _MAX_OPERANDS


def level_for(difficulty: float) -> Level:
    """The :class:`Level` in force at ``difficulty`` (in [0.1, 1.0])."""
    return LEVELS[max(0, bisect_right(_STARTS, difficulty) - 1)]


def _pick(u: float, n: int) -> int:
    """Map a uniform ``u`` in [0, 1) to an index in ``range(n)``."""
    return min(int(u * n), n - 1)


def _draw(u_digits: float, u_value: float, min_digits: int, max_digits: int) -> int:
    """A positive integer with a uniform number of digits in [min_digits, max_digits], then uniform value."""
    digits = min_digits + _pick(u_digits, max_digits - min_digits + 1)
    low = 1 if digits == 1 else 10 ** (digits - 1)
    return low + _pick(u_value, 10**digits - low)


def _flat_value(operands: list[int], ops: str) -> int:
    """Value of ``operands`` joined by ``ops`` (no parentheses): ``*`` first, then ``+ -`` left to right."""
    values = [operands[0]]
    signs = [1]
    for op, operand in zip(ops, operands[1:], strict=True):
        if op == "*":
            values[-1] *= operand
        else:
            values.append(operand)
            signs.append(1 if op == "+" else -1)
    return sum(sign * value for sign, value in zip(signs, values, strict=True))


def expression_value(operands: list[int], ops: str, paren: tuple[int, int] | None) -> int:
    """Value of the expression: operands ``paren[0]..paren[1]`` (inclusive) grouped first, if given.

    :param operands: the integers, left to right
    :param ops: one operator character per gap (``len(operands) - 1`` of them)
    :param paren: the inclusive operand span in parentheses, or ``None``
    """
    if paren is not None:
        i, j = paren
        inner = _flat_value(operands[i : j + 1], ops[i:j])
        operands = [*operands[:i], inner, *operands[j + 1 :]]
        ops = ops[:i] + ops[j:]
    return _flat_value(operands, ops)


def expression_text(operands: list[int], ops: str, paren: tuple[int, int] | None) -> str:
    """The compact text of the expression, e.g. ``"37+(48-2)*3"``."""
    parts = [str(operands[0])]
    for op, operand in zip(ops, operands[1:], strict=True):
        parts.append(op)
        parts.append(str(operand))
    if paren is not None:
        i, j = paren
        parts[2 * i] = "(" + parts[2 * i]
        parts[2 * j] = parts[2 * j] + ")"
    return "".join(parts)


def _useful_paren(ops: str, i: int, j: int) -> tuple[int, int] | None:
    """``(i, j)`` when grouping operands ``i..j`` changes the value's precedence, else ``None``."""
    before = ops[i - 1] if i > 0 else ""
    after = ops[j] if j < len(ops) else ""
    additive = "+" in ops[i:j] or "-" in ops[i:j]
    return (i, j) if additive and (before in ("-", "*") or after == "*") else None


def parse_integer(text: str) -> tuple[int | None, str]:
    """Read an integer answer: optional sign, ASCII digits, optional trailing ``.``, spaces around.

    :return: ``(value, "")`` or ``(None, reason)``; never raises (length is capped before ``int()``)
    """
    s = text.strip()
    if s.endswith("."):
        s = s[:-1].rstrip()
    if not s:
        return None, "empty answer"
    if len(s) > MAX_ANSWER_CHARS:
        return None, f"answer longer than {MAX_ANSWER_CHARS} characters"
    digits = s[1:] if s[0] in "+-" else s
    if not (digits.isascii() and digits.isdigit()):
        return None, "not an integer"
    return int(s), ""


class ArithmeticTask(Task):
    """Integer arithmetic with ``+``, ``-`` and ``*`` (:data:`LEVELS` maps difficulty to hardness).

    Prompts look like ``"What is 37+48*2?"``; the answer is the canonical integer string (``"133"``,
    ``"-7"``). ``verify`` accepts an optional sign, digits, and a trailing ``.``; anything else is rejected
    with a reason. ``problem.metadata`` holds ``operands``, ``ops`` and ``paren`` (the grouped operand
    span, or ``None``).
    """

    name = "arithmetic"

    def sample(self, difficulty: float, rng: np.random.Generator) -> Problem:
        """Draw one problem at ``difficulty`` with one ``rng.random`` call (same rng state, same problem)."""
        difficulty = check_difficulty(difficulty)
        level = level_for(difficulty)
        u = rng.random(_UNIFORMS).tolist()
        n = level.min_operands + _pick(u[0], level.max_operands - level.min_operands + 1)
        ops = "".join(level.operators[_pick(u[4 + 3 * k], len(level.operators))] for k in range(n - 1))
        operands = [_draw(u[5], u[6], level.min_digits, level.max_digits)]
        for k in range(1, n):
            if ops[k - 1] == "*":
                operand = _draw(u[5 + 3 * k], u[6 + 3 * k], 1, level.mul_digits)
            else:
                operand = _draw(u[5 + 3 * k], u[6 + 3 * k], level.min_digits, level.max_digits)
            operands.append(operand)
        paren = None
        if n >= 3 and u[1] < level.paren_prob:
            size = 2 + _pick(u[2], n - 2)  # 2..n-1 operands: never the whole expression
            start = _pick(u[3], n - size + 1)
            paren = _useful_paren(ops, start, start + size - 1)
        value = expression_value(operands, ops, paren)
        return Problem(
            prompt=f"What is {expression_text(operands, ops, paren)}?",
            answer=str(value),
            task=self.name,
            difficulty=difficulty,
            metadata={"operands": operands, "ops": ops, "paren": paren},
        )

    def verify(self, problem: Problem, answer: str) -> Verdict:
        """Correct iff ``answer`` reads as the integer ``problem.answer`` (see :func:`parse_integer`)."""
        if not isinstance(answer, str):
            return Verdict(False, "answer is not text")
        value, reason = parse_integer(answer)
        if value is None:
            return Verdict(False, reason)
        expected, _ = parse_integer(problem.answer)
        if value != expected:
            return Verdict(False, "wrong value")
        return Verdict(True)

    def solution(self, problem: Problem) -> tuple[str, str]:
        """Gold ``(reasoning, answer)``: ``("48*2=96, 37+96=133", "133")``, one step per operation."""
        meta = problem.metadata
        if not {"operands", "ops", "paren"} <= meta.keys():
            raise ValueError("problem has no arithmetic metadata (operands, ops, paren): was it made by this task?")
        text = expression_text(meta["operands"], meta["ops"], meta["paren"])
        steps = evaluate(text, record_steps=True, max_length=10_000).steps
        return ", ".join(steps), problem.answer

    def tool_solution(self, problem: Problem, tools: Collection[str]) -> tuple[list[dict[str, Any]], str, str] | None:
        """With the ``calculator`` tool: one call on the expression, then ``("37+48*2=133", "133")``."""
        meta = problem.metadata
        if "calculator" not in tools or not {"operands", "ops", "paren"} <= meta.keys():
            return None
        expression = expression_text(meta["operands"], meta["ops"], meta["paren"])
        calls = [{"name": "calculator", "arguments": {"expression": expression}}]
        return calls, f"{expression}={problem.answer}", problem.answer

    def key_terms(self, problem: Problem) -> list[str]:
        """The operands as written in the prompt, without signs (``"3-10"`` gives ``["3", "10"]``)."""
        return [term.lstrip("-") for term in super().key_terms(problem)]

    def answers_agree(self, problem: Problem, first: str, second: str) -> bool:
        """Whether both strings read as the same integer (else: equal after removing spaces)."""
        a, _ = parse_integer(first)
        b, _ = parse_integer(second)
        if a is not None and b is not None:
            return a == b
        return super().answers_agree(problem, first, second)
