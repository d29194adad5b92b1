"""The update's forward pass over given completions: their per-token log-probabilities (and entropies, and the last
hidden states a value head reads), or their raw logits, in one pass, differentiable.

The log-probability is the sampler's (:mod:`algorithms.common.generation.sampler`: the full softmax of the
temperature-scaled logits over the ids ``< vocab_size``), with the sampler's positions, so a fresh rollout's ratio is
exactly 1. Two layouts give the same values: one row per completion, or packed
(:mod:`~algorithms.common.generation.packing`: each distinct prompt once, its completions after it).
"""

from __future__ import annotations

import torch

from algorithms.common.generation.decoders import forward_parameters
from algorithms.common.generation.packing import pack_rows, packing_pays
from algorithms.common.generation.sampler import (
    MIN_TEMPERATURE,
    entropy_of,
    log_probs_of,
    position_ids_from_mask,
    scaled_logits,
)
from algorithms.common.model.lora import base_network


def completion_log_probs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    vocab_size: int | None = None,
    with_entropy: bool = False,
    layout: str = "auto",
    pad_id: int = 0,
    with_hidden: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Per-token log-probs (and entropies, and last hidden states) of completions, in one forward pass;
    differentiable.

    Two layouts give the same values (up to float rounding): ``"padded"``, one row per completion (its
    prompt, then the completion, cut to the longest completion), and ``"packed"``
    (:mod:`~algorithms.common.generation.packing`: each distinct prompt once, its completions after it, no padding),
    which does the work of the real tokens only. ``"auto"`` packs when the model takes a custom 4D attention
    mask (``sdpa`` or ``eager`` attention). Positions are those of
    :func:`~algorithms.common.generation.sampler.sample`, so log-probs follow the sampler's single definition (full
    temperature-scaled softmax over ids ``< vocab_size``); the entropy is that distribution's.

    :param model: a Hugging Face causal LM (eval mode for a ratio of exactly 1 on-policy)
    :param prompt_ids: ``(B, T)`` left-padded prompt ids
    :param prompt_mask: ``(B, T)`` 1 for prompt tokens, 0 for padding
    :param completion_ids: ``(B, C)`` completion ids (e.g. :attr:`Completions.tokens`)
    :param completion_mask: ``(B, C)`` True for real completion tokens, False after the EOS
    :param temperature: the sampling temperature
    :param vocab_size: ids ``>= vocab_size`` are excluded from the softmax
    :param with_entropy: also return the per-token entropy
    :param layout: ``"auto"``, ``"packed"`` or ``"padded"``
    :param pad_id: the id written in the packed layout's padding
    :param with_hidden: also return the last layer's hidden state at each position that predicts a completion token
        (what a per-token value head reads, e.g. PPO's), from the same forward pass
    :return: ``(log_probs, entropy)``, both ``(B, C)`` float32 and 0 where the mask is False;
        ``entropy`` is None unless ``with_entropy``; with ``with_hidden`` a third item, the ``(B, C, H)`` hidden
        states in the model's dtype, 0 where the mask is False
    """
    if not temperature >= MIN_TEMPERATURE:
        raise ValueError(f"temperature must be >= {MIN_TEMPERATURE}, got {temperature}")
    mask = completion_mask.bool()  # (B, C)
    args = (model, prompt_ids, prompt_mask, completion_ids, mask, layout, pad_id, with_hidden)
    logits, hidden = _completion_outputs(*args)
    scaled = scaled_logits(logits, temperature, vocab_size)  # (N, V): one row per real completion token
    log_probs = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    log_probs = log_probs.masked_scatter(mask, log_probs_of(scaled, completion_ids[mask]))  # (B, C)
    entropy = None
    if with_entropy:
        entropy = torch.zeros_like(log_probs).masked_scatter(mask, entropy_of(scaled))  # (B, C)
    if not with_hidden:
        return log_probs, entropy
    states = hidden.new_zeros((*mask.shape, hidden.shape[-1])).masked_scatter(mask.unsqueeze(-1), hidden)  # (B, C, H)
    return log_probs, entropy, states


def completion_logits(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    layout: str = "auto",
    pad_id: int = 0,
) -> torch.Tensor:
    """``(N, V)`` raw logits predicting each real completion token (row-major order), in one forward pass.

    The forward pass of :func:`completion_log_probs` (same layouts, same positions), for callers that need the
    whole distribution at each token, e.g. distillation's KL between two models over the same completions.

    :param model: a Hugging Face causal LM
    :param prompt_ids: ``(B, T)`` left-padded prompt ids
    :param prompt_mask: ``(B, T)`` 1 for prompt tokens, 0 for padding
    :param completion_ids: ``(B, C)`` completion ids
    :param completion_mask: ``(B, C)`` True for real completion tokens; ``N`` is its number of True entries
    :param layout: ``"auto"``, ``"packed"`` or ``"padded"`` (see :func:`completion_log_probs`)
    :param pad_id: the id written in the packed layout's padding
    """
    args = (model, prompt_ids, prompt_mask, completion_ids, completion_mask, layout, pad_id, False)
    return _completion_outputs(*args)[0]


def _completion_outputs(
    model, prompt_ids, prompt_mask, completion_ids, completion_mask, layout, pad_id, with_hidden
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(N, V)`` logits predicting each real completion token (row-major order) and, ``with_hidden``, the
    ``(N, H)`` last hidden states they are read from (else None)."""
    if layout not in ("auto", "packed", "padded"):
        raise ValueError(f"layout must be 'auto', 'packed' or 'padded', got {layout!r}")
    model = base_network(model)  # a PeftModel's own model, LoRA layers included: the same logits, fewer wrappers
    mask = completion_mask.bool()  # (B, C)
    attention_kind = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if layout == "auto":  # packed where the model takes a 4D mask and the layout does less work (packing_pays)
        packs = attention_kind in ("sdpa", "eager") and packing_pays(model, prompt_ids, prompt_mask, mask)
        layout = "packed" if packs else "padded"
    if layout == "packed":
        return _packed_logits(model, prompt_ids, prompt_mask, completion_ids, mask, pad_id, attention_kind, with_hidden)
    longest = max(int(mask.sum(-1).max()), 1) if mask.numel() else 1  # columns past it are never read: not run
    completion_ids, mask = completion_ids[:, :longest], mask[:, :longest]
    logits, hidden = _padded_logits(model, prompt_ids, prompt_mask, completion_ids, mask, with_hidden)
    return logits[mask], (hidden[mask] if hidden is not None else None)  # (N, V), (N, H)


def _padded_logits(model, prompt_ids, prompt_mask, completion_ids, mask, with_hidden=False):
    """``(B, C, V)`` logits predicting each completion column, one row per completion (and the ``(B, C, H)``
    last hidden states they come from, ``with_hidden``)."""
    completion_len = completion_ids.shape[1]
    attention = torch.cat([prompt_mask, mask.to(prompt_mask.dtype)], dim=1)  # (B, T + C)
    keep = {"logits_to_keep": completion_len + 1} if "logits_to_keep" in forward_parameters(model) else {}
    out = model(
        input_ids=torch.cat([prompt_ids, completion_ids], dim=1),  # (B, T + C)
        attention_mask=attention,
        position_ids=position_ids_from_mask(attention),
        use_cache=False,
        output_hidden_states=with_hidden,
        **keep,
    )
    columns = slice(-(completion_len + 1), -1)  # positions T-1 ... T+C-2
    hidden = out.hidden_states[-1][:, columns] if with_hidden else None
    return out.logits[:, columns], hidden  # (B, C, V), (B, C, H)


def _packed_logits(model, prompt_ids, prompt_mask, completion_ids, mask, pad_id, attention_kind, with_hidden=False):
    """``(N, V)`` logits predicting each real completion token (row-major order), from the packed layout (and
    the ``(N, H)`` last hidden states, ``with_hidden``)."""
    packed = pack_rows(prompt_ids, prompt_mask, completion_ids, mask, pad_id=pad_id)
    allowed = packed.attention_mask()  # (R, 1, W, W) bool
    if attention_kind != "sdpa":  # eager attention adds the mask to the scores
        dtype = next(model.parameters()).dtype
        allowed = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )
    width = packed.input_ids.shape[1]
    # the logits of the columns from the first that predicts a completion token on: a prompt's own columns are not
    # read (at a 49k vocabulary the output layer over them was a tenth of the update)
    first = int(packed.source.remainder(width).min()) if len(packed.source) else width - 1
    keep = {"logits_to_keep": width - first} if "logits_to_keep" in forward_parameters(model) else {}
    out = model(
        input_ids=packed.input_ids,
        attention_mask=allowed,
        position_ids=packed.position_ids,
        use_cache=False,
        output_hidden_states=with_hidden,
        **keep,
    )  # logits (R, W - first, V), or (R, W, V) for a model without logits_to_keep
    hidden = out.hidden_states[-1].flatten(0, 1)[packed.source] if with_hidden else None  # (N, H)
    kept = out.logits.shape[1]
    source = packed.source // width * kept + packed.source.remainder(width) - (width - kept)  # in the kept columns
    return out.logits.flatten(0, 1)[source], hidden
