"""Loss terms any policy-gradient method for language models uses, as pure tensor functions.

Tensors in, tensors out, no state, no I/O. Shapes: ``B`` sequences of ``T`` completion tokens. Masks are ``True`` on
valid completion tokens and ``False`` on padding and after EOS; masked positions never contribute to a value or a
gradient, even when they hold NaN or inf. The PPO-style surrogate, the k3 KL (and with it the sampler mismatch every
update measures) and the aggregation modes are here so that every algorithm shares one definition; GRPO's loss
assembles them (:func:`algorithms.grpo.update.grpo_loss`). Elsewhere: the advantages
(:mod:`algorithms.grpo.advantages`), the sampler correction's weights (:mod:`algorithms.common.sampler_correction`),
a token's log-prob and entropy (:mod:`algorithms.common.generation.sampler`).

Sources: PPO, Schulman et al. 2017; GRPO, Shao et al. 2024 (DeepSeekMath, arXiv 2402.03300), Eq. 3–4; DAPO,
Yu et al. 2025 (arXiv 2503.14476), clip-higher and the token-level loss; Dr. GRPO, Liu et al. 2025 (arXiv
2503.20783), the constant normaliser; the k3 KL estimator, http://joschu.net/blog/kl-approx.html.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from grpo_gym.validation import check_choice

AGGREGATION_MODES = ("sequence", "token", "constant")
IMPORTANCE_LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class PolicyOutputs:
    """What an algorithm's loss reads of the policy's forward pass on a minibatch: per-token log-probs ``(B, C)``
    under the current weights, entropies ``(B, C)`` and the value head's estimates ``(B, C)`` when asked."""

    log_probs: Tensor
    entropy: Tensor | None = None
    values: Tensor | None = None


#: an algorithm's loss, ``(minibatch, outputs) -> (loss, what to log)``: what
#: :meth:`~algorithms.common.base_class.LMBaseAlgorithm._update_policy` steps the optimizer on
LossFunction = Callable[[Any, PolicyOutputs], tuple[Tensor, dict[str, Any]]]


class UpdateLoss(NamedTuple):
    """An algorithm's loss as the update step runs it: the function, how it reduces tokens (``"token"``: the
    minibatches weighted by tokens, else rows), what of the policy's outputs it reads, and an optional stop (called
    with a minibatch's stats before its step; True ends the update there, SB3's ``target_kl``)."""

    function: LossFunction
    aggregation: str = "token"
    with_entropy: bool = False
    with_values: bool = False
    stop: Callable[[dict[str, Any]], bool] | None = None


def check_shape(name: str, tensor: Tensor, shape: torch.Size) -> None:
    if tensor.shape != shape:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}.")


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


def sampler_kl(update_logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> Tensor:
    """The mean over valid tokens of the k3 estimate of ``KL(pi_sampler || pi_update)`` at the sampled tokens
    (scalar, no gradient); ``update_logp`` and ``sampler_logp`` are ``(B, T)``, ``mask`` True on valid tokens."""
    per_token = kl_k3(sampler_logp.detach(), update_logp.detach())  # (B, T): r - 1 - log r, r = update / sampler
    return aggregate(per_token, mask, "token")


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
