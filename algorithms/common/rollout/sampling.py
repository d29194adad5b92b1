"""What a rollout samples, as one object the algorithm owns and calls at the fixed points of
:meth:`RolloutCollector.collect <algorithms.common.rollout_collection.RolloutCollector.collect>` (as it calls its
parallel object), instead of methods a subclass overrides:

1. :meth:`~RolloutSampling.before_rollout`: at the start of every rollout (e.g. GRPO's reward ramp);
2. :meth:`~RolloutSampling.problem_keys`: which problems the rollout draws (the env's stream; GRPO: its prompt pool);
3. :meth:`~RolloutSampling.from_reference`: whether the frozen reference samples instead of the policy (GRPO's
   protected rollouts);
4. :meth:`~RolloutSampling.after_play`: what happens once the episodes are played (GRPO: DAPO's refill rounds, the
   prompt pool's update), before the batch is built.

:class:`RolloutSampling` is the default, which does nothing more (LMPPO's, and GRPO's when none of its sampling
options is on); GRPO's options are :class:`~algorithms.grpo.sampling.GRPOSampling`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stable_baselines3.common.logger import Logger
from stable_baselines3.common.vec_env import VecEnv

from algorithms.common.rollout.rows import Rows
from algorithms.common.rollout.seeds import RolloutSeeds

#: how a sampling object plays groups again: ``play(slots, mine, refill_round)`` draws new problems for the job's
#: groups ``slots``, plays this rank's (``mine``: local group indices) and returns their rows and generation
#: seconds, or None when a callback stopped training
#: (:meth:`play_again <algorithms.common.rollout_collection.RolloutCollector.play_again>`)
PlayRefill = Callable[[list[int], list[int], int], "tuple[Rows, float] | None"]


class RolloutSampling:
    """Every rollout draws the env's stream of problems and samples from the policy; nothing is played again."""

    def before_rollout(self, env: VecEnv, num_timesteps: int, logger: Logger) -> None:
        """At the start of every rollout, before its problems are drawn."""

    def problem_keys(self, n: int, seeds: RolloutSeeds, env: VecEnv) -> list[dict[str, Any]]:
        """The ``sample_problem`` arguments of the next ``n`` problems: the env's stream (the job-wide seeds)."""
        return seeds.problem_keys(n)

    def from_reference(self, iteration: int, logger: Logger) -> bool:
        """Whether the frozen reference samples the rollout of ``iteration`` instead of the policy."""
        return False

    def after_play(self, rows: Rows, play: PlayRefill, logger: Logger) -> float | None:
        """Once the rollout's episodes are played: may play groups again (``play``) and change ``rows`` in place;
        the extra generation seconds, or None when a callback stopped training."""
        return 0.0
