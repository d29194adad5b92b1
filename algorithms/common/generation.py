"""Batched sampling with a KV cache, and the log-probabilities of completions.

One definition of a token's log-probability is used everywhere (sampling, the update's recomputation,
the reference model's KL term): the log-probability under the **full** softmax of the temperature-scaled
logits, over the ids ``< vocab_size``::

    log_prob(token) = log_softmax(logits[..., :vocab_size] / temperature)[token]

Top-p (nucleus) and top-k filtering only decide which token is drawn; they never change its log-prob. So a
fresh rollout's importance ratio ``exp(log_prob_new - log_prob_old)`` is exactly 1, and the KL estimate
compares two full distributions. Ids ``>= vocab_size`` (rows of a model's embedding table that the
tokenizer does not use) have probability zero: they are dropped from the softmax, never sampled.

Prompts are left-padded ``(B, T)`` batches with an attention mask (the env's observation layout). Position
ids are ``cumsum(mask) - 1`` clamped at 0, in sampling and in :func:`completion_log_probs` alike, so a
prompt's padding does not change what is sampled nor its log-probs. Both functions take any Hugging Face
causal LM (Llama, Qwen2, GPT-2, ...). Put the model in ``eval()`` mode (no dropout) for both, or the
recomputed log-probs will not match.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class Completions:
    """A batch of sampled completions; every tensor has ``max_new_tokens`` columns.

    :param tokens: ``(B, N)`` sampled ids, ``pad_token_id`` after the EOS (the EOS itself is kept)
    :param log_probs: ``(B, N)`` log-prob of each sampled token (full softmax, see module doc), 0 at padding
    :param mask: ``(B, N)`` True for generated tokens up to and including the EOS
    :param lengths: ``(B,)`` number of generated tokens, EOS included (``mask.sum(-1)``)
    """

    tokens: torch.Tensor
    log_probs: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch: ``cumsum(mask) - 1``, clamped at 0 on the padding.

    :param attention_mask: ``(B, T)`` 1 for tokens, 0 for padding
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)  # (B, T)


def _forward_parameters(model: torch.nn.Module) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def _cache_of(out: Any) -> Any:
    """The KV cache of a model output: ``cache`` (transformers >= 5.2x) or ``past_key_values`` (older)."""
    return out["cache"] if "cache" in out else out["past_key_values"]


def _scaled_logits(logits: torch.Tensor, temperature: float, vocab_size: int | None) -> torch.Tensor:
    """Logits restricted to ``[0, vocab_size)``, in float32, divided by the temperature."""
    if vocab_size is not None:
        logits = logits[..., :vocab_size]
    logits = logits.float()
    return logits / temperature if temperature != 1.0 else logits


def _token_log_probs(scaled: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``log_softmax(scaled)[ids]``, without materialising the log-softmax: ``(..., V), (...) -> (...)``."""
    picked = scaled.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)


def _draw(scaled: torch.Tensor, top_p: float, top_k: int, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one id per row of ``scaled`` ``(B, V)`` after top-k then top-p filtering: ``(B,)``."""
    vocab = scaled.shape[-1]
    if 0 < top_k < vocab:
        values, order = scaled.topk(top_k, dim=-1)  # (B, k), sorted descending
    elif top_p < 1.0:
        values, order = scaled.sort(dim=-1, descending=True)  # (B, V)
    else:
        probs = torch.softmax(scaled, dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    probs = torch.softmax(values, dim=-1)
    if top_p < 1.0:
        mass_before = probs.cumsum(dim=-1) - probs  # keep the smallest prefix whose mass reaches top_p
        probs = probs.masked_fill(mass_before >= top_p, 0.0)
    choice = torch.multinomial(probs, 1, generator=generator)  # (B, 1), index into the sorted order
    return order.gather(-1, choice).squeeze(-1)


def _check_sampling_args(temperature: float, top_p: float, top_k: int, max_new_tokens: int) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (use greedy=True for argmax), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_token_id: int | Sequence[int],
    pad_token_id: int,
    temperature: float = 1.0,
    top_p: float = 0.92,
    top_k: int = 0,
    vocab_size: int | None = None,
    generator: torch.Generator | None = None,
    greedy: bool = False,
) -> Completions:
    """Sample completions of a left-padded batch of prompts, with a KV cache.

    The prompts are run once (prefill), then one batched forward per new token reuses the cache. Rows
    that emitted an EOS produce ``pad_token_id`` with mask False; the loop stops once all rows are done
    (one host sync per step). Each token is drawn from the temperature-scaled distribution after top-k,
    then top-p filtering (``greedy=True``: the argmax). The returned log-probs are under the **full**
    temperature-scaled softmax, not the truncated one (see the module doc): they equal
    :func:`completion_log_probs` of the same tokens.

    :param model: a Hugging Face causal LM, in eval mode
    :param input_ids: ``(B, T)`` left-padded prompt ids
    :param attention_mask: ``(B, T)`` 1 for prompt tokens, 0 for padding
    :param max_new_tokens: number of columns of the result, the most tokens generated per row
    :param eos_token_id: id (or ids) that end a completion
    :param pad_token_id: id written after the EOS; never drawn unless it is also an EOS id (log-probs stay those
        of the full softmax, pad included)
    :param temperature: logits are divided by it before sampling and in the log-probs
    :param top_p: nucleus sampling mass (S6: 0.92); 1 disables it
    :param top_k: keep only the ``top_k`` most likely ids before top-p; 0 disables it
    :param vocab_size: ids ``>= vocab_size`` are never sampled and excluded from the softmax
    :param generator: the ``torch.Generator`` to sample with (on the model's device); ``None``: global RNG
    :param greedy: take the argmax instead of sampling
    """
    _check_sampling_args(temperature, top_p, top_k, max_new_tokens)
    batch, prompt_len = input_ids.shape
    device = input_ids.device
    eos = torch.as_tensor(eos_token_id, dtype=torch.long, device=device).reshape(-1)
    tokens = torch.full((batch, max_new_tokens), pad_token_id, dtype=torch.long, device=device)  # (B, N)
    log_probs = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)  # (B, N)
    mask = torch.zeros((batch, max_new_tokens), dtype=torch.bool, device=device)  # (B, N)
    if max_new_tokens == 0:
        return Completions(tokens, log_probs, mask, mask.sum(-1))
    attention = torch.ones((batch, prompt_len + max_new_tokens), dtype=attention_mask.dtype, device=device)
    attention[:, :prompt_len] = attention_mask  # (B, T + N): grows one column per step
    next_position = attention_mask.long().sum(-1, keepdim=True)  # (B, 1): position of the first new token
    finished = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,)

    parameters = _forward_parameters(model)
    keep = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
    cache_name = "cache" if "cache" in parameters else "past_key_values"  # renamed in transformers 5.2x
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=True,
        **keep,
    )
    # The pad id is never drawn unless it is also an EOS id: it is not text, and the env ends a completion at
    # it, so a drawn pad would be trained on with a reward that never saw what follows it.
    blocked = None if bool(torch.isin(torch.tensor(pad_token_id), eos.cpu())) else pad_token_id
    for step in range(max_new_tokens):
        scaled = _scaled_logits(out.logits[:, -1], temperature, vocab_size)  # (B, V)
        drawable = (
            scaled if blocked is None else scaled.index_fill(-1, torch.tensor([blocked], device=device), -torch.inf)
        )
        token = drawable.argmax(dim=-1) if greedy else _draw(drawable, top_p, top_k, generator)  # (B,)
        alive = ~finished
        tokens[:, step] = torch.where(alive, token, pad_token_id)
        log_probs[:, step] = torch.where(alive, _token_log_probs(scaled, token), 0.0)
        mask[:, step] = alive
        finished = finished | torch.isin(token, eos)
        if step == max_new_tokens - 1 or bool(finished.all()):
            break
        out = model(
            input_ids=tokens[:, step : step + 1],
            attention_mask=attention[:, : prompt_len + step + 1],
            position_ids=next_position + step,
            **{cache_name: _cache_of(out)},
            use_cache=True,
        )
    return Completions(tokens, log_probs, mask, mask.sum(-1))


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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropies) of completions, in one forward pass; differentiable.

    The prompt and completion are concatenated with the same position ids as :func:`sample`, and only the
    logits that predict completion tokens are kept. Log-probs follow the module's single definition (full
    temperature-scaled softmax over ids ``< vocab_size``); the entropy is that distribution's.

    :param model: a Hugging Face causal LM (eval mode for a ratio of exactly 1 on-policy)
    :param prompt_ids: ``(B, T)`` left-padded prompt ids
    :param prompt_mask: ``(B, T)`` 1 for prompt tokens, 0 for padding
    :param completion_ids: ``(B, C)`` completion ids (e.g. :attr:`Completions.tokens`)
    :param completion_mask: ``(B, C)`` True for real completion tokens, False after the EOS
    :param temperature: the sampling temperature
    :param vocab_size: ids ``>= vocab_size`` are excluded from the softmax
    :param with_entropy: also return the per-token entropy
    :return: ``(log_probs, entropy)``, both ``(B, C)`` float32 and 0 where the mask is False;
        ``entropy`` is None unless ``with_entropy``
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    completion_len = completion_ids.shape[1]
    mask = completion_mask.bool()  # (B, C)
    attention = torch.cat([prompt_mask, mask.to(prompt_mask.dtype)], dim=1)  # (B, T + C)
    keep = {"logits_to_keep": completion_len + 1} if "logits_to_keep" in _forward_parameters(model) else {}
    logits = model(
        input_ids=torch.cat([prompt_ids, completion_ids], dim=1),  # (B, T + C)
        attention_mask=attention,
        position_ids=position_ids_from_mask(attention),
        use_cache=False,
        **keep,
    ).logits
    logits = logits[:, -(completion_len + 1) : -1]  # (B, C, V): logits at T-1 ... T+C-2
    scaled = _scaled_logits(logits, temperature, vocab_size)
    ids = completion_ids.masked_fill(~mask, 0)  # padding may hold any id; keep gather in range
    log_probs = _token_log_probs(scaled, ids).masked_fill(~mask, 0.0)  # (B, C)
    entropy = None
    if with_entropy:
        log_p = F.log_softmax(scaled, dim=-1)  # (B, C, V)
        entropy = -(log_p.exp() * log_p).sum(-1).masked_fill(~mask, 0.0)  # (B, C)
    return log_probs, entropy
