"""What GRPO's rollout samples: DAPO's dynamic sampling that refills, learnability-prioritised prompts, and the
completions ``mask_truncated`` leaves out.

Where it sits in the data flow: :class:`RolloutSampling` is a mixin of :class:`~algorithms.grpo.grpo.GRPO`. It
chooses the problems of every rollout (:meth:`~RolloutSampling._problem_keys`: the env's stream, or a
:class:`~algorithms.common.replay.prompt_pool.LearnabilityPool`), and after the rollout's episodes are played
(:meth:`~RolloutSampling._extend_rollout`) samples new problems for the groups whose rewards are all equal, until
none is (or ``max_resample_rounds`` rounds are spent), replacing those groups' rows before the advantages are
computed. The decision is the pure function :func:`refill_slots`, the loop :func:`dynamic_sampling`.

Several processes: every rank sees every group's outcome (all-gathered), so every rank decides the same rounds and
the same slots; each rank plays the new groups that fall in its own share of the K, with the sampling noise of
their place among all the new groups (so the result does not depend on the number of processes either).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

import numpy as np
import torch as th

from algorithms.common.replay.prompt_pool import LearnabilityPool
from algorithms.common.rollout.rows import Rows, episode_returns
from algorithms.grpo import objective


def refill_slots(uniform: Sequence[bool], rounds_done: int, max_rounds: int) -> list[int]:
    """The groups to sample again in the next round: every uniform one while rounds remain, else none."""
    if rounds_done >= max_rounds:
        return []
    return [k for k, flag in enumerate(uniform) if flag]


def dynamic_sampling(
    uniform: Sequence[bool], play: Callable[[list[int]], Sequence[bool]], max_rounds: int
) -> tuple[int, int]:
    """DAPO's dynamic sampling (Yu et al. 2025, §3.2), refilling: while some group's rewards are all equal and
    fewer than ``max_rounds`` rounds were played, ``play(slots)`` samples a new problem for each of those groups and
    says which new groups are uniform. Returns ``(rounds played, groups resampled)``; at most ``max_rounds`` rounds
    and ``max_rounds * K`` groups."""
    uniform = [bool(flag) for flag in uniform]
    rounds = resampled = 0
    while slots := refill_slots(uniform, rounds, max_rounds):
        for slot, flag in zip(slots, play(slots), strict=True):
            uniform[slot] = bool(flag)
        rounds, resampled = rounds + 1, resampled + len(slots)
    return rounds, resampled


def truncated_rows(rows: Rows, eos_ids: Sequence[int]) -> list[bool]:
    """Which rows are completions cut at ``max_new_tokens`` without EOS: the env's ``info["completion_clipped"]``,
    or, when the env gives none, no EOS among the completion's valid tokens."""
    eos = th.as_tensor(list(eos_ids))
    cut = []
    for tokens, mask, info in zip(rows.tokens, rows.masks, rows.infos, strict=True):
        clipped = info.get("completion_clipped")
        cut.append(bool(clipped) if clipped is not None else not bool(th.isin(tokens[mask.bool()].cpu(), eos).any()))
    return cut


def group_outcomes(rows: Rows, n_groups: int, group_size: int, gamma: float) -> tuple[th.Tensor, th.Tensor]:
    """``(n_groups,)`` whether each group's returns are all equal, and ``(n_groups,)`` its success rate (an episode
    succeeds when one of its turns did)."""
    returns = episode_returns(rows, n_groups * group_size, gamma).view(n_groups, group_size)  # (K, G)
    success = th.zeros(n_groups * group_size)
    for episode, info in zip(rows.episodes, rows.infos, strict=True):
        success[episode] = max(float(success[episode]), float(bool(info.get("is_success"))))
    return objective.uniform_group_mask(returns), success.view(n_groups, group_size).mean(dim=1)  # (K,), (K,)


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


class _Stopped(Exception):
    """A callback stopped training during a refill round."""


class RolloutSampling:
    """GRPO's problem choice and dynamic sampling (see the module docstring); mixed into GRPO."""

    def _setup_prompt_pool(self) -> None:
        self._prompt_pool = None
        self._drawn: list[tuple[int, dict[str, Any]]] = []  # the pool's (slot, key) of each problem drawn
        if self.prompt_sampling == "learnability":
            self._prompt_pool = LearnabilityPool(
                self.prompt_pool_size, self.fresh_prompt_fraction, seed=self._sampling_seed
            )

    @property
    def _prompt_pool_state(self) -> dict[str, Any] | None:
        """The prompt pool as plain data (saved with the run state)."""
        return None if self._prompt_pool is None else self._prompt_pool.get_state()

    @_prompt_pool_state.setter
    def _prompt_pool_state(self, value: dict[str, Any] | None) -> None:
        if value is not None and self._prompt_pool is not None:
            self._prompt_pool.set_state(value)

    def _problem_keys(self, n: int) -> list[dict[str, Any]]:
        """The env's stream (``"uniform"``), or the pool's choice plus fresh problems at the current level."""
        if self._prompt_pool is None:
            return super()._problem_keys(n)
        level = float(self.env.get_attr("difficulty", indices=[0])[0])

        def fresh(m: int) -> list[dict[str, Any]]:
            return [{**key, "difficulty": level} for key in super(RolloutSampling, self)._problem_keys(m)]

        entries = self._prompt_pool.draw(n, fresh)
        self._drawn.extend(entries)
        return [key for _, key in entries]

    def _extend_rollout(self, env, callback, rows: Rows, finished: list, episode_problems: list) -> float | None:
        """Dynamic sampling (``dynamic_sampling``) and the prompt pool's update (``prompt_sampling``)."""
        if not self.dynamic_sampling and self._prompt_pool is None:
            return 0.0
        uniform, success = group_outcomes(rows, self._local_groups, self.group_size, self.gamma)  # (K_local,) x 2
        uniform, success = self._dist.gather(uniform.float()) > 0.5, self._dist.gather(success)  # (K,) x 2
        self._refill_round = 0
        drawn, self._drawn = self._drawn, []
        outcomes = list(zip(drawn, success.tolist(), strict=False))  # the pool's entries (none without a pool)
        seconds, generator_state = 0.0, self._generator.get_state()
        if self.dynamic_sampling:

            def play(slots: list[int]) -> list[bool]:
                nonlocal seconds
                flags, rates, spent = self._refill(env, callback, rows, finished, episode_problems, slots)
                outcomes.extend(zip(self._drawn, rates, strict=False))
                self._drawn, seconds = [], seconds + spent
                return flags

            try:
                rounds, resampled = dynamic_sampling(uniform.tolist(), play, self.max_resample_rounds)
            except _Stopped:
                return None
            self._generator.set_state(generator_state)  # the update's shuffling as without refills
            self.logger.record("rollout/resampled_groups", resampled)
            self.logger.record("rollout/resample_rounds", rounds)
        if self._prompt_pool is not None:
            self._prompt_pool.observe(outcomes)
            fresh = sum(slot < 0 for (slot, _), _ in outcomes) / max(len(outcomes), 1)
            self.logger.record("rollout/prompt_priority_mean", float(np.mean(self._prompt_pool.priorities())))
            self.logger.record("rollout/prompt_pool_size", self._prompt_pool.size)
            self.logger.record("rollout/prompt_fresh_fraction", fresh)
        return seconds

    def _refill(self, env, callback, rows, finished, episode_problems, slots: list[int]):
        """One round: new problems for the job's groups ``slots``, this rank's played and put in place of its old
        groups. Returns every new group's uniform flag and success rate (in ``slots`` order) and the seconds spent."""
        group, first = self.group_size, self._dist.rank * self._local_groups
        problems = self._draw_problems(env, slots)  # this rank's, in slots order
        mine = [slot - first for slot in slots if 0 <= slot - first < self._local_groups]
        self._refill_round += 1
        round_seed = np.random.SeedSequence([self._sampling_seed, self._iteration, self._refill_round])
        self._generator.manual_seed(int(round_seed.generate_state(1, dtype=np.uint64)[0] >> 1))
        new, seconds, before = Rows(), 0.0, self.num_timesteps
        if mine:
            offset = next(i for i, slot in enumerate(slots) if slot - first in mine) * group
            episodes = [p for p in problems for _ in range(group)]
            played = self._play(env, callback, episodes, new, finished, False, offset, len(slots) * group)
            if played is None:
                raise _Stopped
            seconds = played
            for k, problem in zip(mine, problems, strict=True):
                episode_problems[k * group : (k + 1) * group] = [problem] * group
        self.num_timesteps = before + int(self._dist.sum(self.num_timesteps - before))  # every rank's completions
        flags, rates = group_outcomes(new, len(mine), group, self.gamma) if mine else ([], [])
        results = dict(zip(mine, zip(list(map(bool, flags)), list(map(float, rates)), strict=True), strict=True))
        merged = {}
        for rank, part in enumerate(self._dist.gather_objects(results)):
            merged.update({k + rank * self._local_groups: value for k, value in part.items()})
        replace_groups(rows, new, mine, group)
        return [merged[slot][0] for slot in slots], [merged[slot][1] for slot in slots], seconds
