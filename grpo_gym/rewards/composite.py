"""The composite reward of S2: a weighted sum of syntax, semantic consistency and task completion.

``total = w_syntax * syntax + w_consistency * consistency + w_task * task``, clipped to ``[-1, 1]``, with
every component in ``[0, 1]`` and the default weights 0.3 / 0.4 / 0.3 (so the default total is in
``[0, 1]``). Semantic consistency is rule-based (:func:`~grpo_gym.rewards.components.consistency_score`)
unless a reward model is configured, in which case it is the reward model's score of
``(prompt_text, completion)`` (S6 step 3). The progressive activation of S20 is a schedule over
``set_weights({"consistency": w})``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from grpo_gym.rewards.components import consistency_score, syntax_score, task_score
from grpo_gym.rewards.parsing import MAX_COMPLETION_CHARS, ParsedCompletion, completion_text, parse_completion

if TYPE_CHECKING:
    from grpo_gym.tasks.base import Problem, Task

COMPONENTS = ("syntax", "consistency", "task")
DEFAULT_WEIGHTS = {"syntax": 0.3, "consistency": 0.4, "task": 0.3}


class Scorer(Protocol):
    """Anything with ``score(prompts, completions) -> floats in [0, 1]``, e.g. ``RewardModelScorer``."""

    def score(self, prompts: list[str], completions: list[str]) -> Any: ...


@dataclass(frozen=True)
class RewardResult:
    """The reward of one completion.

    :param total: the weighted sum of the components, clipped to ``[-1, 1]``
    :param components: ``{"syntax", "consistency", "task"}`` scores, each in ``[0, 1]``
    :param is_success: whether the task component is 1 (the verifier accepted the answer)
    :param reasons: a short non-empty explanation per component
    :param answer: the extracted answer (``None`` when there is no unambiguous one)
    """

    total: float
    components: dict[str, float]
    is_success: bool
    reasons: dict[str, str]
    answer: str | None = None


def _check_weights(mapping: Mapping[str, float]) -> dict[str, float]:
    valid = ", ".join(COMPONENTS)
    checked = {}
    for key, value in mapping.items():
        if key not in COMPONENTS:
            raise ValueError(f"unknown reward component {key!r}; valid keys: {valid}")
        try:
            weight = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"weight of {key!r} must be a number, got {value!r}; valid keys: {valid}") from None
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"weight of {key!r} must be finite and >= 0, got {value!r}; valid keys: {valid}")
        checked[key] = weight
    return checked


def _rm_text(completion: object) -> str:
    """The completion text shown to the reward model (decoded, capped at the parser's length limit)."""
    text = completion_text(completion)
    return "" if text is None else text[:MAX_COMPLETION_CHARS]


class CompositeReward:
    """Weighted sum of the S2 reward components for one completion. Never raises on any completion.

    :param weights: component weights; missing keys keep their default (``DEFAULT_WEIGHTS``). Valid keys:
        ``"syntax"``, ``"consistency"``, ``"task"``; values must be finite and >= 0
    :param reward_model: a :class:`~grpo_gym.rewards.reward_model.RewardModelScorer`, any object with a
        compatible ``score(prompts, completions)`` method, or a path to load one from. When given, it
        replaces the rule-based consistency component
    """

    def __init__(
        self,
        weights: Mapping[str, float] | None = None,
        reward_model: Scorer | str | os.PathLike[str] | None = None,
    ) -> None:
        self._weights = dict(DEFAULT_WEIGHTS)
        if weights is not None:
            self.set_weights(weights)
        if isinstance(reward_model, (str, os.PathLike)):
            from grpo_gym.rewards.reward_model import RewardModelScorer

            reward_model = RewardModelScorer(reward_model)
        self.reward_model = reward_model

    def __repr__(self) -> str:
        return f"CompositeReward(weights={self._weights}, reward_model={self.reward_model!r})"

    @property
    def weights(self) -> dict[str, float]:
        """A copy of the current component weights."""
        return dict(self._weights)

    def set_weights(self, mapping: Mapping[str, float]) -> None:
        """Update some or all weights (the others keep their value); nothing changes when one is invalid.

        :param mapping: ``{component: weight}`` with keys among ``"syntax"``, ``"consistency"``, ``"task"``
        :raises ValueError: on an unknown key or a negative or non-finite weight
        """
        self._weights.update(_check_weights(mapping))

    def __call__(self, task: Task, problem: Problem, completion: str | bytes, prompt_text: str = "") -> RewardResult:
        """Score one completion.

        :param task: the task family that made ``problem``
        :param problem: the problem the completion answers
        :param completion: the completion (text after the prompt), ``str`` or UTF-8 ``bytes``
        :param prompt_text: the prompt shown to the model, used only by a configured reward model
        :return: the total, the components, success and the reasons
        """
        return self.score_batch(task, [problem], [completion], [prompt_text])[0]

    def score_batch(
        self,
        task: Task,
        problems: Sequence[Problem],
        completions: Sequence[str | bytes],
        prompt_texts: Sequence[str] | None = None,
    ) -> list[RewardResult]:
        """Score many completions; a configured reward model sees them all in one call.

        :param task: the task family that made the problems
        :param problems: one problem per completion
        :param completions: the completions, ``str`` or UTF-8 ``bytes``
        :param prompt_texts: one prompt per completion for the reward model (default: empty prompts)
        :return: one :class:`RewardResult` per completion, in order
        """
        if len(problems) != len(completions):
            raise ValueError(f"got {len(problems)} problems but {len(completions)} completions")
        if prompt_texts is None:
            prompt_texts = [""] * len(completions)
        elif len(prompt_texts) != len(completions):
            raise ValueError(f"got {len(prompt_texts)} prompt_texts but {len(completions)} completions")
        parsed = [parse_completion(c) for c in completions]
        model_scores: list[float | None] = [None] * len(completions)
        if self.reward_model is not None and completions:
            texts = [_rm_text(c) for c in completions]
            model_scores = [float(s) for s in self.reward_model.score([str(p) for p in prompt_texts], texts)]
        return [self._combine(task, pr, p, s) for pr, p, s in zip(problems, parsed, model_scores, strict=True)]

    def _combine(
        self, task: Task, problem: Problem, parsed: ParsedCompletion, model_score: float | None
    ) -> RewardResult:
        syntax, syntax_reason = syntax_score(parsed)
        if model_score is None:
            consistency, consistency_reason = consistency_score(task, problem, parsed)
        elif math.isfinite(model_score):
            consistency = min(1.0, max(0.0, model_score))
            consistency_reason = f"reward model score {consistency:.4f}"
        else:
            consistency, consistency_reason = 0.0, f"reward model score not finite ({model_score})"
        solved, task_reason = task_score(task, problem, parsed)
        components = {"syntax": syntax, "consistency": consistency, "task": solved}
        weights = self._weights
        total = sum(weights[name] * value for name, value in components.items())
        return RewardResult(
            total=min(1.0, max(-1.0, total)),
            components=components,
            is_success=solved == 1.0,
            reasons={"syntax": syntax_reason, "consistency": consistency_reason, "task": task_reason},
            answer=parsed.answer,
        )
