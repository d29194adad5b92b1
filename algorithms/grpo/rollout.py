"""The data of one GRPO rollout: K groups x G completions, ready for the update."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
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
    :param ref_log_probs: ``(N, C)`` reference log-probs when ``beta > 0``, else ``None``
    """

    prompt_ids: th.Tensor
    prompt_mask: th.Tensor
    completion_ids: th.Tensor
    completion_mask: th.Tensor
    old_log_probs: th.Tensor
    advantages: th.Tensor
    returns: th.Tensor
    ref_log_probs: th.Tensor | None = None

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

    def minibatches(self, batch_size: int, generator: th.Generator) -> Iterator[RolloutBatch]:
        """Shuffled minibatches of at most ``batch_size`` rows (the last one may be smaller)."""
        order = th.randperm(len(self), generator=generator)
        for start in range(0, len(self), batch_size):
            yield self.select(order[start : start + batch_size].to(self.prompt_ids.device))


def _take(value: th.Tensor | None, index: th.Tensor) -> th.Tensor | None:
    return None if value is None else value[index]
