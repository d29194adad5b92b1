"""The composite reward of S2: a weighted sum of syntax, semantic consistency and task completion.

``total = w_syntax * syntax + w_consistency * consistency + w_task * task``, clipped to ``[-1, 1]``, with
every component in ``[0, 1]`` and the default weights 0.3 / 0.4 / 0.3 (so the default total is in
``[0, 1]``). Semantic consistency is rule-based (:func:`~grpo_gym.rewards.components.consistency_score`)
unless a reward model is configured, in which case it is the reward model's score of
``(prompt_text, completion)`` (S6 step 3). The progressive activation of S20 is a schedule over
``set_weights({"consistency": w})``.

Errors: an exception raised while scoring one component (a task's verifier or consistency hooks, the reward
model) is caught for that component alone. It is counted (:attr:`CompositeReward.error_counts`), reported in
``RewardResult.errors`` (component name -> ``"ExceptionType: message"``) and in that component's reason,
warned about once per :class:`CompositeReward` (so once per env) with the exception text, and then
``on_error`` decides: ``"zero"`` (default) scores that component 0 and goes on, ``"raise"`` re-raises it.
A reward model that returns the wrong number of scores, or a non-finite score, counts as an error too.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from grpo_gym.rewards.components import consistency_score, syntax_score, task_score
from grpo_gym.rewards.parsing import MAX_COMPLETION_CHARS, ParsedCompletion, completion_text, parse_completion
from grpo_gym.validation import ArgumentError, check_choice, check_float, check_mapping

if TYPE_CHECKING:
    from grpo_gym.tasks.base import Problem, Task

COMPONENTS = ("syntax", "consistency", "task")
DEFAULT_WEIGHTS = {"syntax": 0.3, "consistency": 0.4, "task": 0.3}
ON_ERROR = ("zero", "raise")
_MAX_ERROR_CHARS = 300


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
    :param errors: component name -> ``"ExceptionType: message"`` for each component whose scoring raised
        (empty when none did); such a component scored 0
    """

    total: float
    components: dict[str, float]
    is_success: bool
    reasons: dict[str, str]
    answer: str | None = None
    errors: dict[str, str] = field(default_factory=dict)


def _check_weights(mapping: Mapping[str, float]) -> dict[str, float]:
    valid = ", ".join(COMPONENTS)
    checked = check_mapping("reward_weights", mapping, COMPONENTS, allow_none=False)
    return {
        key: check_float(f"weight of {key!r}", value, low=0.0, hint=f"valid keys: {valid}")  # type: ignore[misc]
        for key, value in checked.items()
    }


def error_text(exc: BaseException) -> str:
    """``"ExceptionType: message"``, on one line and capped at 300 characters."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:_MAX_ERROR_CHARS]


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
    :param on_error: what an exception raised while scoring a component does (see the module docstring):
        ``"zero"`` (that component scores 0, the error is reported and counted) or ``"raise"`` (re-raised)
    """

    def __init__(
        self,
        weights: Mapping[str, float] | None = None,
        reward_model: Scorer | str | os.PathLike[str] | None = None,
        on_error: str = "zero",
    ) -> None:
        self._weights = dict(DEFAULT_WEIGHTS)
        if weights is not None:
            self.set_weights(weights)
        if isinstance(reward_model, (str, os.PathLike)):
            from grpo_gym.rewards.reward_model import RewardModelScorer

            reward_model = RewardModelScorer(reward_model)
        elif reward_model is not None and not callable(getattr(reward_model, "score", None)):
            raise ArgumentError(
                f"reward_model must be None, a path to a reward model folder, or an object with a "
                f"score(prompts, completions) method, got {type(reward_model).__name__}"
            )
        self.reward_model = reward_model
        self.on_error: str = check_choice("on_reward_error", on_error, ON_ERROR)
        self.error_counts = dict.fromkeys(COMPONENTS, 0)
        """How many times each component's scoring raised, since construction."""
        self._warned = False

    def __repr__(self) -> str:
        return (
            f"CompositeReward(weights={self._weights}, reward_model={self.reward_model!r}, on_error={self.on_error!r})"
        )

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
        :return: the total, the components, success, the reasons and the errors
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
        model_scores: list[float | BaseException | None] = [None] * len(completions)
        if self.reward_model is not None and completions:
            model_scores = self._model_scores([str(p) for p in prompt_texts], [_rm_text(c) for c in completions])
        return [self._combine(task, pr, p, s) for pr, p, s in zip(problems, parsed, model_scores, strict=True)]

    def _model_scores(self, prompts: list[str], texts: list[str]) -> list[float | BaseException]:
        """One score per completion from the reward model, or the exception it raised (for each completion)."""
        try:
            raw = self.reward_model.score(prompts, texts)  # type: ignore[union-attr]
            scores = [float(value) for value in raw]
            if len(scores) != len(texts):
                raise ValueError(f"the reward model returned {len(scores)} scores for {len(texts)} completions")
        except Exception as exc:
            if self.on_error == "raise":
                self._failed("consistency", exc)  # counts, warns and re-raises
            return [exc] * len(texts)
        bad = ValueError("the reward model returned a non-finite score")
        return [score if math.isfinite(score) else bad for score in scores]

    def _failed(self, name: str, exc: BaseException) -> tuple[float, str, str]:
        """Count and report an exception of component ``name``; re-raise it when ``on_error="raise"``."""
        text = error_text(exc)
        self.error_counts[name] += 1
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"reward component {name!r} raised {text}; it scores 0 (on_reward_error={self.on_error!r}). "
                "Further errors are not warned about again: they are counted in info['reward_errors']",
                RuntimeWarning,
                stacklevel=4,
            )
        if self.on_error == "raise":
            raise exc
        return 0.0, f"error: {text}", text

    def _component(self, name: str, fn: Callable[..., tuple[float, str]], *args: Any) -> tuple[float, str, str | None]:
        try:
            score, reason = fn(*args)
            return float(score), str(reason), None
        except Exception as exc:
            return self._failed(name, exc)

    def _combine(
        self, task: Task, problem: Problem, parsed: ParsedCompletion, model_score: float | BaseException | None
    ) -> RewardResult:
        scores: dict[str, float] = {}
        reasons: dict[str, str] = {}
        errors: dict[str, str] = {}
        if model_score is None:
            consistency = self._component("consistency", consistency_score, task, problem, parsed)
        elif isinstance(model_score, BaseException):
            consistency = self._failed("consistency", model_score)
        else:
            value = min(1.0, max(0.0, model_score))
            consistency = value, f"reward model score {value:.4f}", None
        for name, (score, reason, error) in (
            ("syntax", self._component("syntax", syntax_score, parsed)),
            ("consistency", consistency),
            ("task", self._component("task", task_score, task, problem, parsed)),
        ):
            scores[name], reasons[name] = score, reason
            if error is not None:
                errors[name] = error
        total = sum(self._weights[name] * value for name, value in scores.items())
        return RewardResult(
            total=min(1.0, max(-1.0, total)),
            components=scores,
            is_success=scores["task"] == 1.0,
            reasons=reasons,
            answer=parsed.answer,
            errors=errors,
        )
