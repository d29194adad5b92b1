"""The KV cache kept across the turns of multi-turn episodes: after a tool result or the env's feedback, sampling
continues from each row's cached context and runs only the tokens the env added.

:func:`~algorithms.common.generation.sampler.sample` with ``keep_cache=True`` returns, with its completions, a
:class:`TurnCache`: per row, the keys and values of its context and of the completion tokens it wrote (the EOS left
out, as the env leaves it out of the next context), and those tokens. The next turn's ``sample(..., cache=cache,
cache_rows=rows)`` checks each row's new context (:func:`continue_prefill`): when it starts with the tokens the
cache holds, only the rest is run (the env's text, e.g. ``"\\nTool: 274\\nAssistant: "``), at the positions that
follow; when it does not (the window dropped old tokens: the context was cut to the policy's ``context_limit``, or
the env rewrote it), that row is prefilled afresh in the same batch, its cached columns hidden. Either way a row
attends to exactly the tokens of its new context, at the positions a fresh pass gives them, so its log-probs are
those of :func:`~algorithms.common.generation.completion_pass.completion_log_probs` over the whole context, up to float
rounding.

The cache's columns are the batch's: a row's padding and its columns after its EOS are hidden from it by
:attr:`TurnCache.visible`. Only :class:`~algorithms.common.generation.decoders.LlamaDecoder` keeps a cache across
calls (the builtin sampler's decoder for Llama, Qwen2 and Mistral); with the model's own forward (``decoder="hf"``,
other architectures) and on the other rollout engines (vLLM keeps its own prefix cache) every turn is prefilled
afresh. A cache is valid while the weights that made it do not change: within one rollout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from algorithms.common.generation.decoders import HFDecoder, LlamaDecoder


@dataclass
class TurnCache:
    """The KV cache of a sampled batch, one row per completion, for the next turn (see the module doc).

    :param decoder: holds each row's keys and values, ``(R, kv, C, D)`` per layer
    :param visible: ``(R, C)`` bool, the cached columns each row attends to: its context and its completion's tokens
    :param next_position: ``(R,)`` the position id of each row's next token
    :param contexts: per row, the tokens of its visible columns, oldest first (1-D, on the CPU)
    :param model: the model that made it (a cache is refused by another)
    """

    decoder: LlamaDecoder
    visible: torch.Tensor
    next_position: torch.Tensor
    contexts: list[torch.Tensor]
    model: nn.Module

    def __len__(self) -> int:
        return len(self.contexts)


@dataclass
class Prefilled:
    """Where the sampling loop starts: the decoder, each row's next-token logits ``(B, V)``, the mask of the columns
    the decoder holds ``(B, P)``, each row's next position ``(B,)`` and its context (for the next cache, or None)."""

    runner: LlamaDecoder | HFDecoder
    logits: torch.Tensor
    attention: torch.Tensor
    next_position: torch.Tensor
    contexts: list[torch.Tensor] | None


def row_contexts(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
    """Each row's tokens without its padding, on the CPU."""
    ids, mask = input_ids.cpu(), attention_mask.bool().cpu()
    return [row[keep] for row, keep in zip(ids, mask, strict=True)]


def _left_padded(rows: list[torch.Tensor], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, W)`` ids and mask of 1-D rows, left-padded."""
    width = max(len(row) for row in rows)
    lengths = torch.tensor([len(row) for row in rows])
    mask = torch.arange(width)[None] >= (width - lengths)[:, None]  # (B, W)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    ids[mask] = torch.cat(rows).long()
    return ids.to(device), mask.long().to(device)


def continue_prefill(
    cache: TurnCache,
    rows: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    pad_id: int,
) -> Prefilled:
    """Run the new tokens of the contexts ``input_ids`` (left-padded ``(B, T)``) of the cache's rows ``rows``
    ``(B,)`` on a copy of their cache: a row whose context extends what its cache holds runs only the extension, the
    others their whole context (see the module doc)."""
    if len(rows) != len(input_ids):
        raise ValueError(f"cache_rows names {len(rows)} rows for {len(input_ids)} prompts")
    contexts = row_contexts(input_ids, attention_mask)
    new, fresh = [], []
    for row, context in zip(rows.tolist(), contexts, strict=True):
        cached = cache.contexts[row]
        extends = len(context) > len(cached) and torch.equal(context[: len(cached)], cached)
        new.append(context[len(cached) :] if extends else context)
        fresh.append(not extends)
    device = input_ids.device
    chunk_ids, chunk_mask = _left_padded(new, pad_id, device)  # (B, W)
    rows, fresh_rows = rows.to(device), torch.tensor(fresh, device=device)
    base = torch.where(fresh_rows, 0, cache.next_position.to(device)[rows])  # (B,)
    positions = base[:, None] + (chunk_mask.cumsum(-1) - 1).clamp(min=0)  # (B, W)
    kept = cache.visible.to(device)[rows] & ~fresh_rows[:, None]  # (B, C): a fresh row sees none of its old columns
    attention = torch.cat([kept.to(chunk_mask.dtype), chunk_mask], dim=1)  # (B, C + W)
    runner = cache.decoder.fork(rows, attention.shape[1] + max_new_tokens)
    logits = runner.forward(chunk_ids, positions, attention)
    return Prefilled(runner, logits, attention, base + chunk_mask.sum(-1), contexts)


class Parking:
    """The cache rows the sampling loop drops from its batch when they finish, kept for the next turn."""

    def __init__(self) -> None:
        self.parts: list[tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]] = []

    def park(self, runner: LlamaDecoder | HFDecoder, local: torch.Tensor, rows: torch.Tensor) -> None:
        """Keep the rows at ``local`` (indices in the runner's batch; ``rows``: their rows in the sampled batch)."""
        if isinstance(runner, LlamaDecoder):
            self.parts.append((rows, *runner.snapshot(local)))

    def cache(
        self,
        runner: LlamaDecoder | HFDecoder,
        live: torch.Tensor,
        start: Prefilled,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        ended: torch.Tensor,
        model: nn.Module,
    ) -> TurnCache | None:
        """The :class:`TurnCache` of every row of the batch: the runner's rows ``live`` and the parked ones.

        :param start: the prefill the batch started from
        :param tokens: ``(B, N)`` the sampled tokens
        :param lengths: ``(B,)`` the completion lengths, EOS included
        :param ended: ``(B,)`` bool, whether each completion ended with an EOS (else it was cut at the budget)
        :param model: the model sampled from
        """
        if not isinstance(runner, LlamaDecoder) or start.contexts is None:
            return None
        parts = [(live, *runner.snapshot(torch.arange(len(live), device=live.device))), *self.parts]
        batch, prompt_columns, columns = len(tokens), start.attention.shape[1], runner.length
        keys = [layer.new_zeros((batch, layer.shape[1], columns, layer.shape[3])) for layer in parts[0][1]]
        values = [layer.new_zeros(layer.shape) for layer in keys]
        cached = torch.zeros(batch, dtype=torch.long, device=tokens.device)  # (B,) completion columns in the cache
        for rows, part_keys, part_values in parts:
            width = part_keys[0].shape[2]
            for whole, part in zip(keys + values, part_keys + part_values, strict=True):
                whole[rows, :, :width] = part
            cached[rows] = width - prompt_columns
        written = torch.minimum(cached, lengths - ended.long())  # (B,) the completion tokens the next context holds
        steps = torch.arange(columns - prompt_columns, device=tokens.device)  # (N',)
        visible = torch.cat([start.attention.bool(), steps[None] < written[:, None]], dim=1)  # (B, columns)
        runner.adopt(keys, values)
        counts = written.tolist()
        contexts = [
            torch.cat([context, row[:n].cpu()]) for context, row, n in zip(start.contexts, tokens, counts, strict=True)
        ]
        return TurnCache(runner, visible, start.next_position + written, contexts, model)
