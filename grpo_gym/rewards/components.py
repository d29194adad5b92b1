"""The built-in reward components as pure functions of one parsed completion: the composite reward's syntax, consistency
and task, and DAPO's soft overlong penalty (``length``).

Each returns ``(score, reason)`` with a short, non-empty, human-readable ``reason``; ``score`` is in ``[0, 1]``
(``length``: in ``[-1, 0]``), or ``None`` when the component does not apply to this completion (consistency on a
task that cannot say what a reasoning concluded; length without a token budget). The task is only ever handed the
*extracted* answer string (never the whole completion) and never executes it (model output is data). An exception raised
by a task's methods propagates: :class:`CompositeReward` catches it per component, counts it, reports it in
``RewardResult.errors`` and applies its ``on_error`` policy (see :mod:`grpo_gym.rewards.composite`), so one buggy
verifier is visible and cannot crash training; a verdict of the wrong type (``correct`` not a bool, a ``score`` that
is not a number) is the verifier's bug, :class:`~grpo_gym.validation.ReturnTypeError`, raised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from grpo_gym.rewards.values import real_number, returned_flag
from grpo_gym.validation import ReturnTypeError, show_value

if TYPE_CHECKING:
    from grpo_gym.rewards.parsing import ParsedCompletion
    from grpo_gym.tasks.base import Problem, Task

AGREEMENT_WEIGHT = 0.5
"""Share of the rule-based consistency score given to answer/conclusion agreement (the rest: relevance)."""


def syntax_score(parsed: ParsedCompletion) -> tuple[float, str]:
    """Syntax correctness: 1.0 iff the completion follows the R1-Zero template exactly, else 0.0.

    :param parsed: the parsed completion
    :return: ``(score, reason)``
    """
    if parsed.well_formed:
        return 1.0, "well formed"
    return 0.0, parsed.reason or "not well formed"


def _relevance(terms: list[str], reasoning: str) -> tuple[float, str]:
    """Fraction of the distinct, non-blank ``terms`` found (case-insensitive substring) in ``reasoning``."""
    wanted = {term.strip().lower() for term in terms if term and term.strip()}
    if not wanted:
        return 1.0, "no key terms"
    lowered = reasoning.lower()
    found = sum(1 for term in wanted if term in lowered)
    return found / len(wanted), f"{found}/{len(wanted)} key terms"


def consistency_score(task: Task, problem: Problem, parsed: ParsedCompletion) -> tuple[float | None, str]:
    """Rule-based semantic consistency: does the answer follow from a reasoning about this problem?

    It applies only where the task can say what a reasoning concluded (``task.concludes(problem)``: numeric
    answers, countdown); elsewhere it is ``None``, not applicable, and left out of the reward.

    ``score = 0.5 * agree + 0.5 * relevance`` where

    - ``agree`` is 1 when ``task.conclusion(problem, reasoning)`` is not ``None`` and
      ``task.answers_agree(problem, conclusion, answer)``, else 0;
    - ``relevance`` is the fraction of the distinct ``task.key_terms(problem)`` that occur in the reasoning
      (case-insensitive substring match). When the task gives no key terms relevance cannot be measured and
      the score is ``agree`` alone.

    The score is 0 when there is no reasoning or no unambiguous answer. Correctness is not judged here:
    a wrong answer reached by a consistent reasoning about the problem still scores 1.

    :param task: the task family that made ``problem``
    :param problem: the problem the completion answers
    :param parsed: the parsed completion
    :return: ``(score, reason)``
    """
    if not task.concludes(problem):
        return None, "not applicable: the task cannot say what a reasoning concluded (non-numeric answer)"
    if parsed.answer is None:
        return 0.0, f"no answer ({parsed.reason})"
    if not parsed.reasoning:
        return 0.0, "no reasoning"
    conclusion = task.conclusion(problem, parsed.reasoning)
    agree = conclusion is not None and returned_flag(
        f"task {task.name!r}'s answers_agree", task.answers_agree(problem, conclusion, parsed.answer)
    )
    returned = task.key_terms(problem)
    terms = list(returned) if isinstance(returned, (list, tuple, set)) else None
    if terms is None or not all(isinstance(term, str) for term in terms):
        raise ReturnTypeError(
            f"task {task.name!r}'s key_terms returned {show_value(returned)}: it must return a list of strings (the "
            "terms a relevant reasoning mentions), or an empty list"
        )
    relevance, relevance_reason = _relevance(terms, parsed.reasoning)
    if conclusion is None:
        agree_reason = "reasoning reaches no conclusion"
    else:
        agree_reason = "answer agrees with reasoning" if agree else "answer disagrees with reasoning"
    if relevance_reason == "no key terms":
        return float(agree), f"{agree_reason}; no key terms"
    score = AGREEMENT_WEIGHT * float(agree) + (1.0 - AGREEMENT_WEIGHT) * relevance
    return score, f"{agree_reason}; {relevance_reason}"


def task_score(task: Task, problem: Problem, parsed: ParsedCompletion) -> tuple[float, str]:
    """Task completion: the verdict's partial credit ``score`` when it gives one (reasoning-gym), else 1.0 iff
    ``task.verify(problem, parsed.answer).correct`` and 0.0 otherwise (also when there is no answer).

    :param task: the task family that made ``problem``
    :param problem: the problem the completion answers
    :param parsed: the parsed completion; only ``parsed.answer`` reaches the verifier
    :return: ``(score, reason)``: ``"correct"``, or the verifier's reason
    :raises ReturnTypeError: when the verdict's ``correct`` is not a bool or its ``score`` not a number
    :raises Exception: whatever ``task.verify`` raises (``CompositeReward`` catches it)
    """
    if parsed.answer is None:
        return 0.0, f"no unambiguous answer ({parsed.reason})"
    verdict = task.verify(problem, parsed.answer)
    what = f"task {task.name!r}'s verify"
    if not isinstance(getattr(verdict, "correct", None), (bool, np.bool_)):
        shown = show_value(verdict) if not hasattr(verdict, "correct") else f"correct={show_value(verdict.correct)}"
        raise ReturnTypeError(
            f"{what} returned {shown}: it must return Verdict(correct, reason, score) with correct a bool "
            "(grpo_gym.tasks.base.Verdict)"
        )
    correct, reason = bool(verdict.correct), str(verdict.reason)
    score = getattr(verdict, "score", None)
    if score is not None:
        score = real_number(f"{what} (its Verdict's score)", score, "partial credit is a number in [0, 1], or None")
        if not 0.0 <= score <= 1.0:  # nan fails too
            raise ValueError(f"the verifier's partial credit must be in [0, 1], got {score}")
        if score == 1.0:
            return 1.0, "correct"
        return score, reason or ("partial credit" if score > 0 else "incorrect")
    if correct:
        return 1.0, "correct"
    return 0.0, reason or "incorrect"


def length_score(length: int | None, max_new_tokens: int | None, buffer: int | None) -> tuple[float | None, str]:
    """DAPO's soft overlong punishment: 0 up to ``max_new_tokens - buffer`` tokens, then linear down to -1 at
    ``max_new_tokens`` (a completion cut at the budget scores -1).

    :param length: the completion's tokens, EOS included (``None``: unknown)
    :param max_new_tokens: the completion budget (``None``: not applicable)
    :param buffer: the overlong buffer, in tokens (``None`` or 0: not applicable)
    :return: ``(score in [-1, 0], reason)``, or ``(None, reason)`` when not applicable
    """
    if length is None or not max_new_tokens or not buffer:
        return None, "not applicable: no token budget"
    start = max_new_tokens - buffer
    if length <= start:
        return 0.0, f"{length} tokens, within {start}"
    reason = f"{length} tokens: {length - start} into the overlong buffer of {buffer}"
    return max(-1.0, (start - length) / buffer), reason
