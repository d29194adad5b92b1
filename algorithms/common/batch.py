"""Padding and the rollout batch: the tensors of one rollout, one row per completion, ready for an update.

Where it sits in the data flow: the rollout collection (:mod:`~algorithms.common.rollout`) pads the contexts and
completions it gathered into a :class:`RolloutBatch`; the update selects minibatches from it; replay concatenates
replayed rows to it. The cold start and the evaluation pad their prompts with the same :func:`left_pad`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch as th


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
    :param advantages: ``(N,)`` group-relative advantages
    :param returns: ``(N,)`` the discounted return of each row's episode (the value head's target)
    :param groups: ``(N,)`` the group (problem) of each row within its rollout
    :param ref_log_probs: ``(N, C)`` reference log-probs when ``beta > 0``, else ``None``
    :param weights: ``(N,)`` importance-sampling weights of replayed rows (1 for fresh ones), or ``None``: all 1
    :param slots: ``(N,)`` replay-buffer slot of each replayed row, -1 for fresh ones, or ``None``: none replayed
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

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    def select(self, index: th.Tensor) -> RolloutBatch:
        """The rows at ``index``, without the prompt and completion columns that are padding in all of them."""
        rows = {f.name: _take(getattr(self, f.name), index) for f in fields(self)}
        prompt_width = max(int(rows["prompt_mask"].sum(dim=1).max()), 1)
        completion_width = max(int(rows["completion_mask"].sum(dim=1).max()), 1)
        for name in ("prompt_ids", "prompt_mask"):
            rows[name] = rows[name][:, -prompt_width:]
        for name in ("completion_ids", "completion_mask", "old_log_probs", "ref_log_probs"):
            if rows[name] is not None:
                rows[name] = rows[name][:, :completion_width]
        return RolloutBatch(**rows)

    def concat(self, other: RolloutBatch) -> RolloutBatch:
        """This batch's rows, then ``other``'s: prompts left-padded and completions right-padded to common widths;
        rows without ``weights`` get 1 and rows without ``slots`` get -1 when the other batch has them."""
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
            if mine is None or theirs is None:
                raise ValueError(f"cannot concatenate batches where only one has {f.name}")
            if f.name in ("prompt_ids", "prompt_mask"):
                mine, theirs = _pad(mine, prompt_width, left=True), _pad(theirs, prompt_width, left=True)
            elif mine.dim() == 2:
                mine, theirs = _pad(mine, completion_width), _pad(theirs, completion_width)
            rows[f.name] = th.cat([mine, theirs.to(mine.dtype)])
        return RolloutBatch(**rows)


def _take(value: th.Tensor | None, index: th.Tensor) -> th.Tensor | None:
    return None if value is None else value[index]


def _pad(value: th.Tensor, width: int, left: bool = False) -> th.Tensor:
    """``(N, w)`` padded with zeros (False) to ``(N, width)``, on the left or the right."""
    extra = width - value.shape[1]
    if extra == 0:
        return value
    zeros = value.new_zeros((value.shape[0], extra))
    return th.cat([zeros, value] if left else [value, zeros], dim=1)
