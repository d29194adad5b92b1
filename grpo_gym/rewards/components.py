"""The three reward components of S2 as pure functions of one parsed completion.

Each returns ``(score, reason)`` with ``score`` in ``[0, 1]`` and a short, non-empty, human-readable
``reason``. The task is only ever handed the *extracted* answer string (never the whole completion) and
never executes it (S30). An exception raised by a task's methods propagates: :class:`CompositeReward`
catches it per component, counts it, reports it in ``RewardResult.errors`` and applies its ``on_error``
policy (see :mod:`grpo_gym.rewards.composite`), so one buggy verifier is visible and cannot crash training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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


def consistency_score(task: Task, problem: Problem, parsed: ParsedCompletion) -> tuple[float, str]:
    """Rule-based semantic consistency: does the answer follow from a reasoning about this problem?

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
    if parsed.answer is None:
        return 0.0, f"no answer ({parsed.reason})"
    if not parsed.reasoning:
        return 0.0, "no reasoning"
    conclusion = task.conclusion(problem, parsed.reasoning)
    agree = conclusion is not None and bool(task.answers_agree(problem, conclusion, parsed.answer))
    terms = list(task.key_terms(problem))
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
    """Task completion: 1.0 iff ``task.verify(problem, parsed.answer).correct``, else 0.0 (also no answer).

    :param task: the task family that made ``problem``
    :param problem: the problem the completion answers
    :param parsed: the parsed completion; only ``parsed.answer`` reaches the verifier
    :return: ``(score, reason)``: ``"correct"``, or the verifier's reason
    :raises Exception: whatever ``task.verify`` raises (``CompositeReward`` catches it)
    """
    if parsed.answer is None:
        return 0.0, f"no unambiguous answer ({parsed.reason})"
    verdict = task.verify(problem, parsed.answer)
    correct, reason = bool(verdict.correct), str(verdict.reason)
    if correct:
        return 1.0, "correct"
    return 0.0, reason or "incorrect"
