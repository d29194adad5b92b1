"""Batched sampling with a KV cache, and the one definition of a token's log-probability.

One definition of a token's log-probability is used everywhere (sampling, the update's recomputation,
the reference model's KL term): the log-probability under the **full** softmax of the temperature-scaled
logits, over the ids ``< vocab_size``::

    log_prob(token) = log_softmax(logits[..., :vocab_size] / temperature)[token]

Top-p (nucleus) and top-k filtering only decide which token is drawn; they never change its log-prob. So a
fresh rollout's importance ratio ``exp(log_prob_new - log_prob_old)`` is exactly 1, and the KL estimate
compares two full distributions. Ids ``>= vocab_size`` (rows of a model's embedding table that the
tokenizer does not use) have probability zero: they are dropped from the softmax, never sampled.

Prompts are left-padded ``(B, T)`` batches with an attention mask (the env's observation layout). Position
ids are ``cumsum(mask) - 1`` clamped at 0, in sampling and in
:func:`~algorithms.common.generation.completion_pass.completion_log_probs` (the update's forward pass over given
completions) alike, so a prompt's padding does not change what is sampled nor its log-probs. Both take any Hugging
Face causal LM (Llama, Qwen2, GPT-2, ...) or a peft ``PeftModel`` with LoRA adapters. Put the model in ``eval()``
mode (no dropout) for both, or the recomputed log-probs will not match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from algorithms.common.generation.continuation import Parking, Prefilled, TurnCache, continue_prefill, row_contexts
from algorithms.common.generation.decoders import HFDecoder, LlamaDecoder, make_decoder
from algorithms.common.generation.packing import distinct_rows


@dataclass
class Completions:
    """A batch of sampled completions; every tensor has ``max_new_tokens`` columns.

    :param tokens: ``(B, N)`` sampled ids, ``pad_token_id`` after the EOS (the EOS itself is kept)
    :param log_probs: ``(B, N)`` log-prob of each sampled token (full softmax, see module doc), 0 at padding
    :param mask: ``(B, N)`` True for generated tokens up to and including the EOS
    :param lengths: ``(B,)`` number of generated tokens, EOS included (``mask.sum(-1)``)
    :param cache: the batch's KV cache for the next turn (``sample(keep_cache=True)``), else None
    """

    tokens: torch.Tensor
    log_probs: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor
    cache: TurnCache | None = None


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch: ``cumsum(mask) - 1``, clamped at 0 on the padding.

    :param attention_mask: ``(B, T)`` 1 for tokens, 0 for padding
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)  # (B, T)


MIN_TEMPERATURE = 1e-5
"""The smallest sampling temperature: below it float32 logits divided by the temperature can overflow (to NaN
samples), and the samples are the argmax anyway: decode greedily instead (the server does so by itself)."""


def scaled_logits(logits: torch.Tensor, temperature: float, vocab_size: int | None) -> torch.Tensor:
    """Logits restricted to ``[0, vocab_size)``, in float32, divided by the temperature."""
    if vocab_size is not None:
        logits = logits[..., :vocab_size]
    logits = logits.float()
    return logits / temperature if temperature != 1.0 else logits


def log_probs_of(scaled: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``log_softmax(scaled)[ids]``, without materialising the log-softmax: ``(..., V), (...) -> (...)``."""
    picked = scaled.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)


def entropy_of(scaled: torch.Tensor) -> torch.Tensor:
    """The entropy ``H = -sum_v p log p`` (nats) of the distribution whose log-probs :func:`log_probs_of` reads:
    ``(..., V) -> (...)``. ``scaled`` holds finite logits (:func:`scaled_logits` cuts the vocabulary, it masks
    nothing)."""
    log_p = torch.log_softmax(scaled, dim=-1)  # (..., V)
    return -(log_p.exp() * log_p).sum(-1)


def _filtered(scaled: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """``scaled`` ``(b, V)`` with ``-inf`` outside the top-k ids, then outside the top-p nucleus of the rest.

    The nucleus is the smallest set of most likely ids whose mass reaches ``top_p``; ids tied with the k-th
    largest logit are kept.
    """
    vocab = scaled.shape[-1]
    if 0 < top_k < vocab:
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]  # (b, 1)
        scaled = scaled.masked_fill(scaled < kth, -torch.inf)
    if top_p < 1.0:
        ordered, order = scaled.sort(dim=-1, descending=True)  # (b, V)
        probs = torch.softmax(ordered, dim=-1)
        outside = (probs.cumsum(dim=-1) - probs) >= top_p  # the mass before an id already reaches top_p
        outside[..., 0] = False  # the most likely id always stays (a top_p below float32's range would drop it)
        scaled = scaled.masked_fill(outside.scatter(-1, order, outside), -torch.inf)
    return scaled


def _draw(filtered: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One id per row of ``softmax(filtered)`` ``(b, V)`` by the Gumbel-max trick: ``argmax(logits + Gumbel)``.

    ``uniform`` ``(b, V)`` holds U(0, 1) draws, one per row and id (``-log(-log U)`` is Gumbel): a row's token
    depends only on its own logits and noise, not on which other rows are in the batch, so sharing prompts
    and dropping finished rows leave the sampled tokens unchanged.
    """
    return (filtered + _gumbel(uniform)).argmax(dim=-1)


def _gumbel(uniform: torch.Tensor) -> torch.Tensor:
    """``-log(-log U)``: Gumbel noise from U(0, 1) draws (clamped away from 0)."""
    return -torch.log(-torch.log(uniform.clamp(min=torch.finfo(uniform.dtype).tiny)))


NUCLEUS_CANDIDATES = 64
""":func:`_draw_nucleus` first looks for a row's top-p nucleus among its this many most likely ids."""


def _draw_nucleus(scaled: torch.Tensor, top_p: float, uniform: torch.Tensor) -> torch.Tensor:
    """:func:`_draw` of :func:`_filtered` ``(scaled, top_p, 0)`` (top-p, no top-k), without sorting the vocabulary.

    The nucleus is looked for among the :data:`NUCLEUS_CANDIDATES` most likely ids (``topk``): where their mass reaches
    ``top_p``, every id outside them is outside the nucleus too, and the draw is ``argmax(logits + Gumbel)`` over the
    candidates, with each candidate's own noise from ``uniform`` ``(b, V)``: the token :func:`_draw` picks. A row whose
    candidates hold less than ``top_p`` (a flat distribution) goes the sorting way. At a vocabulary of 49k ids the sort
    was a fifth of a decoding step; a nucleus rarely holds more than a few ids.
    """
    width = min(NUCLEUS_CANDIDATES, scaled.shape[-1])
    probs = torch.softmax(scaled, dim=-1)  # (b, V)
    top, ids = probs.topk(width, dim=-1)  # (b, w), most likely first
    mass = top.cumsum(dim=-1)  # (b, w)
    inside = (mass - top) < top_p  # the mass before an id has not reached top_p yet
    inside[:, 0] = True  # the most likely id always stays (as in _filtered)
    found = mass[:, -1] >= top_p  # (b,): the nucleus lies among the candidates
    noisy = scaled.gather(-1, ids) + _gumbel(uniform.gather(-1, ids))  # (b, w)
    token = ids.gather(-1, noisy.masked_fill(~inside, -torch.inf).argmax(dim=-1, keepdim=True)).squeeze(-1)
    if not bool(found.all()):
        flat = (~found).nonzero().squeeze(1)
        token[flat] = _draw(_filtered(scaled[flat], top_p, 0), uniform[flat])
    return token


def _check_sampling_args(temperature: float, top_p: float, top_k: int, max_new_tokens: int) -> None:
    if not temperature >= MIN_TEMPERATURE:
        raise ValueError(f"temperature must be >= {MIN_TEMPERATURE} (use greedy=True for argmax), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")


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
    decoder: str = "auto",
    compact_below: float = 0.75,
    noise_offset: int = 0,
    noise_rows: int | None = None,
    keep_cache: bool = False,
    cache: TurnCache | None = None,
    cache_rows: torch.Tensor | Sequence[int] | None = None,
) -> Completions:
    """Sample completions of a left-padded batch of prompts, with a KV cache.

    Identical prompts are run once (prefill) and their cache is shared by their rows (a GRPO group's G
    completions); then one batched forward per new token. Rows that emitted an EOS produce ``pad_token_id``
    with mask False and stop costing work: once fewer than ``compact_below`` of the rows in the batch are
    still running, the finished ones are dropped from the batch and its cache. The loop ends when every row
    is done (one host sync per step). Each token is drawn from the temperature-scaled distribution after
    top-k, then top-p filtering (``greedy=True``: the argmax), with noise drawn for every row of the batch at
    every step, so a row's tokens do not depend on prompt sharing or on which rows were dropped. The returned
    log-probs are under the **full** temperature-scaled softmax, not the truncated one (see the module doc):
    they equal :func:`completion_log_probs` of the same tokens.

    Multi-turn episodes (:mod:`~algorithms.common.generation.continuation`): ``keep_cache=True`` returns the batch's
    KV cache with the completions (:attr:`Completions.cache`; None where the decoder cannot keep one), and a later
    call with ``cache=`` and ``cache_rows=`` (the cache's row of each prompt) runs only the tokens each context added
    since; the tokens drawn and their log-probs are those of a call without the cache, up to float rounding.

    :param model: a Hugging Face causal LM, in eval mode
    :param input_ids: ``(B, T)`` left-padded prompt ids
    :param attention_mask: ``(B, T)`` 1 for prompt tokens, 0 for padding
    :param max_new_tokens: number of columns of the result, the most tokens generated per row
    :param eos_token_id: id (or ids) that end a completion
    :param pad_token_id: id written after the EOS; never drawn unless it is also an EOS id (log-probs stay those
        of the full softmax, pad included)
    :param temperature: logits are divided by it before sampling and in the log-probs
    :param top_p: nucleus sampling mass (the original design's 0.92); 1 disables it
    :param top_k: keep only the ``top_k`` most likely ids before top-p; 0 disables it
    :param vocab_size: ids ``>= vocab_size`` are never sampled and excluded from the softmax
    :param generator: the ``torch.Generator`` to sample with (on the model's device); ``None``: global RNG
    :param greedy: take the argmax instead of sampling
    :param decoder: the forward pass, see :func:`~algorithms.common.generation.decoders.make_decoder`: ``"auto"`` (this
        project's Llama-family decoder when it applies, else the model's own), ``"llama"`` or ``"hf"``
    :param compact_below: drop finished rows once the running share of the batch falls below this (0: never)
    :param noise_offset: this batch's first row within a larger batch whose noise is drawn (see ``noise_rows``)
    :param noise_rows: draw the noise of this many rows at each step and use rows ``noise_offset`` onwards: a
        process sampling its slice of a job's batch then draws exactly the tokens one process sampling the whole
        batch would (``None``: this batch's rows)
    :param keep_cache: also return the KV cache for the next turn (:attr:`Completions.cache`)
    :param cache: the :class:`~algorithms.common.generation.continuation.TurnCache` of the last turn, to continue from
    :param cache_rows: ``(B,)`` the cache's row of each prompt (with ``cache``)
    """
    _check_sampling_args(temperature, top_p, top_k, max_new_tokens)
    batch, device = input_ids.shape[0], input_ids.device
    eos = torch.as_tensor(eos_token_id, dtype=torch.long, device=device).reshape(-1)
    tokens = torch.full((batch, max_new_tokens), pad_token_id, dtype=torch.long, device=device)  # (B, N)
    log_probs = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)  # (B, N)
    mask = torch.zeros((batch, max_new_tokens), dtype=torch.bool, device=device)  # (B, N)
    if max_new_tokens == 0:
        return Completions(tokens, log_probs, mask, mask.sum(-1))
    if cache is not None and (cache_rows is None or cache.model is not model):
        raise ValueError("sample(cache=...) continues the turns of the same model: pass cache_rows, and that model")
    # Inference mode, not only no_grad: no autograd bookkeeping on any op (a tenth of a decoding step at small sizes,
    # where per-op overhead dominates). What it makes stays inside (the KV cache, kept for the next turn too); the
    # results are written into the tensors above, made outside it, so callers get ordinary tensors.
    with torch.inference_mode():
        if cache is not None:
            rows = torch.as_tensor(cache_rows, dtype=torch.long)
            start = continue_prefill(cache, rows, input_ids, attention_mask, max_new_tokens, pad_token_id)
        else:
            start = _prefill(model, input_ids, attention_mask, max_new_tokens, decoder, keep_cache)
        out = (tokens, log_probs, mask)
        options = (temperature, top_p, top_k, vocab_size, generator, greedy, compact_below, noise_offset, noise_rows)
        parking = Parking() if keep_cache else None
        runner, live = _decode(start, out, eos, pad_token_id, options, parking)
        turn_cache = None
        if parking is not None:
            lengths = mask.sum(-1)  # (B,)
            last = tokens.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)  # (B,)
            ended = (lengths > 0) & torch.isin(last, eos)
            turn_cache = parking.cache(runner, live, start, tokens, lengths, ended, model)
    return Completions(tokens, log_probs, mask, mask.sum(-1), turn_cache)


def _prefill(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    decoder: str,
    keep_contexts: bool,
) -> Prefilled:
    """Run the prompts (each distinct one once, its cache shared by its rows): where the sampling loop starts."""
    prompt_len = input_ids.shape[1]
    runner = make_decoder(model, prompt_len + max_new_tokens, decoder)
    prompts, rows_of = distinct_rows(input_ids, attention_mask)
    logits = runner.forward(
        input_ids[prompts], position_ids_from_mask(attention_mask[prompts]), attention_mask[prompts]
    )  # (U, V)
    if len(prompts) < input_ids.shape[0]:  # share each distinct prompt's cache among its rows
        runner.select(rows_of)
        logits = logits[rows_of]
    contexts = row_contexts(input_ids, attention_mask) if keep_contexts else None
    return Prefilled(runner, logits, attention_mask, attention_mask.long().sum(-1), contexts)


def _decode(
    start: Prefilled,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    eos: torch.Tensor,
    pad_token_id: int,
    options: tuple,
    parking: Parking | None,
) -> tuple[LlamaDecoder | HFDecoder, torch.Tensor]:
    """The sampling loop of :func:`sample` from ``start``, writing the ``(B, N)`` tokens, log-probs and mask ``out``;
    finished rows dropped from the batch are kept in ``parking`` (when given). Returns the decoder and the rows it
    still holds."""
    temperature, top_p, top_k, vocab_size, generator, greedy, compact_below, noise_offset, noise_rows = options
    tokens, log_probs, mask = out
    (batch, max_new_tokens), device = tokens.shape, tokens.device
    runner, logits, prompt_len = start.runner, start.logits, start.attention.shape[1]
    attention = torch.ones((batch, prompt_len + max_new_tokens), dtype=start.attention.dtype, device=device)
    attention[:, :prompt_len] = start.attention  # (B, P + N): a step's forward sees columns [0, P + step + 1)
    # The pad id is never drawn unless it is also an EOS id: it is not text, and the env ends a completion at
    # it, so a drawn pad would be trained on with a reward that never saw what follows it.
    blocked = None if bool(torch.isin(torch.tensor(pad_token_id), eos.cpu())) else torch.tensor([pad_token_id])
    rows = torch.arange(batch, device=device)  # (b,): the batch rows still in the decoder, in its order
    running = torch.ones(batch, dtype=torch.bool, device=device)  # (b,)
    for step in range(max_new_tokens):
        scaled = scaled_logits(logits, temperature, vocab_size)  # (b, V)
        drawable = scaled if blocked is None else scaled.index_fill(-1, blocked.to(device), -torch.inf)
        if greedy:
            token = drawable.argmax(dim=-1)  # (b,)
        else:
            uniform = torch.rand((noise_rows or batch, scaled.shape[-1]), device=device, generator=generator)
            noise = uniform[noise_offset + rows]  # (b, V)
            if top_k == 0 and top_p < 1.0:
                token = _draw_nucleus(drawable, top_p, noise)  # (b,)
            else:
                token = _draw(_filtered(drawable, top_p, top_k), noise)  # (b,)
        tokens[rows, step] = torch.where(running, token, pad_token_id)
        log_probs[rows, step] = torch.where(running, log_probs_of(scaled, token), 0.0)
        mask[rows, step] = running
        running = running & ~torch.isin(token, eos)
        alive = int(running.sum())
        if step == max_new_tokens - 1 or alive == 0:
            break
        if alive < compact_below * len(rows):  # drop the finished rows from the batch and the cache
            if parking is not None:
                finished = (~running).nonzero().squeeze(1)
                parking.park(runner, finished, rows[finished])
            keep = running.nonzero().squeeze(1)
            runner.select(keep)
            rows, running, token = rows[keep], running[keep], token[keep]
        column = prompt_len + step
        logits = runner.forward(
            token[:, None], (start.next_position[rows] + step)[:, None], attention[rows, : column + 1]
        )
    return runner, rows
