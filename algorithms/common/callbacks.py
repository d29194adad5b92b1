"""Callbacks of the training loop: the dynamic curriculum."""

from __future__ import annotations

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
