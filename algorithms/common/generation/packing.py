"""Padding-free, prefix-shared layout of (prompt, completion) rows for one forward pass.

A GRPO update scores K prompts x G completions. Laid out one row per completion, every row repeats its
prompt and is padded to the longest completion of the batch (a random or exploring policy often has one
completion at the length cap and most far shorter). Packed, each distinct prompt appears once, followed by its
completions back to back, with positions restarting after the prompt for each completion and a block mask:
a prompt token sees the prompt before it; a completion token sees the prompt and its own completion before
it. A row holds at most ``max(pack_length, longest prompt + completion)`` tokens, so attention (quadratic in the
row length) stays bounded when a prompt has many long completions; a prompt whose completions do not fit in
one row is repeated at the start of the next.

Every token's logits equal those of the one-row-per-completion layout up to float rounding (the same tokens
at the same positions see the same tokens), which the tests check.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PROMPT, PADDING = -1, -2  # segment ids of prompt and padding tokens; completions are numbered from 0


@dataclass
class PackedRows:
    """The packed layout of a batch and where to read each completion token's logits.

    :param input_ids: ``(R, W)`` packed token ids (``pad_id`` at the end of short rows)
    :param position_ids: ``(R, W)`` positions: ``0..P-1`` for a prompt, ``P..P+L-1`` for each completion
    :param segments: ``(R, W)`` ``PROMPT``, ``PADDING`` or the completion's row index in the batch
    :param source: ``(N,)`` flat indices (``row * W + column``) of the logits that predict the completion
        tokens, one per real completion token, in the order of ``completion_mask.nonzero()``
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segments: torch.Tensor
    source: torch.Tensor

    def attention_mask(self) -> torch.Tensor:
        """``(R, 1, W, W)`` bool, True where a query (row, q) may attend to a key (row, k).

        Causal; a prompt token sees its row's prompt; a completion token sees the prompt and its own segment;
        a padding token sees itself only (so no query row is fully masked).
        """
        seg = self.segments
        query, key = seg[:, :, None], seg[:, None, :]  # (R, W, 1), (R, 1, W)
        width = seg.shape[1]
        causal = torch.ones((width, width), dtype=torch.bool, device=seg.device).tril()
        same = (key == PROMPT) | (key == query)
        allowed = causal & same & (query != PADDING)
        itself = torch.eye(width, dtype=torch.bool, device=seg.device) & (query == PADDING)
        return (allowed | itself).unsqueeze(1)


def pack_plan(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_mask: torch.Tensor, pack_length: int = 512
) -> tuple[list[tuple[int, list[int]]], list[int], list[int], int]:
    """Which batch rows each packed row holds (see :func:`pack_rows`): ``(plan, prompt_lengths, lengths, width)``,
    ``plan`` a list of ``(owner, members)`` (the batch row whose prompt starts the packed row, the rows whose
    completions follow it), ``width`` the packed rows' common width."""
    prompt_lengths = prompt_mask.sum(dim=1).tolist()
    lengths = completion_mask.sum(dim=1).tolist()
    if any(p == 0 and n > 0 for p, n in zip(prompt_lengths, lengths, strict=True)):
        raise ValueError("every completion needs a prompt of at least one token (its first token's predictor)")
    _, of = distinct_rows(prompt_ids, prompt_mask)
    by_prompt: dict[int, list[int]] = {}  # distinct prompt -> its rows, both in order of appearance
    for row, prompt in enumerate(of.tolist()):
        by_prompt.setdefault(prompt, []).append(row)
    plan: list[tuple[int, list[int]]] = []
    for rows in by_prompt.values():
        owner, used, members = rows[0], prompt_lengths[rows[0]], []
        for row in rows:
            if members and used + lengths[row] > pack_length:
                plan.append((owner, members))
                used, members = prompt_lengths[owner], []
            members.append(row)
            used += lengths[row]
        plan.append((owner, members))
    width = max(prompt_lengths[owner] + sum(lengths[r] for r in members) for owner, members in plan)
    return plan, prompt_lengths, lengths, width


#: the cost of one (query, key) pair of attention relative to its FLOPs (4 x hidden per layer), for a padded batch
#: (HF's mask from the padding) and for the packed layout's block mask; fitted on a 2-core Xeon (float32, sdpa) from
#: a 1M-parameter Llama's forward + backward at six shapes (prompts of 17 to 256 tokens, 8 completions of 16 to 64)
ATTENTION_WEIGHT = {"padded": 2.0, "packed": 4.0}


def packing_pays(
    model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_mask: torch.Tensor
) -> bool:
    """Whether the packed layout's forward pass costs less than one row per completion, by a model of its work: per
    token, twice the decoder layers' weights; per (query, key) pair of a row, 4 x hidden x layers times
    :data:`ATTENTION_WEIGHT`; per logit row (the columns from the first that predicts a completion token on), 2 x
    hidden x vocabulary. Packing wins where prompts are long or
    completions' lengths vary (it drops the repeated prompts and the padding), and loses where a short prompt has
    many completions near the length cap (its rows are G completions long: attention grows with the square)."""
    config = getattr(model, "config", None)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    vocab = getattr(config, "vocab_size", None)
    if not (hidden and layers and vocab):
        return True  # an unknown architecture: the layout that does no padding work
    embeddings = {id(p) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
                  for p in m.parameters()}  # fmt: skip
    weights = sum(p.numel() for p in model.parameters() if id(p) not in embeddings)  # the decoder layers'
    plan, prompt_lengths, lengths, width = pack_plan(prompt_ids, prompt_mask, completion_mask)
    rows, columns = completion_mask.shape[0], prompt_ids.shape[1] + max(lengths, default=0)

    def cost(n_rows: int, row_width: int, logit_rows: int, layout: str) -> float:
        tokens, pairs = n_rows * row_width, n_rows * row_width**2
        attention = 4 * hidden * layers * ATTENTION_WEIGHT[layout]
        return tokens * 2 * weights + pairs * attention + logit_rows * 2 * hidden * vocab

    first = min(prompt_lengths[owner] for owner, _ in plan) - 1  # the logits read start at this column
    packed = cost(len(plan), width, len(plan) * (width - first), "packed")
    padded = cost(rows, columns, rows * (max(lengths, default=0) + 1), "padded")
    return packed < padded


def pack_rows(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    pad_id: int = 0,
    pack_length: int = 512,
) -> PackedRows:
    """Pack left-padded prompts and right-padded completions, each distinct prompt once (see the module doc).

    :param prompt_ids: ``(B, T)`` left-padded
    :param prompt_mask: ``(B, T)`` 1 for prompt tokens
    :param completion_ids: ``(B, C)``
    :param completion_mask: ``(B, C)`` True for the tokens of each completion (a prefix of its row)
    :param pad_id: the id written in padding
    :param pack_length: the target length of a packed row (a row may be longer to hold one prompt + completion)
    """
    device = prompt_ids.device
    plan, prompt_lengths, lengths, width = pack_plan(prompt_ids, prompt_mask, completion_mask, pack_length)

    ids = torch.full((len(plan), width), pad_id, dtype=torch.long, device=device)
    positions = torch.zeros((len(plan), width), dtype=torch.long, device=device)
    segments = torch.full((len(plan), width), PADDING, dtype=torch.long, device=device)
    source = torch.empty(int(sum(lengths)), dtype=torch.long, device=device)
    offsets = [0, *torch.tensor(lengths).cumsum(0).tolist()]  # where each batch row's tokens start in `source`
    for r, (owner, members) in enumerate(plan):
        p = prompt_lengths[owner]
        ids[r, :p] = prompt_ids[owner, prompt_ids.shape[1] - p :]
        positions[r, :p] = torch.arange(p, device=device)
        segments[r, :p] = PROMPT
        column = p
        for row in members:
            n = lengths[row]
            if n == 0:
                continue
            ids[r, column : column + n] = completion_ids[row, :n]
            positions[r, column : column + n] = torch.arange(p, p + n, device=device)
            segments[r, column : column + n] = row
            # token j is predicted by the logits of the token before it: the prompt's last, then its own
            before = torch.arange(column - 1, column + n - 1, device=device)
            before[0] = p - 1
            source[offsets[row] : offsets[row] + n] = r * width + before
            column += n
    return PackedRows(ids, positions, segments, source)


def distinct_rows(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first row of each distinct masked row of ``ids`` ``(B, T)`` and, for every row, which one it repeats.

    Rows are equal when their mask and their ids under the mask are (what padding holds does not matter).

    :return: ``(first, of)``: ``first`` ``(U,)`` indexes the distinct rows in order of appearance, and row ``i``
        repeats row ``first[of[i]]``
    """
    key = torch.cat([ids * mask, mask.to(ids.dtype)], dim=1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)  # (B,): the id of each row's distinct value
    first_of_id = torch.full((int(inverse.max()) + 1,), len(key), dtype=torch.long, device=key.device)
    first_of_id.scatter_reduce_(0, inverse, torch.arange(len(key), device=key.device), reduce="amin")
    first = first_of_id.sort().values  # (U,): in order of appearance
    rank = torch.empty_like(first_of_id)
    rank[inverse[first]] = torch.arange(len(first), device=key.device)
    return first, rank[inverse]
