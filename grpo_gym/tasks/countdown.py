"""Countdown (TinyZero-style): combine the given numbers with ``+ - * /`` and parentheses to make a target.

``"Make 97 from 25, 4, 3."`` → an expression such as ``"25*4-3"``. By default (``use_all=True``, as in
TinyZero) each given number must be used exactly once; with ``use_all=False`` each may be used at most
once. Answers are checked by :mod:`grpo_gym.tasks.safe_expr` (exact rational arithmetic, never ``eval``),
so a route through fractions such as ``"6/4*8"`` is accepted when it hits the target exactly.

Difficulty sets the count of numbers (3 at 0.1 up to 6 from about 0.78), their range (1..10 up to
1..100) and the largest target (100 up to 1000). A problem is made by combining the drawn numbers into a
random expression tree whose every intermediate value is a positive integer (exact division only), so a
solution that uses all the numbers exists and the gold steps stay integral; trees are redrawn until the
target lands in range (after 64 tries the sum is used, which always does).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from grpo_gym.tasks.base import Problem, Task, Verdict, check_difficulty
from grpo_gym.tasks.safe_expr import evaluate, format_number, try_evaluate
from grpo_gym.validation import check_bool

_MAX_TRIES = 64
_OPS = "+-*/"

# A node of the generator's tree: (value, text, precedence) with 1 for + -, 2 for * /, 3 for a literal.
_Node = tuple[int, str, int]


def countdown_parameters(difficulty: float) -> tuple[int, int, int]:
    """``(count, max_number, max_target)`` at ``difficulty``; each is non-decreasing in it."""
    t = (check_difficulty(difficulty) - 0.1) / 0.9
    count = 3 + min(3, int(t * 4 + 1e-9))
    return count, 10 + int(t * 90 + 1e-9), 100 + int(t * 900 + 1e-9)


def _pick(u: float, n: int) -> int:
    return min(int(u * n), n - 1)


def _combine(a: _Node, b: _Node, op: str) -> _Node | None:
    """``a op b`` as a node, or ``None`` when the result would not be a positive integer."""
    (x, xs, xp), (y, ys, yp) = a, b
    if op == "+":
        return x + y, f"{xs}+{ys}", 1
    if op == "-":
        if x <= y:
            return None
        return x - y, f"{xs}-({ys})" if yp == 1 else f"{xs}-{ys}", 1
    left = f"({xs})" if xp == 1 else xs
    if op == "*":
        return x * y, f"{left}*({ys})" if yp == 1 else f"{left}*{ys}", 2
    if y == 0 or x % y:
        return None
    return x // y, f"{left}/({ys})" if yp < 3 else f"{left}/{ys}", 2


def _build(numbers: list[int], u: list[float]) -> _Node:
    """Fold ``numbers`` into one random tree using the uniforms ``u`` (3 per merge)."""
    pool: list[_Node] = [(n, str(n), 3) for n in numbers]
    k = 0
    while len(pool) > 1:
        m = len(pool)
        i = _pick(u[k], m)
        j = _pick(u[k + 1], m - 1)
        if j >= i:
            j += 1
        a, b = pool[i], pool[j]
        op = _OPS[_pick(u[k + 2], 4)]
        if op == "-" and a[0] < b[0]:
            a, b = b, a
        elif op == "/" and a[0] % b[0]:
            a, b = b, a
        node = _combine(a, b, op) or _combine(a, b, "+")
        pool = [p for idx, p in enumerate(pool) if idx != i and idx != j]
        pool.append(node)  # type: ignore[arg-type]
        k += 3
    return pool[0]


class CountdownTask(Task):
    """Reach a target from given numbers with ``+ - * /`` and parentheses.

    :param use_all: ``True`` (default, TinyZero): every given number exactly once;
        ``False``: each given number at most once (any sub-multiset)
    """

    name = "countdown"

    def __init__(self, use_all: bool = True):
        self.use_all = check_bool("use_all", use_all)

    def sample(self, difficulty: float, rng: np.random.Generator) -> Problem:
        """Draw one problem at ``difficulty``, using only ``rng`` (same rng state, same problem)."""
        difficulty = check_difficulty(difficulty)
        count, max_number, max_target = countdown_parameters(difficulty)
        numbers = rng.integers(1, max_number + 1, size=count).tolist()
        node = None
        for _ in range(_MAX_TRIES):
            candidate = _build(numbers, rng.random(3 * count).tolist())
            if 1 <= candidate[0] <= max_target:
                node = candidate
                break
        if node is None:  # the sum always fits: count * max_number <= max_target
            node = (sum(numbers), "+".join(map(str, numbers)), 1)
        target = node[0]
        shown = ", ".join(map(str, numbers))
        prompt = f"Make {target} from {shown}." if self.use_all else f"Make {target} from some of {shown}."
        return Problem(
            prompt=prompt,
            answer=node[1],
            task=self.name,
            difficulty=difficulty,
            metadata={"numbers": numbers, "target": target, "use_all": self.use_all},
        )

    def _rules(self, problem: Problem) -> tuple[list[int], int, bool]:
        """``(numbers, target, use_all)`` from the metadata, or from the gold expression when it is absent."""
        meta = problem.metadata
        if "numbers" in meta and "target" in meta:
            return list(meta["numbers"]), int(meta["target"]), bool(meta.get("use_all", self.use_all))
        gold = evaluate(problem.answer, max_length=10_000)
        return list(gold.literals), int(gold.value), self.use_all

    def verify(self, problem: Problem, answer: str) -> Verdict:
        """Correct iff ``answer`` parses safely, uses the numbers as the rules say and equals the target."""
        numbers, target, use_all = self._rules(problem)
        result, reason = try_evaluate(answer)
        if result is None:
            return Verdict(False, f"not a valid expression: {reason}")
        used, given = Counter(result.literals), Counter(numbers)
        for number, times in used.items():
            if number not in given:
                return Verdict(False, f"uses {number}, which is not one of the given numbers")
            if times > given[number]:
                return Verdict(False, f"uses {number} {times} times but it is given {given[number]} time(s)")
        if use_all and used != given:
            missing = ", ".join(map(str, sorted((given - used).elements())))
            return Verdict(False, f"does not use every number (missing {missing})")
        if result.value != target:
            return Verdict(False, f"evaluates to {format_number(result.value)}, not {target}")
        return Verdict(True)

    def solution(self, problem: Problem) -> tuple[str, str]:
        """Gold ``(reasoning, answer)``: ``("25*4=100, 100-3=97", "25*4-3")``; it ends with the target."""
        steps = evaluate(problem.answer, record_steps=True, max_length=10_000).steps
        return ", ".join(steps), problem.answer

    def concludes(self, problem: Problem) -> bool:
        """Always: the gold reasoning ends with the target, and an expression answer agrees with a number by value."""
        return True

    def answers_agree(self, problem: Problem, first: str, second: str) -> bool:
        """Whether both parse to the same value (so ``"97"`` agrees with ``"25*4-3"``), else equal text."""
        a, _ = try_evaluate(first)
        b, _ = try_evaluate(second)
        if a is not None and b is not None:
            return a.value == b.value
        return super().answers_agree(problem, first, second)
