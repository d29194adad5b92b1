"""Loss terms any policy-gradient method for language models uses, as pure tensor functions.

Tensors in, tensors out, no state, no I/O. Shapes: ``B`` sequences of ``T`` completion tokens, ``V`` the
vocabulary. Masks are ``True`` on valid completion tokens and ``False`` on padding and after EOS; masked
positions never contribute to a value or a gradient, even when they hold NaN or inf. GRPO's own pieces
(group advantages, the assembled loss) are in :mod:`algorithms.grpo.objective`; the PPO-style surrogate, the
k3 KL, the sampler correction's weights, the discounted returns and the aggregation modes are here so that every
algorithm shares one definition (a token's log-prob and entropy: :mod:`algorithms.common.generation.sampler`).

Sources: PPO, Schulman et al. 2017; GRPO, Shao et al. 2024 (DeepSeekMath, arXiv 2402.03300), Eq. 3–4; DAPO,
Yu et al. 2025 (arXiv 2503.14476), clip-higher and the token-level loss; Dr. GRPO, Liu et al. 2025 (arXiv
2503.20783), the constant normaliser; the k3 KL estimator, http://joschu.net/blog/kl-approx.html.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from grpo_gym.validation import check_choice

AGGREGATION_MODES = ("sequence", "token", "constant")
IMPORTANCE_LEVELS = ("token", "sequence")


def check_shape(name: str, tensor: Tensor, shape: torch.Size) -> None:
    if tensor.shape != shape:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}.")


def returns_to_go(rewards: Tensor, gamma: float, mask: Tensor) -> Tensor:
    """Each turn's discounted return to the end of its episode, ``G_t = sum_{u >= t} gamma^(u - t) r_u`` over the
    turns that happened; column 0 is the episode's return ``sum_t gamma^t r_t`` (turn 0 undiscounted).

    The one discounted-return formula: GRPO scores an episode by ``G_0`` (per-turn credit: each turn by its own
    ``G_t``), the PPO baseline each turn by its ``G_t`` (the original design's gamma: 0.95 for dialogues, 0.99 for
    generation).

    :param rewards: per-turn rewards, shape ``(E, U)``
    :param gamma: discount factor in ``[0, 1]``
    :param mask: ``True`` on the turns that happened, shape ``(E, U)``
    :return: shape ``(E, U)``, 0 on turns that did not happen
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}.")
    check_shape("mask", mask, rewards.shape)
    played = mask.bool()
    rewards = torch.where(played, rewards, 0.0)  # (E, U)
    result = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])  # (E,)
    for turn in reversed(range(rewards.shape[1])):  # one step per turn (a handful), vectorised over the episodes
        running = rewards[:, turn] + gamma * running
        result[:, turn] = running
    return torch.where(played, result, 0.0)


def clipped_surrogate(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, clip_low: float, clip_high: float | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token PPO/GRPO surrogate ``-min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)``.

    DeepSeekMath Eq. 3 with DAPO's clip-higher: ``clip_high`` defaults to ``clip_low`` (symmetric PPO
    clipping); DAPO uses 0.2 / 0.28.

    :param logp: log-probs of the taken tokens under the current policy, shape ``(B, T)``
    :param old_logp: the same under the sampling policy (no gradient), shape ``(B, T)``
    :param advantages: one per sequence ``(B,)``, broadcast over its tokens, or per token ``(B, T)``
    :param clip_low: epsilon of the lower bound ``1 - clip_low``
    :param clip_high: epsilon of the upper bound ``1 + clip_high``; ``None`` means ``clip_low``
    :return: per-token loss ``(B, T)``, ratio ``(B, T)``, and a ``(B, T)`` mask of the tokens where the
        clipped term is the smaller one and differs from the unclipped one (no gradient flows there)
    """
    clip_high = clip_low if clip_high is None else clip_high
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low} and {clip_high}.")
    check_shape("old_logp", old_logp, logp.shape)
    if advantages.shape[0] != logp.shape[0] or advantages.dim() not in (1, 2):
        raise ValueError(f"advantages must be (B,) or (B, T), B={len(logp)}; got {tuple(advantages.shape)}.")
    advantages = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    ratio = torch.exp(logp - old_logp)  # (B, T)
    unclipped = ratio * advantages  # (B, T)
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages  # (B, T)
    per_token_loss = -torch.min(unclipped, clipped)  # (B, T)
    return per_token_loss, ratio, clipped < unclipped


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO's length-normalised sequence log-ratio ``log s_i = (1 / |y_i|) sum_t (logp_t - old_logp_t)``.

    Zheng et al. 2025 (GSPO, arXiv 2507.18071), Eq. 7: ``s_i = (pi(y_i | x) / pi_old(y_i | x)) ** (1 / |y_i|)``,
    the geometric mean of the token ratios. A sequence with no valid token has ``log s_i = 0``.

    :param logp: log-probs of the taken tokens under the current policy, shape ``(B, T)``
    :param old_logp: the same under the sampling policy, shape ``(B, T)``
    :param mask: ``True`` on valid completion tokens, shape ``(B, T)``
    :return: ``log s_i``, shape ``(B,)``
    """
    check_shape("old_logp", old_logp, logp.shape)
    check_shape("mask", mask, logp.shape)
    mask = mask.bool()
    log_ratio = torch.where(mask, logp - old_logp, 0.0)  # (B, T)
    return log_ratio.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)  # (B,)


def gspo_token_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO-token's per-token log-ratio ``log s_i,t = sg[log s_i] + logp_t - sg[logp_t]`` (GSPO Eq. 13–14).

    Its value is ``log s_i`` at every token of sequence ``i`` (so clipping acts on whole sequences), and its
    gradient with respect to ``logp_t`` is 1: with the ratio ``exp`` of it, each token's gradient is
    ``s_i * grad logp_t``, and averaged over the sequence's tokens it is GSPO's sequence-level gradient
    ``s_i * (1 / |y_i|) sum_t grad logp_t`` (``sg`` = stop-gradient, ``detach``).

    :param logp: log-probs under the current policy ``(B, T)``; ``old_logp`` the same under the sampling policy
    :param mask: ``True`` on valid completion tokens ``(B, T)``
    :return: ``(B, T)`` log-ratios; masked positions hold ``log s_i`` with no gradient
    """
    sequence = sequence_log_ratio(logp, old_logp, mask).detach()  # (B,)
    valid = torch.where(mask.bool(), logp - logp.detach(), 0.0)  # (B, T): value 0, gradient 1 on valid tokens
    return sequence.unsqueeze(-1) + valid  # (B, T)


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Schulman's k3 estimator of KL(pi || pi_ref) per token: ``exp(ref - logp) - (ref - logp) - 1``.

    DeepSeekMath Eq. 4; http://joschu.net/blog/kl-approx.html. With ``r = pi_ref / pi`` it is
    ``r - log r - 1 >= 0``, and its expectation over tokens sampled from pi is exactly KL(pi || pi_ref)
    (because ``E_pi[r] = 1``). Added to the loss with a positive beta, it pulls pi toward pi_ref.
    ``expm1`` keeps it >= 0 near ``logp == ref_logp``, where ``exp(x) - x - 1`` rounds below 0.

    :param logp: log-probs of the taken tokens under the policy, shape ``(B, T)``
    :param ref_logp: the same under the reference model, shape ``(B, T)``
    :return: per-token k3, shape ``(B, T)``
    """
    check_shape("ref_logp", ref_logp, logp.shape)
    log_ratio = ref_logp - logp  # (B, T): log r
    return torch.expm1(log_ratio) - log_ratio  # (B, T): (r - 1) - log r


def truncated_importance_weights(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, cap: float = 2.0) -> Tensor:
    """Truncated importance sampling (TIS) per token: ``w = min(pi_old / pi_sampler, cap)``, no gradient.

    Corrects for a sampler whose token distribution is not the update's own (a different precision, an
    external generation engine): the surrogate is built on ``pi / pi_old`` with ``pi_old`` the update's
    distribution before its first step, and each token's loss is weighted by ``w``, capped so that a token the
    sampler found much less likely than the update does cannot dominate (Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training"; TRL's ``vllm_importance_sampling_mode="token_truncate"``,
    verl's rollout importance sampling). Tokens where the sampler was the more confident get ``w < 1``.

    :param old_logp: log-probs of the sampled tokens under the update's forward pass, before any step, ``(B, T)``
    :param sampler_logp: the same as the sampler computed them, ``(B, T)``
    :param mask: ``True`` on valid completion tokens, ``(B, T)``
    :param cap: the largest weight ``C`` (``> 0``)
    :return: ``(B, T)`` weights, 0 at masked positions
    """
    if not cap > 0:
        raise ValueError(f"the truncation cap must be > 0, got {cap}.")
    check_shape("sampler_logp", sampler_logp, old_logp.shape)
    check_shape("mask", mask, old_logp.shape)
    log_ratio = torch.where(mask.bool(), old_logp - sampler_logp, 0.0).detach()  # (B, T)
    return torch.where(mask.bool(), torch.exp(log_ratio).clamp(max=cap), 0.0)  # (B, T)


def masked_sequence_weights(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, cap: float = 2.0) -> Tensor:
    """Masked sequence-level importance sampling: each sequence's ratio ``r_i = prod_t pi_old / pi_sampler`` over its
    valid tokens weights all its tokens, and a sequence whose ratio exceeds ``cap`` is left out (weight 0), no
    gradient.

    The masked variant of :func:`truncated_importance_weights` (TRL's ``vllm_importance_sampling_mode=
    "sequence_mask"`` with ``clip_max=cap`` and no lower bound): a sequence the sampler drew far more often than the
    update would (its whole-sequence mismatch beyond the threshold) says more about the engine than about the
    policy, and is dropped rather than down-weighted. A sequence with no valid token gets 0.

    :param old_logp: log-probs of the sampled tokens under the update's forward pass, before any step, ``(B, T)``
    :param sampler_logp: the same as the sampler computed them, ``(B, T)``
    :param mask: ``True`` on valid completion tokens, ``(B, T)``
    :param cap: the largest sequence ratio kept (``> 0``)
    :return: ``(B, T)`` weights: ``r_i`` on the valid tokens of a kept sequence, 0 elsewhere
    """
    if not cap > 0:
        raise ValueError(f"the mask threshold (cap) must be > 0, got {cap}.")
    check_shape("sampler_logp", sampler_logp, old_logp.shape)
    check_shape("mask", mask, old_logp.shape)
    valid = mask.bool()
    log_ratio = torch.where(valid, old_logp - sampler_logp, 0.0).detach().sum(dim=-1, keepdim=True)  # (B, 1)
    ratio = torch.exp(log_ratio)  # (B, 1): the sequence's importance ratio
    kept = (ratio <= cap) & valid.any(dim=-1, keepdim=True)  # (B, 1)
    return torch.where(valid & kept, ratio, 0.0)  # (B, T)


def truncated_fraction(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, cap: float = 2.0) -> Tensor:
    """The share of valid tokens whose TIS weight the cap truncates: ``pi_old / pi_sampler > cap`` (scalar, no
    gradient; 0 without valid tokens). Arguments as :func:`truncated_importance_weights`'s."""
    check_shape("sampler_logp", sampler_logp, old_logp.shape)
    check_shape("mask", mask, old_logp.shape)
    valid = mask.bool()
    truncated = (old_logp.detach() - sampler_logp.detach() > math.log(cap)) & valid  # (B, T)
    return truncated.sum() / valid.sum().clamp(min=1)


def aggregate(per_token: Tensor, mask: Tensor, mode: str = "sequence", max_tokens: int | None = None) -> Tensor:
    """Reduce a per-token quantity to a scalar over the valid tokens.

    ``"sequence"``: mean over each sequence's tokens, then over sequences (GRPO, DeepSeekMath Eq. 3); a
    sequence with no valid token contributes 0 and still counts in the mean over B. ``"token"``: sum over
    all valid tokens / their number (DAPO). ``"constant"``: sum / ``(B * max_tokens)`` (Dr. GRPO).

    :param per_token: shape ``(B, T)``; masked positions may hold anything, NaN included
    :param mask: ``True`` (or 1) on valid tokens, shape ``(B, T)``
    :param mode: ``"sequence"``, ``"token"`` or ``"constant"``
    :param max_tokens: the constant of ``"constant"``, usually ``max_new_tokens``
    :return: scalar
    """
    check_choice("aggregation mode", mode, AGGREGATION_MODES)
    check_shape("mask", mask, per_token.shape)
    mask = mask.bool()
    masked = torch.where(mask, per_token, 0.0)  # (B, T): where, not *, so NaN * 0 never happens
    if mode == "sequence":
        lengths = mask.sum(dim=-1).clamp(min=1)  # (B,)
        return (masked.sum(dim=-1) / lengths).mean()
    if mode == "token":
        return masked.sum() / mask.sum().clamp(min=1)
    if max_tokens is None or max_tokens <= 0:
        raise ValueError(f"aggregation 'constant' needs max_tokens > 0 (max_new_tokens), got {max_tokens}.")
    return masked.sum() / (per_token.shape[0] * max_tokens)
