"""The advantages step of a GRPO iteration: the rollout's rows in, the batch the update trains on out.

:class:`GroupScoring` is a part :class:`~algorithms.grpo.grpo.GRPO` owns, built in its constructor with the settings
that shape the step (``group_size`` first). Each rollout: the episodes' discounted returns, once, grouped by problem
``(K, G)``; their advantages (:mod:`algorithms.grpo.advantages`: group-relative, RLOO or the value baseline; the
competition between groups of :mod:`algorithms.grpo.controls`); the groups the update leaves out (uniform ones, the
diversity guard's) and the truncated rows; the rollout's logs; the kept rows as a
:class:`~algorithms.common.rollout.batch.RolloutBatch` (loss: :mod:`algorithms.grpo.objective`).

Statistics that cross groups (batch-scaled advantages, the competition, the diversity guard, the logs) are computed
on every rank's groups (all-gathered, K of them); each process keeps the rows of its own.
"""

from __future__ import annotations

import torch as th
from stable_baselines3.common.logger import Logger

from algorithms.common.policies import TransformerPolicy
from algorithms.common.rollout.batch import RolloutBatch, rows_to_batch
from algorithms.common.rollout.rows import TEXT_ONLY, Rows, log_rollout, turn_returns
from algorithms.common.runtime.distributed import Distributed
from algorithms.grpo import advantages, controls
from algorithms.grpo.sampling import truncated_rows


class GroupScoring:
    """Rows to batch: returns, advantages relative to each group, the groups left out, the logs.

    :param group_size: G, completions per problem
    :param n_groups: K, problems per rollout (every process's together)
    :param dist: the processes (K / world size groups each)
    :param gamma: the discount of a multi-turn episode's rewards
    :param advantage_scale: ``"group"``, ``"batch"`` or ``"none"``
        (:func:`~algorithms.grpo.advantages.group_advantages`)
    :param advantage_baseline: ``"group"``, ``"leave_one_out"`` or ``"value"``
    :param drop_uniform: leave out groups whose returns are all equal
    :param mask_truncated: leave out completions cut at the length limit without EOS
    :param turn_credit: ``"episode"`` or ``"reward_to_go"`` (:func:`~algorithms.grpo.advantages.turn_advantages`)
    :param competition: ``None``, ``"fixed"`` or ``"adaptive"`` (:func:`~algorithms.grpo.controls.competition`)
    :param competition_coef: the winning group's coefficient
    :param diversity_guard: leave out signal-free groups when the groups' entropies spread
    :param diversity_threshold: the diversity guard's spread
    :param diagnostics: log one reward histogram per group
    """

    def __init__(
        self,
        group_size: int,
        n_groups: int,
        dist: Distributed,
        gamma: float,
        advantage_scale: str,
        advantage_baseline: str,
        drop_uniform: bool,
        mask_truncated: bool,
        turn_credit: str,
        competition: str | None,
        competition_coef: float,
        diversity_guard: bool,
        diversity_threshold: float,
        diagnostics: bool,
    ) -> None:
        self.group_size = group_size
        self.n_groups, self.local_groups = n_groups, n_groups // dist.world_size
        self.dist, self.gamma = dist, gamma
        self.advantage_scale, self.advantage_baseline = advantage_scale, advantage_baseline
        self.drop_uniform, self.mask_truncated, self.turn_credit = drop_uniform, mask_truncated, turn_credit
        self.competition, self.competition_coef = competition, competition_coef
        self.diversity_guard, self.diversity_threshold = diversity_guard, diversity_threshold
        self.diagnostics = diagnostics
        #: the running between-group reward variance (the adaptive competition's reference; run state)
        self.between_variance = 0.0
        #: groups scored so far, every rollout's and every rank's (the batch's group ids; run state)
        self.groups_seen = 0

    def batch(
        self, rows: Rows, generation_seconds: float, policy: TransformerPolicy, logger: Logger, device: th.device
    ) -> tuple[RolloutBatch, bool]:
        """The rows this process trains on, with their advantages and returns; and whether they are a placeholder
        (this process's groups were all left out: one row with no weight keeps the processes in step)."""
        local, group, dist = self.local_groups, self.group_size, self.dist
        to_go = turn_returns(rows, local * group, self.gamma)  # (E, U): once per rollout
        returns = to_go[:, 0].view(local, group)  # (K_local, G) the episodes' returns
        returns = dist.gather(returns)  # (K, G): every rank's groups, in rank order
        mine = slice(dist.rank * local, (dist.rank + 1) * local)
        scores, weights = self.advantages(rows, returns, policy, logger)  # (K, G), (K,)
        uniform = advantages.uniform_group_mask(returns)  # (K,)
        left_out = self.left_out_groups(rows, returns, uniform, logger)[mine].tolist()
        cut = truncated_rows(rows, [policy.eos_token_id]) if self.mask_truncated else [False] * len(rows.infos)
        keep = [i for i, e in enumerate(rows.episodes) if not left_out[e // group] and not cut[i]]
        placeholder = not keep
        keep = keep or [0]
        log_rollout(logger, dist, returns, [rows.masks[i] for i in keep], rows.infos, generation_seconds)
        logger.record("rollout/frac_uniform_groups", uniform.float().mean().item())
        if self.mask_truncated:
            logger.record("rollout/truncated_fraction", dist.sum(sum(cut)) / dist.sum(len(cut)))
        if self.diagnostics:  # one reward histogram per group
            for k, group_returns in enumerate(returns.cpu().numpy()):
                logger.record(f"groups/rewards_{k}", group_returns, exclude=TEXT_ONLY)
        first_group = self.groups_seen + dist.rank * local  # group ids across rollouts and ranks
        self.groups_seen += self.n_groups
        groups = first_group + th.arange(local * group) // group  # (K_local*G,)
        episode_scores, episode_targets = scores[mine].flatten(), returns[mine].flatten()  # (E,) each
        per_turn = {}
        if self.turn_credit == "reward_to_go":  # each turn's own return (the formula: advantages.turn_advantages)
            per_turn = self.turn_credit_of(rows, to_go, episode_scores, weights[mine].repeat_interleave(group))
        batch = rows_to_batch(
            rows, keep, episode_scores, episode_targets, groups, policy.pad_token_id, device, **per_turn
        )
        return batch, placeholder

    def advantages(
        self, rows: Rows, returns: th.Tensor, policy: TransformerPolicy, logger: Logger
    ) -> tuple[th.Tensor, th.Tensor]:
        """``(K, G)`` advantages of the ``(K, G)`` returns: relative to the group (or the value baseline, or RLOO's
        leave-one-out mean), then the competition between groups (fixed or adaptive); and ``(K,)`` each group's
        weight of a return difference (:func:`~algorithms.grpo.advantages.turn_weights` times the competition's
        coefficient), which per-turn credit uses (:func:`~algorithms.grpo.advantages.turn_advantages`)."""
        baseline = None
        if self.advantage_baseline == "value":  # the value head's estimate of each group's prompt
            baseline = self.dist.gather(advantages.value_baseline(policy, rows, self.group_size))  # (K, G)
            logger.record("train/value_baseline", baseline.mean().item())
        loo = self.advantage_baseline == "leave_one_out"  # RLOO
        scores = advantages.relative_advantages(returns, self.advantage_scale, baseline, loo)  # (K, G)
        weights = advantages.turn_weights(returns, self.advantage_scale, relative=baseline is None and not loo)  # (K,)
        if self.competition is None:
            return scores, weights
        result = controls.competition(returns, self.competition, self.competition_coef, self.between_variance)
        self.between_variance = result.between_variance
        logger.record("train/competition_coef", result.coef)
        logger.record("train/winning_groups", int((result.scale != 1).sum()))
        return scores * result.scale[:, None], weights * result.scale  # (K, G), (K,)

    def left_out_groups(self, rows: Rows, returns: th.Tensor, uniform: th.Tensor, logger: Logger) -> th.Tensor:
        """``(K,)`` the groups the update leaves out: uniform ones (``drop_uniform``) and the diversity guard's."""
        dropped = None
        if self.diversity_guard:
            entropies = controls.first_turn_entropies(rows, self.group_size, self.local_groups)  # (K_local,)
            entropies = self.dist.gather(entropies)  # (K,)
            dropped, spread = controls.diversity_left_out(entropies, returns, self.diversity_threshold)
            logger.record("diversity/entropy_spread", spread)
            logger.record("diversity/triggered", float(spread > self.diversity_threshold))
            logger.record("diversity/dropped_groups", int(dropped.sum()))
        return advantages.left_out_groups(uniform, self.drop_uniform, dropped)

    @staticmethod
    def turn_credit_of(
        rows: Rows, to_go: th.Tensor, episode_scores: th.Tensor, weights: th.Tensor
    ) -> dict[str, th.Tensor]:
        """Each row's advantage and return under ``turn_credit="reward_to_go"``
        (:func:`~algorithms.grpo.advantages.turn_advantages`; ``to_go``: ``(E, U)`` the turns' returns,
        ``weights``: ``(E,)`` each episode's group weight)."""
        row_episodes = th.as_tensor(rows.episodes, dtype=th.long)
        row_returns = to_go[row_episodes, th.as_tensor(rows.turns, dtype=th.long)]  # (N,)
        first = to_go[:, 0]  # (E,) the episodes' returns
        row_scores = advantages.turn_advantages(episode_scores, first, row_returns, row_episodes, weights)  # (N,)
        return {"row_advantages": row_scores, "row_returns": row_returns}
