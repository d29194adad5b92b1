"""What an update trains on: the tensors of the rows a rollout keeps (:class:`RolloutBatch`, one row per
completion), made from the rollout's :class:`~algorithms.common.rollout.rows.Rows` by :func:`rows_to_batch`, and
cut into :func:`minibatches`.

Where it sits in the data flow: after the rollout collection (:mod:`~algorithms.common.rollout.rows`) the
algorithm's ``_build_batch`` pads the contexts and completions it keeps into a :class:`RolloutBatch`; the update
selects minibatches from it; replay concatenates replayed rows to it. The cold start and the evaluation pad their
prompts with the same :func:`left_pad`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields

import torch as th

from algorithms.common.losses import sampler_kl
from algorithms.common.rollout.rows import Rows
from algorithms.common.runtime.distributed import Distributed


def left_pad(rows: Sequence[th.Tensor], pad_id: int) -> tuple[th.Tensor, th.Tensor]:
    """Stack 1-D token tensors into ``(N, T)`` ids and mask, left-padded (the newest token last)."""
    width = max(1, max(len(row) for row in rows))
    ids = th.full((len(rows), width), pad_id, dtype=th.long)
    mask = th.zeros((len(rows), width), dtype=th.long)
    for i, row in enumerate(rows):
        if len(row):
            ids[i, -len(row) :] = row
            mask[i, -len(row) :] = 1
    return ids, mask


def right_pad(rows: Sequence[th.Tensor], pad_id: int) -> tuple[th.Tensor, th.Tensor]:
    """Stack 1-D token tensors into ``(N, C)`` ids and a bool mask, right-padded (completions)."""
    width = max(len(row) for row in rows)
    ids = th.full((len(rows), width), pad_id, dtype=th.long)
    mask = th.zeros((len(rows), width), dtype=th.bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = True
    return ids, mask


@dataclass
class RolloutBatch:
    """One row per completion (one per turn for multi-turn episodes); all tensors share the first dim ``N``.

    :param prompt_ids: ``(N, T)`` the context each completion was sampled from, left-padded
    :param prompt_mask: ``(N, T)``
    :param completion_ids: ``(N, C)`` sampled tokens, pad after EOS
    :param completion_mask: ``(N, C)`` bool, True up to and including EOS
    :param old_log_probs: ``(N, C)`` log-probs at sampling time (the importance-ratio denominator)
    :param advantages: ``(N,)`` group-relative advantages, or ``(N, C)`` per token (PPO's GAE)
    :param returns: ``(N,)`` the discounted return of each row's episode (the value head's target), or ``(N, C)``
        per token (PPO's GAE returns)
    :param groups: ``(N,)`` the group (problem) of each row within its rollout
    :param ref_log_probs: ``(N, C)`` reference log-probs when ``beta > 0``, else ``None``
    :param weights: ``(N,)`` importance-sampling weights of replayed rows (1 for fresh ones), or ``None``: all 1
    :param slots: ``(N,)`` replay-buffer slot of each replayed row, -1 for fresh ones, or ``None``: none replayed
    :param values: ``(N, C)`` the value head's per-token estimates at sampling time (PPO), or ``None``
    :param sampler_weights: ``(N, C)`` the sampler correction's per-token weights
        (:func:`~algorithms.common.sampler_correction.truncated_importance_weights`; ``old_log_probs`` are then the
        update's own log-probs before its first step), or ``None``: no correction, ``old_log_probs`` are the
        sampler's
    """

    prompt_ids: th.Tensor
    prompt_mask: th.Tensor
    completion_ids: th.Tensor
    completion_mask: th.Tensor
    old_log_probs: th.Tensor
    advantages: th.Tensor
    returns: th.Tensor
    groups: th.Tensor
    ref_log_probs: th.Tensor | None = None
    weights: th.Tensor | None = None
    slots: th.Tensor | None = None
    values: th.Tensor | None = None
    sampler_weights: th.Tensor | None = None

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    def select(self, index: th.Tensor) -> RolloutBatch:
        """The rows at ``index``, without the prompt and completion columns that are padding in all of them."""
        rows = {f.name: _take(getattr(self, f.name), index) for f in fields(self)}
        prompt_width = max(int(rows["prompt_mask"].sum(dim=1).max()), 1)
        completion_width = max(int(rows["completion_mask"].sum(dim=1).max()), 1)
        for name in ("prompt_ids", "prompt_mask"):
            rows[name] = rows[name][:, -prompt_width:]
        for name, value in rows.items():  # every other 2-D tensor is per completion token: (n, C)
            if value is not None and value.dim() == 2 and name not in ("prompt_ids", "prompt_mask"):
                rows[name] = value[:, :completion_width]
        return RolloutBatch(**rows)

    def concat(self, other: RolloutBatch) -> RolloutBatch:
        """This batch's rows, then ``other``'s: prompts left-padded and completions right-padded to common widths;
        rows without ``weights`` get 1, rows without ``slots`` -1 and rows without ``sampler_weights`` 1 (no
        correction) when the other batch has them."""
        prompt_width = max(self.prompt_ids.shape[1], other.prompt_ids.shape[1])
        completion_width = max(self.completion_ids.shape[1], other.completion_ids.shape[1])
        rows = {}
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if mine is None and theirs is None:
                rows[f.name] = None
                continue
            if f.name in ("weights", "slots"):
                fill = 1.0 if f.name == "weights" else -1
                mine = th.full((len(self),), fill, device=theirs.device) if mine is None else mine
                theirs = th.full((len(other),), fill, device=mine.device) if theirs is None else theirs
            if f.name == "sampler_weights":
                mine = self.completion_mask.to(theirs.dtype) if mine is None else mine
                theirs = other.completion_mask.to(mine.dtype) if theirs is None else theirs
            if mine is None or theirs is None:
                raise ValueError(f"cannot concatenate batches where only one has {f.name}")
            if f.name in ("prompt_ids", "prompt_mask"):
                mine, theirs = _pad(mine, prompt_width, left=True), _pad(theirs, prompt_width, left=True)
            elif mine.dim() == 2:
                mine, theirs = _pad(mine, completion_width), _pad(theirs, completion_width)
            rows[f.name] = th.cat([mine, theirs.to(mine.dtype)])
        return RolloutBatch(**rows)


def rows_to_batch(
    rows: Rows,
    keep: list[int],
    advantages: th.Tensor,
    returns: th.Tensor,
    groups: th.Tensor,
    pad_id: int,
    device: th.device,
    row_advantages: th.Tensor | None = None,
    row_returns: th.Tensor | None = None,
) -> RolloutBatch:
    """The rows at ``keep`` as a batch; ``advantages``, ``returns`` and ``groups`` are per episode ``(E,)``, every
    turn of an episode getting its episode's; ``row_advantages`` and ``row_returns`` ``(N,)``, one per row of
    ``rows``, replace them when given (per-turn credit)."""
    prompt_ids, prompt_mask = left_pad([rows.contexts[i] for i in keep], pad_id)
    episodes = [rows.episodes[i] for i in keep]
    return RolloutBatch(
        prompt_ids=prompt_ids.to(device),
        prompt_mask=prompt_mask.to(device),
        completion_ids=th.stack([rows.tokens[i] for i in keep]),
        completion_mask=th.stack([rows.masks[i] for i in keep]),
        old_log_probs=th.stack([rows.log_probs[i] for i in keep]),
        advantages=(advantages[episodes] if row_advantages is None else row_advantages[keep]).to(device),
        returns=(returns[episodes] if row_returns is None else row_returns[keep]).to(device),
        groups=groups[episodes].to(device),
    )


def _take(value: th.Tensor | None, index: th.Tensor) -> th.Tensor | None:
    return None if value is None else value[index]


def _pad(value: th.Tensor, width: int, left: bool = False) -> th.Tensor:
    """``(N, w)`` padded with zeros (False) to ``(N, width)``, on the left or the right."""
    extra = width - value.shape[1]
    if extra == 0:
        return value
    zeros = value.new_zeros((value.shape[0], extra))
    return th.cat([zeros, value] if left else [value, zeros], dim=1)


def minibatches(
    batch: RolloutBatch,
    batch_size: int | None,
    sequential: bool,
    aggregation: str,
    generator: th.Generator,
    dist: Distributed,
    placeholder: bool = False,
) -> Iterator[tuple[RolloutBatch, float]]:
    """Shuffled minibatches of ``batch_size`` rows (``None``: the whole batch), or one group after the other
    (``sequential``: sequential per-group updates).

    Each comes with its ``share``: the part of the whole job's minibatch (all ranks) it holds, by rows, or by
    tokens with ``aggregation="token"``; the loss is weighted by it, so the gradients summed over the ranks are
    those of the job's minibatch. Every rank yields the same number of minibatches; a ``placeholder`` batch
    (this rank's groups all left out) has share 0."""
    if sequential:
        groups = sorted(set().union(*dist.gather_objects(set(th.unique(batch.groups).tolist()))))
        parts = [(batch.groups == group).nonzero().squeeze(1) for group in groups]
    else:
        size = batch_size or len(batch)
        count = int(dist.sum(-(-len(batch) // size)) // dist.world_size) if dist.enabled else None
        order = th.randperm(len(batch), generator=generator).to(batch.prompt_ids.device)
        parts = list(order.split(size)) if count is None else list(order.tensor_split(max(count, 1)))
    for rows in parts:
        part = batch.select(rows) if len(rows) else batch.select(th.zeros(1, dtype=th.long, device=rows.device))
        if not len(rows) or placeholder:
            amount = 0.0
        else:
            amount = float(part.completion_mask.sum() if aggregation == "token" else len(rows))
        yield part, amount / max(dist.sum(amount), 1e-12)


def rows_with_gradient(minibatch: RolloutBatch) -> RolloutBatch:
    """The rows of ``minibatch`` whose advantage is not zero (every row of a group whose rewards are all equal has a
    zero one). In a loss with no KL, entropy or value term such a row adds exactly zero to the loss and its gradient,
    so the update leaves it out of the forward and backward passes and weights the rest's loss by
    :func:`loss_share`. At least one row stays, so a minibatch of uniform groups still steps the optimizer with its
    zero gradient (weight decay and Adam's moments move as they would). The minibatch itself when every row counts.
    """
    advantages = minibatch.advantages if minibatch.weights is None else minibatch.advantages * minibatch.weights
    informative = advantages != 0 if advantages.dim() == 1 else (advantages != 0).any(dim=-1)  # (B,)
    if bool(informative.all()):
        return minibatch
    if not bool(informative.any()):
        informative[0] = True
    return minibatch.select(informative.nonzero().squeeze(1))


def loss_share(part: RolloutBatch, whole: RolloutBatch, aggregation: str) -> float:
    """``part``'s share of ``whole``'s loss aggregation: its tokens' share with ``"token"``, its rows' otherwise (the
    ``"sequence"`` and ``"constant"`` modes divide by the number of rows)."""
    if aggregation == "token":
        return float(part.completion_mask.sum()) / max(float(whole.completion_mask.sum()), 1.0)
    return len(part) / max(len(whole), 1)


def sampler_kl_of_fresh(minibatch: RolloutBatch, log_probs: th.Tensor) -> th.Tensor:
    """:func:`~algorithms.common.losses.sampler_kl` of a minibatch's fresh rows from the update's ``(B, C)``
    log-probs of it, taken before any step (replayed rows were sampled by older weights: not the sampler's
    mismatch)."""
    mask = minibatch.completion_mask  # (B, C)
    if minibatch.slots is not None:
        mask = mask & (minibatch.slots < 0).unsqueeze(1)
    return sampler_kl(log_probs, minibatch.old_log_probs, mask)
