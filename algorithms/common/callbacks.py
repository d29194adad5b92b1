"""Callbacks of the training loop: the dynamic curriculum."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from grpo_gym.curriculum import DynamicCurriculum


class CurriculumCallback(BaseCallback):
    """Feed each rollout's success rate to a :class:`DynamicCurriculum` and set its level on every env.

    After every rollout the share of its completions the env marked ``is_success`` goes to
    ``curriculum.update``; the new level is applied to the training VecEnv through ``env_method`` (so envs in
    other processes follow) and logged as ``curriculum/difficulty``. With several training processes the
    rate is that of every process's episodes, so every rank sets the same level. The level is also applied once at the
    start of training, so the first rollout already uses ``curriculum.difficulty``.

    :param curriculum: the rule and its state (default: the original design's, starting at 0.3)
    """

    def __init__(self, curriculum: DynamicCurriculum | None = None, verbose: int = 0) -> None:
        super().__init__(verbose)
        self.curriculum = curriculum or DynamicCurriculum()
        self._successes: list[float] = []

    def get_state(self) -> dict[str, Any]:
        """The curriculum's rule and current level, as plain values (for a saved run)."""
        c = self.curriculum
        names = ("raise_above", "lower_below", "step_up", "step_down", "minimum", "maximum")
        return {"difficulty": c.difficulty, **{name: getattr(c, name) for name in names}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> CurriculumCallback:
        """A callback whose curriculum continues from :meth:`get_state`'s values."""
        state = dict(state)
        return cls(DynamicCurriculum(initial=state.pop("difficulty"), **state))

    def _on_training_start(self) -> None:
        self.curriculum.apply(self.training_env)
        self.logger.record("curriculum/difficulty", self.curriculum.difficulty)

    def _on_rollout_start(self) -> None:
        self._successes = []

    def _on_step(self) -> bool:
        self._successes.extend(float(info.get("is_success", False)) for info in self.locals.get("infos", []))
        return True

    def _on_rollout_end(self) -> None:
        successes, count = float(np.sum(self._successes)), float(len(self._successes))
        dist = getattr(self.model, "_dist", None)
        if dist is not None and dist.enabled:  # every process's episodes: all ranks move to the same level
            successes, count = dist.sum(successes), dist.sum(count)
        if not count:
            return
        level = self.curriculum.update(successes / count)
        self.curriculum.apply(self.training_env)
        self.logger.record("curriculum/difficulty", level)
        self.logger.record("curriculum/success_rate", successes / count)


class HeldOutEvalCallback(BaseCallback):
    """Held-out success every ``eval_every`` iterations, as SB3's ``EvalCallback`` does every ``eval_freq`` steps:
    the same held-out problems each time (:func:`~algorithms.common.evaluation.evaluate_problems`), logged as
    ``eval/success_rate``, ``eval/mean_reward`` and ``eval/mean_length``, and ``time/eval_seconds``, the evaluations'
    time so far (a run's training time is its wall-clock minus that). :attr:`results` holds ``(iteration, training
    seconds, result)`` of each. With ``samples=K``, ``eval/success_rate`` is greedy, and ``eval/sampled_success`` and
    ``eval/pass_at_k`` (K sampled answers per problem) show how much of pass@k the policy turns into greedy success.

    :param env: the VecEnv whose task gives the problems (the training env)
    :param eval_every: iterations between evaluations
    :param difficulties: the first is evaluated (``None``: the env's difficulty)
    :param n: problems
    :param greedy: greedy decoding instead of the policy's sampling
    :param seed: selects the problems and seeds the sampler
    :param say: called with one line per evaluation (``print``), or ``None``
    :param samples: ``K`` sampled answers per problem for pass@k (0: none)
    """

    def __init__(
        self,
        env: Any,
        eval_every: int,
        difficulties: list[float] | None = None,
        n: int = 100,
        greedy: bool = False,
        seed: int = 0,
        say: Any = None,
        verbose: int = 0,
        samples: int = 0,
    ) -> None:
        super().__init__(verbose)
        self.env, self.eval_every, self.difficulties, self.n = env, eval_every, difficulties, n
        self.greedy, self.seed, self.say, self.samples = greedy, seed, say, samples
        self.seconds = 0.0
        self.started = 0.0
        self.results: list[tuple[int, float, Any]] = []

    def _on_training_start(self) -> None:
        self.started = time.perf_counter()

    def _on_rollout_start(self) -> None:
        iteration = int(self.model.iteration)
        if iteration == 0 or iteration % self.eval_every or (self.results and self.results[-1][0] == iteration):
            return
        from algorithms.common.evaluation import evaluate_problems, held_out_problems

        start = time.perf_counter()
        training = start - self.started - self.seconds
        with self.model.gathered_policy():  # every rank: a sharded policy is gathered; rank 0 evaluates
            result = None
            if self.model.distributed.is_main:
                level = self.difficulties[0] if self.difficulties else self.env.get_attr("difficulty", [0])[0]
                problems = held_out_problems(self.env, self.n, float(level), self.seed)
                result = evaluate_problems(self.model.policy, self.env, problems, self.seed, self.greedy, self.samples)
        self.seconds += time.perf_counter() - start
        if result is None:
            return
        self.results.append((iteration, training, result))
        self.logger.record("eval/success_rate", result.success_rate)
        self.logger.record("eval/mean_reward", result.mean_reward)
        self.logger.record("eval/mean_length", result.mean_length)
        at_k = ""
        if result.samples:
            self.logger.record("eval/sampled_success", result.sampled_success)
            self.logger.record("eval/pass_at_k", result.pass_at_k)
            at_k = f" (greedy; sampled {result.sampled_success:.1%}, pass@{result.samples} {result.pass_at_k:.1%})"
        self.logger.record("time/eval_seconds", self.seconds)
        if self.say is not None:
            self.say(
                f"iteration {iteration} (GRPO {training:.0f} s): held-out success {result.success_rate:.1%}{at_k} at "
                f"{result.difficulty:.2f}",
                flush=True,
            )

    def _on_step(self) -> bool:
        return True
