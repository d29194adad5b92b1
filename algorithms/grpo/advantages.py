"""The advantages step of a GRPO iteration, rows in, the batch the update trains on out, and every formula of it.

:class:`GroupScoring` is a part :class:`~algorithms.grpo.grpo.GRPO` owns, built in its constructor with the settings
that shape the step (``group_size`` first). Each rollout: the episodes' discounted returns, once, grouped by problem
``(K, G)``; their advantages: group-relative or leave-one-out (the shared formulas of
:mod:`algorithms.common.advantages`) or against the value baseline (:func:`value_baseline`), the choice among them
(:func:`relative_advantages`), then the competition between groups of :mod:`algorithms.grpo.controls`; the groups with
no signal and those the update leaves out
(:func:`left_out_groups`: uniform ones, the diversity guard's), the truncated rows (:func:`truncated_rows`); the
rollout's logs; the kept rows as a :class:`~algorithms.common.rollout.batch.RolloutBatch` (loss:
:func:`algorithms.grpo.update.grpo_loss`). The formulas are pure functions over tensors, but for
:func:`value_baseline` (the value head's estimate).

Statistics that cross groups (batch-scaled advantages, the competition, the diversity guard, the logs) are computed
on every rank's groups (all-gathered, K of them); each process keeps the rows of its own.

Sources: GRPO, Shao et al. 2024 (DeepSeekMath, arXiv 2402.03300), §4.1.2; Dr. GRPO, Liu et al. 2025 (arXiv
2503.20783), no std scaling; RLOO, Ahmadian et al. 2024 (arXiv 2402.14740).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch as th
from stable_baselines3.common.logger import Logger
from torch import Tensor

from algorithms.common.advantages import (
    check_rewards,
    group_advantages,
    leave_one_out_advantages,
    uniform_group_mask,
)
from algorithms.common.policies import TransformerPolicy
from algorithms.common.rollout.batch import RolloutBatch, left_pad, rows_to_batch
from algorithms.common.rollout.rows import TEXT_ONLY, Rows, log_rollout, turn_returns
from algorithms.common.runtime.distributed import Distributed
from algorithms.grpo import controls


def relative_advantages(
    returns: Tensor, scale: str = "group", baseline: Tensor | None = None, leave_one_out: bool = False
) -> Tensor:
    """``(K, G)`` advantages: ``returns - baseline`` (the value baseline, ``(K, G)``) when a baseline is given,
    RLOO's when ``leave_one_out`` (:func:`leave_one_out_advantages`, not scaled), else
    GRPO's group-relative ones (:func:`group_advantages`, scaled by ``scale``)."""
    if leave_one_out:
        return leave_one_out_advantages(returns)  # (K, G)
    if baseline is not None:
        return returns - baseline  # (K, G)
    return group_advantages(returns, scale=scale)  # (K, G)


TURN_CREDITS = ("episode", "reward_to_go")
"""The values of GRPO's ``turn_credit``: what each model turn of a multi-turn episode trains on."""


def turn_weights(returns: Tensor, scale: str = "group", relative: bool = True, eps: float = 1e-4) -> Tensor:
    """``(K,)`` the weight ``w_g`` of a return difference in each group's advantages (per-turn credit,
    :func:`turn_advantages`): ``1 / (std_g + eps)`` for GRPO's ``scale="group"`` (0 for a group whose returns are all
    equal, whose advantages are 0: no signal, and no division by a vanishing std), ``1 / (std + eps)`` of the
    rollout for ``"batch"`` (0 when every return is equal), 1 for ``"none"`` and when not ``relative`` (RLOO, the
    value baseline: not divided); 0 for groups of one under a relative scale (their advantages are 0)."""
    check_rewards(returns)
    k, g = returns.shape
    returns = returns if returns.is_floating_point() else returns.to(th.get_default_dtype())
    if not relative or scale == "none":
        return returns.new_ones(k)
    if g < 2:
        return returns.new_zeros(k)
    wide = returns.double()  # a float32 std of returns near its range overflows (as in group_advantages)
    if scale == "group":
        return th.where(uniform_group_mask(returns), 0.0, 1.0 / (wide.std(dim=1) + eps)).to(returns.dtype)  # (K,)
    if bool(returns.amax() == returns.amin()):
        return returns.new_zeros(k)
    return (1.0 / (wide.std() + eps)).to(returns.dtype).expand(k).clone()  # (K,)


def turn_advantages(
    episode_advantages: Tensor, episode_returns: Tensor, row_returns: Tensor, row_episodes: Tensor, weights: Tensor
) -> Tensor:
    """``(N,)`` per-turn advantages (``turn_credit="reward_to_go"``): row ``n`` (turn ``t`` of episode ``i``) gets
    ``A_{i,t} = A_i + w_i (G_{i,t} - G_{i,0})``, i.e. with GRPO's group-relative ``A_i = (G_{i,0} - mean_g) / s_g``::

        A_{i,t} = (G_{i,t} - mean_{j in g} G_{j,0}) / s_g

    ``G_{i,t}`` the discounted reward-to-go from turn ``t`` (:func:`~algorithms.common.rollout.rows.turn_returns`),
    ``mean_g`` and ``s_g`` the baseline and scale of the episode's group computed on the episode returns
    ``G_{j,0}`` exactly as for ``turn_credit="episode"`` (RLOO: the others' mean, no scale; the value baseline: the
    value head's estimate), and ``w_i`` the weight of the episode's group (:func:`turn_weights`: ``1 / s_g``, 0 for
    a group without signal) times the competition's coefficient. The episode-level baseline is one number per
    group, not a mean over the episodes that reached turn ``t`` (whose presence there depends on their own earlier
    turns); with only a final reward and ``gamma = 1`` every ``G_{i,t}`` equals ``G_{i,0}`` and this is the episode
    credit exactly.

    :param episode_advantages: ``(E,)`` the episodes' advantages ``A_i``
    :param episode_returns: ``(E,)`` the returns ``G_{i,0}`` (from the same computation as ``row_returns``)
    :param row_returns: ``(N,)`` each row's ``G_{i,t}``
    :param row_episodes: ``(N,)`` each row's episode
    :param weights: ``(E,)`` each episode's ``w_i``
    """
    offset = row_returns - episode_returns[row_episodes]  # (N,)
    return episode_advantages[row_episodes] + weights[row_episodes] * offset  # (N,)


def value_baseline(policy: TransformerPolicy, rows: Rows, group_size: int) -> Tensor:
    """The value baseline: ``(K_local, G)`` the value head's estimate of each episode's first prompt (a group
    shares its prompt)."""
    first = rows.first_turns()
    ids, mask = left_pad([rows.contexts[i] for i in first], policy.pad_token_id)
    with th.no_grad():
        values = policy.predict_values(ids.to(policy.device), mask.to(policy.device)).cpu()  # (E,)
    episodes = th.as_tensor([rows.episodes[i] for i in first])
    return th.zeros(len(episodes)).index_copy_(0, episodes, values).view(-1, group_size)  # (K_local, G)


def left_out_groups(uniform: Tensor, drop_uniform: bool, diversity: Tensor | None = None) -> Tensor:
    """``(K,)`` groups the update leaves out: the uniform ones when ``drop_uniform`` (DAPO's fix), and those the
    diversity guard names; when that would be every group, none (a zero-advantage update, not no update)."""
    dropped = uniform if drop_uniform else th.zeros_like(uniform)  # (K,)
    if diversity is not None:
        dropped = dropped | diversity
    if bool(dropped.all()):
        dropped = th.zeros_like(dropped)
    return dropped


def truncated_rows(rows: Rows, eos_ids: Sequence[int]) -> list[bool]:
    """Which rows are completions cut at ``max_new_tokens`` without EOS: the env's ``info["completion_clipped"]``,
    or, when the env gives none, no EOS among the completion's valid tokens."""
    eos = th.as_tensor(list(eos_ids))
    cut = []
    for tokens, mask, info in zip(rows.tokens, rows.masks, rows.infos, strict=True):
        clipped = info.get("completion_clipped")
        cut.append(bool(clipped) if clipped is not None else not bool(th.isin(tokens[mask.bool()].cpu(), eos).any()))
    return cut


class GroupScoring:
    """Rows to batch: returns, advantages relative to each group, the groups left out, the logs.

    :param group_size: G, completions per problem
    :param n_groups: K, problems per rollout (every process's together)
    :param dist: the processes (K / world size groups each)
    :param gamma: the discount of a multi-turn episode's rewards
    :param advantage_scale: ``"group"``, ``"batch"`` or ``"none"``
        (:func:`group_advantages`)
    :param advantage_baseline: ``"group"``, ``"leave_one_out"`` or ``"value"``
    :param drop_uniform: leave out groups whose returns are all equal
    :param mask_truncated: leave out completions cut at the length limit without EOS
    :param turn_credit: ``"episode"`` or ``"reward_to_go"`` (:func:`turn_advantages`)
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
        uniform = uniform_group_mask(returns)  # (K,)
        left_out = self._left_out(rows, returns, uniform, logger)[mine].tolist()
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
        if self.turn_credit == "reward_to_go":  # each turn's own return (the formula: turn_advantages)
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
        weight of a return difference (:func:`turn_weights` times the competition's
        coefficient), which per-turn credit uses (:func:`turn_advantages`)."""
        baseline = None
        if self.advantage_baseline == "value":  # the value head's estimate of each group's prompt
            baseline = self.dist.gather(value_baseline(policy, rows, self.group_size))  # (K, G)
            logger.record("train/value_baseline", baseline.mean().item())
        loo = self.advantage_baseline == "leave_one_out"  # RLOO
        scores = relative_advantages(returns, self.advantage_scale, baseline, loo)  # (K, G)
        weights = turn_weights(returns, self.advantage_scale, relative=baseline is None and not loo)  # (K,)
        if self.competition is None:
            return scores, weights
        result = controls.competition(returns, self.competition, self.competition_coef, self.between_variance)
        self.between_variance = result.between_variance
        logger.record("train/competition_coef", result.coef)
        logger.record("train/winning_groups", int((result.scale != 1).sum()))
        return scores * result.scale[:, None], weights * result.scale  # (K, G), (K,)

    def _left_out(self, rows: Rows, returns: th.Tensor, uniform: th.Tensor, logger: Logger) -> th.Tensor:
        """``(K,)`` the groups the update leaves out: uniform ones (``drop_uniform``) and the diversity guard's."""
        dropped = None
        if self.diversity_guard:
            entropies = controls.first_turn_entropies(rows, self.group_size, self.local_groups)  # (K_local,)
            entropies = self.dist.gather(entropies)  # (K,)
            dropped, spread = controls.diversity_left_out(entropies, returns, self.diversity_threshold)
            logger.record("diversity/entropy_spread", spread)
            logger.record("diversity/triggered", float(spread > self.diversity_threshold))
            logger.record("diversity/dropped_groups", int(dropped.sum()))
        return left_out_groups(uniform, self.drop_uniform, dropped)

    @staticmethod
    def turn_credit_of(
        rows: Rows, to_go: th.Tensor, episode_scores: th.Tensor, weights: th.Tensor
    ) -> dict[str, th.Tensor]:
        """Each row's advantage and return under ``turn_credit="reward_to_go"``
        (:func:`turn_advantages`; ``to_go``: ``(E, U)`` the turns' returns,
        ``weights``: ``(E,)`` each episode's group weight)."""
        row_episodes = th.as_tensor(rows.episodes, dtype=th.long)
        row_returns = to_go[row_episodes, th.as_tensor(rows.turns, dtype=th.long)]  # (N,)
        first = to_go[:, 0]  # (E,) the episodes' returns
        row_scores = turn_advantages(episode_scores, first, row_returns, row_episodes, weights)  # (N,)
        return {"row_advantages": row_scores, "row_returns": row_returns}
