"""What GRPO's rollout samples (:class:`GRPOSampling`, the object the rollout calls at its fixed points, see
:mod:`algorithms.common.rollout_collection`): the reward ramp, the learnability-prioritised prompts
(:class:`~algorithms.common.rollout.prompt_pool.LearnabilityPool`), the protected rollouts and DAPO's dynamic
sampling that refills.

Where it sits in the data flow: after the rollout's episodes are played, :meth:`GRPOSampling.after_play` runs
:func:`dynamic_sampling`: new problems for the groups whose rewards are all equal, until none is (or
``max_resample_rounds`` rounds are spent), replacing those groups' rows (:func:`replace_groups`) before the
advantages are computed, then tells the prompt pool how each drawn problem went. The decision is the pure function
:func:`refill_slots`; what the rounds played accumulates in :class:`Refills`; the algorithm plays the episodes.

Several processes: every rank sees every group's outcome (all-gathered), so every rank decides the same rounds and
the same slots; each rank plays the new groups that fall in its own share of the K, with the sampling noise of
their place among all the new groups (so the result does not depend on the number of processes either).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.vec_env import VecEnv

from algorithms.common.advantages import uniform_group_mask
from algorithms.common.rollout.prompt_pool import LearnabilityPool
from algorithms.common.rollout.rows import Rows, turn_returns
from algorithms.common.rollout_collection import PlayRefill, RolloutSampling
from algorithms.common.runtime.distributed import Distributed
from algorithms.common.runtime.seeds import RolloutSeeds
from algorithms.grpo import controls


def refill_slots(uniform: Sequence[bool], rounds_done: int, max_rounds: int) -> list[int]:
    """The groups to sample again in the next round: every uniform one while rounds remain, else none."""
    if rounds_done >= max_rounds:
        return []
    return [k for k, flag in enumerate(uniform) if flag]


def dynamic_sampling(
    uniform: Sequence[bool], play: Callable[[list[int]], Sequence[bool] | None], max_rounds: int
) -> tuple[int, int] | None:
    """DAPO's dynamic sampling (Yu et al. 2025, §3.2), refilling: while some group's rewards are all equal and
    fewer than ``max_rounds`` rounds were played, ``play(slots)`` samples a new problem for each of those groups and
    says which new groups are uniform (None: training was stopped meanwhile, and so is the loop). Returns
    ``(rounds played, groups resampled)``, or None when stopped; at most ``max_rounds`` rounds and
    ``max_rounds * K`` groups."""
    uniform = [bool(flag) for flag in uniform]
    rounds = resampled = 0
    while slots := refill_slots(uniform, rounds, max_rounds):
        flags = play(slots)
        if flags is None:
            return None
        for slot, flag in zip(slots, flags, strict=True):
            uniform[slot] = bool(flag)
        rounds, resampled = rounds + 1, resampled + len(slots)
    return rounds, resampled


@dataclass
class Refills:
    """What the refill rounds of one rollout played: every new group's success rate (in the order their problems
    were drawn, the order the prompt pool wants them), the generation seconds, and the rounds so far."""

    rates: list[float] = field(default_factory=list)
    seconds: float = 0.0
    rounds: int = 0


def group_outcomes(rows: Rows, n_groups: int, group_size: int, gamma: float) -> tuple[th.Tensor, th.Tensor]:
    """``(n_groups,)`` whether each group's returns are all equal, and ``(n_groups,)`` its success rate (an episode
    succeeds when one of its turns did)."""
    returns = turn_returns(rows, n_groups * group_size, gamma)[:, 0].view(n_groups, group_size)  # (K, G)
    success = th.zeros(n_groups * group_size)
    for episode, info in zip(rows.episodes, rows.infos, strict=True):
        success[episode] = max(float(success[episode]), float(bool(info.get("is_success"))))
    return uniform_group_mask(returns), success.view(n_groups, group_size).mean(dim=1)  # (K,), (K,)


def replace_groups(rows: Rows, new: Rows, slots: list[int], group_size: int) -> None:
    """Put ``new``'s groups (its episode ``e`` belongs to group ``e // G``) in place of ``rows``' groups ``slots``,
    in place; rows stay ordered by episode, turns in order."""
    gone = set(slots)
    entries = [(e, rows, i) for i, e in enumerate(rows.episodes) if e // group_size not in gone]
    entries += [(slots[e // group_size] * group_size + e % group_size, new, i) for i, e in enumerate(new.episodes)]
    entries.sort(key=lambda entry: entry[0])  # stable: the turns of an episode keep their order
    for name in (f.name for f in fields(Rows)):
        setattr(rows, name, [getattr(source, name)[i] for _, source, i in entries])
    rows.episodes = [episode for episode, _, _ in entries]


class GRPOSampling(RolloutSampling):
    """What GRPO's rollouts sample: see the module docstring. GRPO owns it; the algorithm plays the episodes.

    :param dynamic: run refill rounds (``GRPO(dynamic_sampling=True)``)
    :param max_rounds: the most refill rounds per rollout
    :param pool: the learnability pool the rollout's problems are drawn from, or None (the env's stream)
    :param group_size: G
    :param local_groups: the groups this process plays (K / processes)
    :param gamma: the discount of multi-turn returns
    :param dist: the job's processes (outcomes are all-gathered: every rank decides the same rounds)
    :param reward_ramp: the reward ramp: raise the env's reward-model (consistency) weight with the timesteps
    :param protected_rollouts: the protected rollouts: the first rollouts the frozen reference samples
    """

    def __init__(
        self,
        dynamic: bool,
        max_rounds: int,
        pool: LearnabilityPool | None,
        group_size: int,
        local_groups: int,
        gamma: float,
        dist: Distributed,
        reward_ramp: bool = False,
        protected_rollouts: int = 0,
    ) -> None:
        self.dynamic, self.max_rounds, self.pool = dynamic, max_rounds, pool
        self.group_size, self.local_groups, self.gamma, self.dist = group_size, local_groups, gamma, dist
        self.reward_ramp, self.protected_rollouts = reward_ramp, protected_rollouts
        #: the configured weight the reward ramp rises to (read from the env at the first rollout; run state)
        self.reward_model_target: float | None = None

    def before_rollout(self, env: VecEnv, num_timesteps: int, logger: Logger) -> None:
        """The reward ramp: set the consistency (reward-model) weight of every env to its value at ``num_timesteps``."""
        if not self.reward_ramp:
            return
        if self.reward_model_target is None:
            self.reward_model_target = env.get_attr("reward_fn", indices=[0])[0].weights["consistency"]
        weight = controls.reward_model_weight(self.reward_model_target, num_timesteps)
        env.env_method("set_reward_weights", {"consistency": weight})
        logger.record("train/reward_model_weight", weight)

    def problem_keys(self, n: int, seeds: RolloutSeeds, env: VecEnv) -> list[dict[str, Any]]:
        """The env's stream (``"uniform"``), or the prompt pool's choice plus fresh problems at the current level."""
        if self.pool is None:
            return seeds.problem_keys(n)
        level = float(env.get_attr("difficulty", indices=[0])[0])

        def fresh(m: int) -> list[dict[str, Any]]:
            return [{**key, "difficulty": level} for key in seeds.problem_keys(m)]

        return [key for _, key in self.pool.draw(n, fresh)]

    def from_reference(self, iteration: int, logger: Logger) -> bool:
        """The protected rollouts: the frozen cold-start policy (the reference; with LoRA the base model) samples
        the first ``protected_rollouts`` rollouts."""
        if not self.protected_rollouts:
            return False
        protected = iteration < self.protected_rollouts
        logger.record("rollout/protected", float(protected))
        return protected

    def after_play(self, rows: Rows, play: PlayRefill, logger: Logger) -> float | None:
        """Refill ``rows`` in place (when dynamic), update the pool; the refills' generation seconds, or None when a
        callback stopped training. Logged: ``rollout/resample_rounds``, ``rollout/resampled_groups`` and the pool's
        ``rollout/prompt_priority_mean``, ``rollout/prompt_pool_size``, ``rollout/prompt_fresh_fraction``."""
        if not self.dynamic and self.pool is None:
            return 0.0
        uniform, success = group_outcomes(rows, self.local_groups, self.group_size, self.gamma)  # (K_local,) x 2
        uniform, success = self.dist.gather(uniform.float()) > 0.5, self.dist.gather(success)  # (K,) x 2
        refills = Refills(rates=success.tolist())
        if self.dynamic:
            one_round = functools.partial(self._refill_round, rows, play, refills)
            result = dynamic_sampling(uniform.tolist(), one_round, self.max_rounds)
            if result is None:
                return None
            logger.record("rollout/resample_rounds", result[0])
            logger.record("rollout/resampled_groups", result[1])
        if self.pool is not None:
            fresh = sum(slot < 0 for slot, _ in self.pool.awaiting) / max(len(self.pool.awaiting), 1)
            self.pool.observe_awaiting(refills.rates)
            logger.record("rollout/prompt_priority_mean", float(np.mean(self.pool.priorities())))
            logger.record("rollout/prompt_pool_size", self.pool.size)
            logger.record("rollout/prompt_fresh_fraction", fresh)
        return refills.seconds

    def _refill_round(self, rows: Rows, play: PlayRefill, refills: Refills, slots: list[int]) -> list[bool] | None:
        """One round: the job's groups ``slots`` played anew (this rank's by ``play``), their rows put in place of the
        old groups'; every new group's uniform flag, in ``slots`` order (None: stopped)."""
        first = self.dist.rank * self.local_groups
        mine = [slot - first for slot in slots if 0 <= slot - first < self.local_groups]
        refills.rounds += 1
        played = play(slots, mine, refills.rounds)
        if played is None:
            return None
        new, seconds = played
        refills.seconds += seconds
        flags, rates = group_outcomes(new, len(mine), self.group_size, self.gamma) if mine else ([], [])
        results = dict(zip(mine, zip(list(map(bool, flags)), list(map(float, rates)), strict=True), strict=True))
        merged = {}
        for rank, part in enumerate(self.dist.gather_objects(results)):
            merged.update({k + rank * self.local_groups: value for k, value in part.items()})
        replace_groups(rows, new, mine, self.group_size)
        refills.rates.extend(merged[slot][1] for slot in slots)
        return [merged[slot][0] for slot in slots]
