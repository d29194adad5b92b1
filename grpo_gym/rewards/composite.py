"""The composite reward: a weighted sum of named components, the built-ins and your reward functions.

``total = sum(weight[name] * score[name])`` over the components that apply to this completion (``None`` scores
are left out, as TRL leaves out ``None`` rewards), then clipped to ``[-clip, clip]`` when ``clip`` is set. ``clip``
(the env's ``reward_clip``) is ``"auto"`` by default: 1 (the original design's ``[-1, 1]``) with the built-in components
alone, **no clip** when reward functions are given, as TRL sums its reward functions without clipping (a clip
would score a correct, well-formatted answer and a wrong, well-formatted one alike once both reach it). When a clip
is set and changes a total, the reward warns once and counts it (:attr:`CompositeReward.clipped_count`). The
built-in components:

- ``syntax`` (0.3): the R1-Zero template followed exactly once (:func:`~grpo_gym.rewards.components.syntax_score`);
- ``consistency`` (0.4): rule-based (:func:`~grpo_gym.rewards.components.consistency_score`; ``None`` where the task
  cannot say what a reasoning concluded), or the reward model's score of ``(prompt_text, completion)`` when one is
  configured;
- ``task`` (0.3): the task's verifier, with partial credit where the verdict gives a score;
- ``length`` (0): DAPO's soft overlong penalty, in ``[-1, 0]`` (:func:`~grpo_gym.rewards.components.length_score`),
  when the token budget and the completion's token ids are known.

Your functions (``reward_funcs=[fn, ...]`` or ``{"name": fn}``, TRL's signature, see
:mod:`grpo_gym.rewards.functions`) are components too, of weight 1 by default. Components the env scores itself
(``env_components``: ``tool_calls`` and ``tool_errors`` when it has tools, :mod:`grpo_gym.tools`) have weight 0 by
default; the env supplies their scores. Weights may be negative (a penalty). The progressive reward activation is a
schedule over ``set_weights({"consistency": w})``. A batch is scored with one call per function and one reward-model
forward (:meth:`CompositeReward.score_batch`).

A batch that no component of non-zero weight scores at all (every reward function returned ``None`` for every
completion, the built-ins at weight 0 or not applicable) is a broken reward, not TRL's per-completion "not
applicable": the reward warns (once; a warning, not an error, so a run with a batch of another kind of data goes
on) and counts it (:attr:`CompositeReward.unscored_batches`); those completions score 0. Weights that are all 0
are refused when the reward is made.

Errors: an exception raised while scoring one component (a task's verifier or consistency hooks, the reward model,
a reward function, a non-finite value, a call past ``reward_timeout``) is caught for that component alone. It is
counted (:attr:`CompositeReward.error_counts`, per completion), reported in ``RewardResult.errors`` (component name ->
``"ExceptionType: message"``) and in that component's reason, warned about once per :class:`CompositeReward` (so
once per env) with the exception text, and then ``on_error`` decides: ``"zero"`` (default) scores that component 0
and goes on, ``"raise"`` re-raises it. A value of the wrong type from user code (a reward function's ``"0.5"``, a
verdict whose ``correct`` is not a bool; :mod:`grpo_gym.rewards.values`) is a bug in that code, not in the completion:
:class:`~grpo_gym.validation.ReturnTypeError` propagates whatever ``on_error`` says.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from grpo_gym.rewards.components import consistency_score, length_score, syntax_score, task_score
from grpo_gym.rewards.functions import RewardLogs, call_reward_funcs, check_reward_funcs, is_per_turn
from grpo_gym.rewards.parsing import MAX_COMPLETION_CHARS, ParsedCompletion, completion_text, parse_completion
from grpo_gym.rewards.reward_model import RewardModelScorer
from grpo_gym.rewards.timeouts import DEFAULT_REWARD_TIMEOUT, call_with_timeout, check_reward_timeout
from grpo_gym.rewards.values import MAX_REWARD, reward_values
from grpo_gym.tasks.base import scores_with_user_code
from grpo_gym.validation import ArgumentError, ReturnTypeError, check_choice, check_float, check_int, check_mapping

if TYPE_CHECKING:
    from grpo_gym.tasks.base import Problem, Task

BUILTIN_COMPONENTS = ("syntax", "consistency", "task", "length")
COMPONENTS = BUILTIN_COMPONENTS
DEFAULT_WEIGHTS = {"syntax": 0.3, "consistency": 0.4, "task": 0.3, "length": 0.0}
FUNCTION_WEIGHT = 1.0
"""The default weight of a reward function (TRL's)."""
ENV_COMPONENT_WEIGHT = 0.0
"""The default weight of a component the env scores itself (``env_components``)."""
ON_ERROR = ("zero", "raise")
SEED_CLIP = 1.0
"""The original design's clip: totals in ``[-1, 1]``, the default without reward functions."""
_MAX_ERROR_CHARS = 300
Scored = tuple[float | None, str, str | None]  # (score, reason, error text)
ModelScore = float | BaseException | None


class Scorer(Protocol):
    """Anything with ``score(prompts, completions) -> floats in [0, 1]``, e.g. ``RewardModelScorer``."""

    def score(self, prompts: list[str], completions: list[str]) -> Any: ...


@dataclass(frozen=True)
class TurnInput:
    """A tool turn, as :func:`~grpo_gym.rewards.functions.per_turn` reward functions score it.

    :param task: the task family of the problem
    :param problem: the episode's problem
    :param prompt: the prompt text the episode started from
    :param completion: this turn's text
    :param transcript: the episode's text after the prompt, this turn included
    :param index: the turn's place among the episode's model turns, from 0
    :param tool_calls: this turn's call records (``info["tool_calls"]``)
    """

    task: Task
    problem: Problem
    prompt: str
    completion: str
    transcript: str
    index: int
    tool_calls: Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class RewardResult:
    """The reward of one completion.

    :param total: the weighted sum of the components that apply (clipped to ``[-clip, clip]`` when a clip is set)
    :param components: every component's score (``None`` where it does not apply), built-ins first
    :param is_success: whether the task component is 1 (full credit)
    :param reasons: a short non-empty explanation per component
    :param answer: the extracted answer (``None`` when there is no unambiguous one)
    :param errors: component name -> ``"ExceptionType: message"`` for each component whose scoring raised
        (empty when none did); such a component scored 0
    :param metrics: what reward functions logged with ``log_metric`` for this completion's batch
    :param extra: what reward functions logged with ``log_extra`` for this completion
    """

    total: float
    components: dict[str, float | None]
    is_success: bool
    reasons: dict[str, str]
    answer: str | None = None
    errors: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def error_text(exc: BaseException) -> str:
    """``"ExceptionType: message"``, on one line and capped at 300 characters."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:_MAX_ERROR_CHARS]


def _rm_text(completion: object) -> str:
    """The completion text shown to the reward model and to reward functions (decoded, capped at the parser's
    length limit)."""
    text = completion_text(completion)
    return "" if text is None else text[:MAX_COMPLETION_CHARS]


def problem_columns(task: Task, problems: Sequence[Problem]) -> dict[str, list[Any]]:
    """The problems' reward columns as lists aligned with them (a column a problem lacks is ``None`` there)."""
    rows = [task.reward_columns(problem) for problem in problems]
    names = list(dict.fromkeys(name for row in rows for name in row))
    return {name: [row.get(name) for row in rows] for name in names}


class CompositeReward:
    """Weighted sum of named reward components for a batch of completions. Never raises on any completion.

    :param weights: component weights; missing keys keep their default (``DEFAULT_WEIGHTS``, 1 for a reward
        function). Keys: the built-in components and the names of ``reward_funcs``; values finite (may be negative)
    :param reward_model: a :class:`~grpo_gym.rewards.reward_model.RewardModelScorer`, any object with a
        compatible ``score(prompts, completions)`` method, or a path to load one from. When given, it
        replaces the rule-based consistency component
    :param on_error: what an exception raised while scoring a component does (see the module docstring):
        ``"zero"`` (that component scores 0, the error is reported and counted) or ``"raise"`` (re-raised)
    :param reward_funcs: a list of functions with TRL's signature, named after them, or ``{name: fn}``
        (see :func:`~grpo_gym.rewards.functions.named_reward_funcs`)
    :param max_new_tokens: the completion budget the ``length`` component measures against (``None``: ``length``
        does not apply)
    :param overlong_buffer: the ``length`` component's buffer in tokens (default: a quarter of ``max_new_tokens``)
    :param column_names: called when a reward function requires a named argument: the columns the task provides
    :param reward_timeout: seconds each reward function call and each reward-model scoring may take before that
        component scores 0 as a reward error (:mod:`grpo_gym.rewards.timeouts`; ``None``: no limit)
    :param clip: ``"auto"`` (1 without reward functions, ``None`` with them), ``None`` (no clip) or a positive
        number ``c``: totals clipped to ``[-c, c]``
    :param env_components: names of components whose scores the caller supplies (``score_batch(supplied=...)``)
    """

    def __init__(
        self,
        weights: Mapping[str, float] | None = None,
        reward_model: Scorer | str | os.PathLike[str] | None = None,
        on_error: str = "zero",
        reward_funcs: Sequence[Callable[..., Any] | str] | Mapping[str, Callable[..., Any] | str] | None = None,
        max_new_tokens: int | None = None,
        overlong_buffer: int | None = None,
        column_names: Callable[[], Collection[str] | None] | None = None,
        reward_timeout: float | None = DEFAULT_REWARD_TIMEOUT,
        clip: float | str | None = "auto",
        env_components: Sequence[str] = (),
    ) -> None:
        self.env_components = tuple(env_components)
        reserved = (*BUILTIN_COMPONENTS, *self.env_components)
        self.reward_funcs = check_reward_funcs(reward_funcs, reserved, column_names)
        if clip == "auto":
            clip = None if self.reward_funcs else SEED_CLIP
        #: totals are clipped to ``[-clip, clip]``; ``None``: not clipped
        self.clip = check_float("reward_clip", clip, low=0.0, low_open=True, allow_none=True, hint="or 'auto'")
        self.clipped_count = 0
        """How many totals the clip changed, since construction."""
        self._warned_clip = False
        self._warned_range = False
        self._weights = {
            **DEFAULT_WEIGHTS,
            **dict.fromkeys(self.env_components, ENV_COMPONENT_WEIGHT),
            **dict.fromkeys(self.reward_funcs, FUNCTION_WEIGHT),
        }
        if weights is not None:
            self.set_weights(weights)
        if not any(self._weights.values()):
            raise ArgumentError(
                f"reward_weights: every component has weight 0 ({', '.join(self._weights)}), so every completion "
                "would score 0 and nothing would be learned; give at least one a non-zero weight"
            )
        if isinstance(reward_model, (str, os.PathLike)):
            reward_model = RewardModelScorer(reward_model)
        elif reward_model is not None and not callable(getattr(reward_model, "score", None)):
            raise ArgumentError(
                f"reward_model must be None, a path to a reward model folder, or an object with a "
                f"score(prompts, completions) method, got {type(reward_model).__name__}"
            )
        self.reward_model = reward_model
        self.on_error: str = check_choice("on_reward_error", on_error, ON_ERROR)
        self.reward_timeout = check_reward_timeout(reward_timeout)
        self.max_new_tokens = check_int("max_new_tokens", max_new_tokens, low=1, allow_none=True)
        default_buffer = None if self.max_new_tokens is None else max(1, self.max_new_tokens // 4)
        self.overlong_buffer = check_int(
            "overlong_buffer",
            default_buffer if overlong_buffer is None else overlong_buffer,
            low=1,
            high=self.max_new_tokens,
            allow_none=True,
            hint=f"at most max_new_tokens ({self.max_new_tokens})",
        )
        self.error_counts = dict.fromkeys(self._weights, 0)
        """How many completions each component's scoring raised for, since construction."""
        self.unscored_batches = 0
        """How many batches no weighted component scored at all (every reward function returned None), since
        construction."""
        self._warned = False

    def __repr__(self) -> str:
        return (
            f"CompositeReward(weights={self._weights}, reward_model={self.reward_model!r}, on_error={self.on_error!r}, "
            f"reward_funcs={list(self.reward_funcs)}, clip={self.clip})"
        )

    @property
    def names(self) -> tuple[str, ...]:
        """The component names: the built-ins, then the reward functions."""
        return tuple(self._weights)

    @property
    def weights(self) -> dict[str, float]:
        """A copy of the current component weights."""
        return dict(self._weights)

    def set_weights(self, mapping: Mapping[str, float]) -> None:
        """Update some or all weights (the others keep their value); nothing changes when one is invalid.

        :param mapping: ``{component: weight}`` with keys among :attr:`names`; finite numbers, negative allowed
        :raises ValueError: on an unknown key or a non-finite weight
        """
        self._weights.update(self.check_weights(mapping))

    def check_weights(self, mapping: Mapping[str, float]) -> dict[str, float]:
        """``mapping`` checked as :meth:`set_weights` checks it, without applying it: ``{component: float}``."""
        valid = ", ".join(self._weights)
        checked = check_mapping("reward_weights", mapping, self._weights, allow_none=False)
        return {
            key: check_float(f"weight of {key!r}", value, hint=f"valid keys: {valid}")  # type: ignore[misc]
            for key, value in checked.items()
        }

    def __call__(self, task: Task, problem: Problem, completion: str | bytes, prompt_text: str = "") -> RewardResult:
        """Score one completion (see :meth:`score_batch`)."""
        return self.score_batch(task, [problem], [completion], [prompt_text])[0]

    def score_batch(
        self,
        task: Task,
        problems: Sequence[Problem],
        completions: Sequence[str | bytes],
        prompt_texts: Sequence[str] | None = None,
        completion_ids: Sequence[Sequence[int]] | None = None,
        transcripts: Sequence[str] | None = None,
        supplied: Sequence[Mapping[str, float | None]] | None = None,
        turns: Sequence[int] | None = None,
    ) -> list[RewardResult]:
        """Score many completions: each reward function is called once and the reward model runs once for all.

        :param task: the task family that made the problems
        :param problems: one problem per completion
        :param completions: the completions, ``str`` or UTF-8 ``bytes``
        :param prompt_texts: one prompt per completion, for the reward model and reward functions (default: empty)
        :param completion_ids: each completion's token ids, EOS included (for ``length`` and reward functions;
            default: unknown, ``length`` does not apply and functions get ``None``)
        :param transcripts: what the reward model and reward functions read as each completion (a multi-turn
            episode's whole text after the prompt; default: the completions)
        :param supplied: per completion, the scores of ``env_components`` (default: not applicable)
        :param turns: per completion, its model turn in the episode (reward functions' ``turn``; default: 0)
        :return: one :class:`RewardResult` per completion, in order
        """
        n = len(completions)
        if len(problems) != n:
            raise ValueError(f"got {len(problems)} problems but {n} completions")
        prompts = [""] * n if prompt_texts is None else [str(p) for p in prompt_texts]
        if len(prompts) != n:
            raise ValueError(f"got {len(prompts)} prompt_texts but {n} completions")
        ids = [None] * n if completion_ids is None else [[int(t) for t in row] for row in completion_ids]
        if len(ids) != n:
            raise ValueError(f"got {len(ids)} completion_ids but {n} completions")
        parsed = [parse_completion(c) for c in completions]
        read = completions if transcripts is None else transcripts
        texts = [_rm_text(c) for c in read] if self.reward_model is not None or self.reward_funcs else []
        model_scores: list[float | BaseException | None] = [None] * n
        if self.reward_model is not None and n:
            model_scores = self._model_scores(prompts, texts)
        logs = RewardLogs(n)
        turn = {"turn": [0] * n if turns is None else [int(t) for t in turns], "tool_calls": [[] for _ in range(n)],
                "turn_completions": [_rm_text(c) for c in completions] if self.reward_funcs else []}  # fmt: skip
        user = self._function_scores(task, problems, prompts, texts, ids, logs, turn) if self.reward_funcs and n else {}
        results = []
        for i, problem in enumerate(problems):
            scored = self._builtins(task, problem, parsed[i], model_scores[i], ids[i])
            scored.update(self._supplied(None if supplied is None else supplied[i]))
            for name, values in user.items():
                scored[name] = self._function_value(name, values[i])
            extra = {column: values[i] for column, values in logs.extra.items()}
            results.append(self._result(scored, parsed[i], logs.metrics, extra))
        if self.reward_funcs and results and not any(self._applies(result) for result in results):
            self._unscored(len(results))
        return results

    def _applies(self, result: RewardResult) -> bool:
        """Whether a component of non-zero weight scored ``result`` (its total is not a default 0)."""
        return any(self._weights[name] and value is not None for name, value in result.components.items())

    def _unscored(self, n: int) -> None:
        """A batch that nothing scored: counted, and warned about once (see :attr:`unscored_batches`)."""
        self.unscored_batches += 1
        if self.unscored_batches == 1:
            warnings.warn(
                f"reward: no weighted component scored any of the {n} completions of this batch: every reward "
                f"function ({', '.join(self.reward_funcs)}) returned None (not applicable) for each, so they all "
                "score 0 and the batch teaches nothing. This is a warning, not an error: TRL reads None as 'not "
                "applicable' for one function and one completion, but a whole batch of them means the functions do "
                "not fit the data (check the columns they read, e.g. the answer column) or a function that scores "
                "these completions is missing. Further such batches are counted in reward_fn.unscored_batches",
                RuntimeWarning,
                stacklevel=4,
            )

    def score_without_answer(
        self,
        reason: str,
        completion_ids: Sequence[int] | None = None,
        supplied: Mapping[str, float | None] | None = None,
        turn: TurnInput | None = None,
    ) -> RewardResult:
        """The reward of a turn that gives no answer to score (a tool call): the answer's components and the reward
        functions do not apply (``None``, ``reason`` says why), but those marked
        :func:`~grpo_gym.rewards.functions.per_turn`, which score ``turn`` (when given); ``length`` and the
        ``supplied`` env components do."""
        length = None if completion_ids is None else len(completion_ids)
        scored: dict[str, Scored] = {name: (None, reason, None) for name in self._weights}
        scored["length"] = self._component("length", length_score, length, self.max_new_tokens, self.overlong_buffer)
        scored.update(self._supplied(supplied))
        every_turn = {name: fn for name, fn in self.reward_funcs.items() if is_per_turn(fn)}
        logs = RewardLogs(1)
        if turn is not None and every_turn:
            ids = None if completion_ids is None else [[int(t) for t in completion_ids]]
            extra = {"turn": [turn.index], "tool_calls": [list(turn.tool_calls)],
                     "turn_completions": [_rm_text(turn.completion)]}  # fmt: skip
            texts, prompts = [_rm_text(turn.transcript)], [turn.prompt]
            values = self._function_scores(turn.task, [turn.problem], prompts, texts, [ids], logs, extra, every_turn)
            for name, row in values.items():
                scored[name] = self._function_value(name, row[0])
        extra_columns = {column: values[0] for column, values in logs.extra.items()}
        return self._result(scored, parse_completion(""), logs.metrics, extra_columns)

    def _supplied(self, scores: Mapping[str, float | None] | None) -> dict[str, Scored]:
        """The env components' scores as given (``None``: not applicable)."""
        scores = scores or {}
        return {
            name: (None, "not applicable", None)
            if scores.get(name) is None
            else (float(scores[name]), "scored by the env", None)
            for name in self.env_components
        }

    def _model_scores(self, prompts: list[str], texts: list[str]) -> list[float | BaseException | None]:
        """One score per completion from the reward model, or the exception it raised (for each completion)."""
        model = self.reward_model
        if isinstance(model, RewardModelScorer):  # before the clock starts: the limit is on scoring, not on loading;
            model.load()  # a model that cannot load is the run's error, not a consistency of 0 at every step
        try:
            raw = call_with_timeout(lambda: model.score(prompts, texts), self.reward_timeout, "the reward model")
            return reward_values("the reward model", raw, len(texts), allow_none=False)
        except ReturnTypeError:
            raise
        except Exception as exc:
            if self.on_error == "raise":
                self._failed("consistency", exc)  # counts, warns and re-raises
            return [exc] * len(texts)

    def _function_scores(
        self,
        task: Task,
        problems: Sequence[Problem],
        prompts: list[str],
        texts: list[str],
        ids: list[Any],
        logs: RewardLogs,
        turn: dict[str, list[Any]],
        funcs: Mapping[str, Callable[..., Any]] | None = None,
    ) -> dict[str, list[float | BaseException | None]]:
        """One call per reward function (``funcs``, default all) for the whole batch; per function, one value per
        completion. ``turn``: the per-turn arguments (``turn``, ``turn_completions``, ``tool_calls``)."""
        n, funcs = len(problems), self.reward_funcs if funcs is None else funcs
        try:
            columns = problem_columns(task, problems)
        except Exception as exc:  # a task's reward_columns raised: every function errs
            return {name: [exc] * n for name in funcs}
        if not isinstance(problems[0].prompt_input, str):  # a conversational dataset: TRL's conversational forms
            prompts = [problem.prompt_input for problem in problems]  # type: ignore[misc]
            texts = [[{"role": "assistant", "content": text}] for text in texts]  # type: ignore[misc]
        kwargs = {
            **columns,
            "prompts": prompts,
            "completions": texts,
            "completion_ids": ids,
            "trainer_state": None,
            "log_extra": logs.log_extra,
            "log_metric": logs.log_metric,
            **turn,
        }
        values = call_reward_funcs(funcs, kwargs, n, self.reward_timeout)
        if self.on_error == "raise":
            for name, row in values.items():
                first = next((v for v in row if isinstance(v, BaseException)), None)
                if first is not None:
                    self._failed(name, first)  # counts, warns and re-raises
        return values

    def _failed(self, name: str, exc: BaseException) -> Scored:
        """Count and report an exception of component ``name``; re-raise it when ``on_error="raise"``."""
        text = error_text(exc)
        self.error_counts[name] = self.error_counts.get(name, 0) + 1
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

    def _clipped(self, total: float) -> float:
        """``total`` clipped to ``[-clip, clip]``; a change is counted and warned about once."""
        if self.clip is None or -self.clip <= total <= self.clip:
            return total
        self.clipped_count += 1
        if not self._warned_clip:
            self._warned_clip = True
            warnings.warn(
                f"the weighted sum of the reward components ({total:.4g}) was clipped to "
                f"[-{self.clip:g}, {self.clip:g}] (reward_clip={self.clip:g}): completions beyond the clip all get "
                "the same reward, so what tells them apart no longer reaches the advantages; pass reward_clip=None "
                "(no clip) or a larger one, or lower the weights (further clips are counted in "
                "reward_fn.clipped_count, not warned about)",
                RuntimeWarning,
                stacklevel=5,
            )
        return max(-self.clip, min(self.clip, total))

    def _representable(self, total: float) -> float:
        """``total`` capped to float32's range (weights times components within it can still pass it), warned once:
        rollouts store rewards in float32, where a larger total would become an infinity."""
        if abs(total) <= MAX_REWARD:
            return total
        if not self._warned_range:
            self._warned_range = True
            warnings.warn(
                f"the weighted sum of the reward components ({total:.4g}) is beyond float32's range, in which "
                f"rollouts store rewards: it is capped to +-{MAX_REWARD:.4g}; lower the weights or the functions' "
                "scale",
                RuntimeWarning,
                stacklevel=5,
            )
        return math.copysign(MAX_REWARD, total)

    def _component(self, name: str, fn: Callable[..., tuple[float | None, str]], *args: Any) -> Scored:
        try:
            score, reason = fn(*args)
            return (None if score is None else float(score)), str(reason), None
        except ReturnTypeError:  # the task's code returned a value of the wrong type: its bug, whatever on_error
            raise
        except Exception as exc:
            return self._failed(name, exc)

    def _task_component(
        self, name: str, fn: Callable[..., tuple[float | None, str]], task: Task, problem: Problem, parsed: Any
    ) -> Scored:
        """A component that calls the task's scoring hooks: bounded by ``reward_timeout`` when they are user code
        (:func:`~grpo_gym.tasks.base.scores_with_user_code`; the built-in tasks' hooks are ours and always return)."""
        if self.reward_timeout is None or not scores_with_user_code(task):
            return self._component(name, fn, task, problem, parsed)
        what = f"task {task.name!r}'s scoring of {name!r} (its verify or consistency hooks)"
        return self._component(
            name, lambda: call_with_timeout(lambda: fn(task, problem, parsed), self.reward_timeout, what)
        )

    def _function_value(self, name: str, value: float | BaseException | None) -> Scored:
        if isinstance(value, BaseException):
            return self._failed(name, value)
        if value is None:
            return None, "not applicable (the function returned None)", None
        return value, f"{value:.4g}", None

    def _builtins(
        self, task: Task, problem: Problem, parsed: ParsedCompletion, model_score: ModelScore, ids: Any
    ) -> dict[str, Scored]:
        if model_score is None:
            consistency = self._task_component("consistency", consistency_score, task, problem, parsed)
        elif isinstance(model_score, BaseException):
            consistency = self._failed("consistency", model_score)
        else:
            value = min(1.0, max(0.0, model_score))
            consistency = value, f"reward model score {value:.4f}", None
        length = None if ids is None else len(ids)
        return {
            "syntax": self._component("syntax", syntax_score, parsed),
            "consistency": consistency,
            "task": self._task_component("task", task_score, task, problem, parsed),
            "length": self._component("length", length_score, length, self.max_new_tokens, self.overlong_buffer),
        }

    def _result(
        self, scored: dict[str, Scored], parsed: ParsedCompletion, metrics: dict[str, float], extra: dict[str, Any]
    ) -> RewardResult:
        scores = {name: score for name, (score, _, _) in scored.items()}
        total = sum(self._weights[name] * value for name, value in scores.items() if value is not None)
        return RewardResult(
            total=self._representable(self._clipped(total)),
            components=scores,
            is_success=scores["task"] == 1.0,
            reasons={name: reason for name, (_, reason, _) in scored.items()},
            answer=parsed.answer,
            errors={name: error for name, (_, _, error) in scored.items() if error is not None},
            metrics=dict(metrics),
            extra=extra,
        )
