"""The original design's training controls as pure functions: competition between groups (fixed or adaptive), the
diversity guard, the reward-model weight ramp and the diagnostics ("group stability", gradient-norm spread).

Each function reads like its rule; :class:`~algorithms.grpo.grpo.GRPO` switches them on and logs them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from algorithms.common.rollout.rows import Rows

#: the competition coefficient: the winning group's advantages are scaled by this, the others by 1
COMPETITION_COEF = 1.2
#: the adaptive competition coefficient's range
ADAPTIVE_RANGE = (0.8, 1.5)
#: the diversity guard: the per-group entropy spread above which the diversity guard acts
DIVERSITY_SPREAD = 0.15
#: the diagnostics' warning thresholds: spread of per-group gradient norms (relative), policy entropy (nats/token)
GRAD_SPREAD_WARNING, ENTROPY_WARNING = 0.3, 0.5


def winning_groups(group_rewards: Tensor) -> Tensor:
    """``(K,)`` bool: the group(s) with the highest mean reward, when that mean beats another group's.

    "Winning" (left undefined by the seed): the group whose completions scored best on average this
    rollout. When every group has the same mean there is no winner (no group is favoured by a tie).

    :param group_rewards: ``(K, G)`` rewards (returns) of each group's completions
    """
    means = group_rewards.double().mean(dim=1)  # (K,) float64: a float32 sum of rewards near its range overflows
    best = means.max()
    if bool((means == best).all()):
        return torch.zeros_like(means, dtype=torch.bool)
    return means == best


def competition_scale(group_rewards: Tensor, coef: float = COMPETITION_COEF) -> Tensor:
    """The competition coefficient: ``(K,)`` advantage multipliers, ``coef`` for the winning group(s), 1 for the
    others."""
    return torch.where(winning_groups(group_rewards), coef, 1.0)


def adaptive_competition_coef(
    between_variance: float, reference_variance: float, base: float = COMPETITION_COEF, bounds=ADAPTIVE_RANGE
) -> float:
    """The adaptive competition coefficient: ``clip(base * variance / reference, low, high)``.

    The rule (the seed gives only the range): the coefficient follows the between-group variance of the mean
    rewards relative to its running average (``reference_variance``): as strong as the fixed 1.2 when the groups
    differ as much as usual, up to 1.5 when they differ more (a clear winner is worth following), down to 0.8
    when they differ less (the "winner" is noise). With no reference yet (0), it is ``base``.
    """
    low, high = bounds
    if reference_variance <= 0:
        return base
    return float(min(high, max(low, base * between_variance / reference_variance)))


def group_entropies(log_probs: Tensor, mask: Tensor, groups: Tensor, n_groups: int) -> Tensor:
    """``(K,)`` mean policy entropy of each group, estimated per token by ``-log p(sampled token)``.

    :param log_probs: ``(N, C)`` sampling log-probs; ``mask`` ``(N, C)``; ``groups`` ``(N,)`` in ``[0, K)``
    """
    per_row_sum = -(log_probs * mask).sum(dim=1)  # (N,)
    tokens = mask.sum(dim=1).float()  # (N,)
    total = torch.zeros(n_groups).index_add_(0, groups.cpu(), per_row_sum.cpu().float())
    count = torch.zeros(n_groups).index_add_(0, groups.cpu(), tokens.cpu())
    return total / count.clamp(min=1)


def first_turn_entropies(rows: Rows, group_size: int, n_groups: int) -> Tensor:
    """The diversity guard: ``(K_local,)`` each group's mean policy entropy (:func:`group_entropies`), estimated
    from its episodes' first turns' sampled tokens."""
    first = rows.first_turns()
    log_probs, masks = torch.stack([rows.log_probs[i] for i in first]), torch.stack([rows.masks[i] for i in first])
    groups = torch.as_tensor([rows.episodes[i] // group_size for i in first])
    return group_entropies(log_probs, masks, groups, n_groups)


def diversity_spread(entropies: Tensor) -> float:
    """The spread of per-group entropies, ``max - min`` (the diversity guard acts when it exceeds 0.15)."""
    return float(entropies.max() - entropies.min())


def signal_free_groups(group_rewards: Tensor) -> Tensor:
    """``(K,)`` bool: groups whose rewards are all equal, so their advantages are 0 and they teach nothing."""
    return (group_rewards == group_rewards[:, :1]).all(dim=1)


def reward_model_weight(target: float, timesteps: int, step: float = 0.05, every: int = 1000) -> float:
    """The reward ramp: the reward-model (semantic) weight rises by ``step`` every ``every`` timesteps up to
    ``target``."""
    return float(min(target, step * (timesteps // every)))


def gradient_spread(norms: Tensor) -> float:
    """Relative spread of per-group gradient norms: ``std / mean`` (the diagnostics warn above 0.3)."""
    mean = norms.mean()
    return float(norms.std(unbiased=False) / mean) if mean > 0 else 0.0


def group_stability(gradients: Tensor) -> float:
    """ "Group stability" (undefined by the seed): how much the K groups' gradients agree, in [0, 1].

    The mean pairwise cosine similarity of the per-group gradient vectors, mapped from [-1, 1] to [0, 1]:
    1 when every group pushes the weights the same way, 0.5 when their directions are unrelated, 0 when they
    oppose each other. Groups with a zero gradient (no signal) are left out; fewer than two: 1.

    :param gradients: ``(K, P)`` flattened per-group gradients
    """
    norms = gradients.norm(dim=1)
    live = gradients[norms > 0]
    if len(live) < 2:
        return 1.0
    unit = live / live.norm(dim=1, keepdim=True)
    cosine = unit @ unit.T  # (k, k)
    k = len(live)
    mean_off_diagonal = (cosine.sum() - cosine.diagonal().sum()) / (k * (k - 1))
    return float((1 + mean_off_diagonal) / 2)


# ---------------------------------------------------------------------------------------------- as GRPO applies them
@dataclass(frozen=True)
class Competition:
    """What the competition between groups (fixed or adaptive) did to one rollout's advantages."""

    scale: Tensor  # (K,) the multiplier of each group's advantages
    coef: float  # the winning groups' multiplier
    between_variance: float  # the running between-group variance after this rollout (the adaptive form's reference)


def competition(returns: Tensor, mode: str, coef: float, between_variance: float) -> Competition:
    """The competition coefficient (``mode="fixed"``: the winning group's advantages x ``coef``) or its adaptive
    form (``"adaptive"``: the coefficient
    follows this rollout's between-group reward variance relative to its running mean ``between_variance``).

    :param returns: ``(K, G)`` the rollout's returns
    :param mode: ``"fixed"`` or ``"adaptive"``
    :param coef: the competition coefficient (the adaptive one's base)
    :param between_variance: the running mean so far (0: none yet)
    """
    if mode == "adaptive":
        between = float(returns.double().mean(1).var(unbiased=False))  # float64: huge rewards' variance stays finite
        coef = adaptive_competition_coef(between, between_variance, base=coef)
        between_variance = 0.9 * between_variance + 0.1 * between if between_variance else between
    return Competition(competition_scale(returns, coef), coef, between_variance)  # scale: (K,)


def diversity_left_out(entropies: Tensor, returns: Tensor, threshold: float) -> tuple[Tensor, float]:
    """The diversity guard: ``(K,)`` groups to leave out (the signal-free ones, when the spread of the per-group
    entropies ``(K,)`` exceeds ``threshold``), and that spread."""
    spread = diversity_spread(entropies)
    if spread > threshold:
        return signal_free_groups(returns), spread
    return torch.zeros(returns.shape[0], dtype=torch.bool), spread
