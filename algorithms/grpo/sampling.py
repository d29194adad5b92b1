"""What GRPO's rollout samples: DAPO's dynamic sampling that refills, and the completions ``mask_truncated``
leaves out (the learnability-prioritised prompts are :class:`~algorithms.common.replay.prompt_pool.LearnabilityPool`,
which GRPO owns).

Where it sits in the data flow: after the rollout's episodes are played, :meth:`GRPO._after_play
<algorithms.grpo.grpo.GRPO._after_play>` runs :func:`dynamic_sampling`: new problems for the groups whose rewards
are all equal, until none is (or ``max_resample_rounds`` rounds are spent), replacing those groups' rows
(:func:`replace_groups`) before the advantages are computed. The decision is the pure function
:func:`refill_slots`; what the rounds played accumulates in :class:`Refills`.

Several processes: every rank sees every group's outcome (all-gathered), so every rank decides the same rounds and
the same slots; each rank plays the new groups that fall in its own share of the K, with the sampling noise of
their place among all the new groups (so the result does not depend on the number of processes either).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

import torch as th

from algorithms.common.rollout.rows import Rows, episode_returns
from algorithms.grpo import objective


def refill_slots(uniform: Sequence[bool], rounds_done: int, max_rounds: int) -> list[int]:
    """The groups to sample again in the next round: every uniform one while rounds remain, else none."""
    if rounds_done >= max_rounds:
        return []
    return [k for k, flag in enumerate(uniform) if flag]


def dynamic_sampling(
    uniform: Sequence[bool], play: Callable[[list[int]], Sequence[bool] | None], max_rounds: int
) -> tuple[int, int] | None:
    """DAPO's dynamic sampling (Yu et al. 2025, §3.2), refilling: while some group's rewards are all equal and
    fewer than ``max_rounds`` rounds were played, ``play(slots)`` samples a new problem for each of those groups and
    says which new groups are uniform (None: training was stopped meanwhile, and so is the loop). Returns
    ``(rounds played, groups resampled)``, or None when stopped; at most ``max_rounds`` rounds and
    ``max_rounds * K`` groups."""
    uniform = [bool(flag) for flag in uniform]
    rounds = resampled = 0
    while slots := refill_slots(uniform, rounds, max_rounds):
        flags = play(slots)
        if flags is None:
            return None
        for slot, flag in zip(slots, flags, strict=True):
            uniform[slot] = bool(flag)
        rounds, resampled = rounds + 1, resampled + len(slots)
    return rounds, resampled


@dataclass
class Refills:
    """What the refill rounds of one rollout played: every new group's success rate (in the order their problems
    were drawn, the order the prompt pool wants them), the generation seconds, and the rounds so far."""

    rates: list[float] = field(default_factory=list)
    seconds: float = 0.0
    rounds: int = 0


def truncated_rows(rows: Rows, eos_ids: Sequence[int]) -> list[bool]:
    """Which rows are completions cut at ``max_new_tokens`` without EOS: the env's ``info["completion_clipped"]``,
    or, when the env gives none, no EOS among the completion's valid tokens."""
    eos = th.as_tensor(list(eos_ids))
    cut = []
    for tokens, mask, info in zip(rows.tokens, rows.masks, rows.infos, strict=True):
        clipped = info.get("completion_clipped")
        cut.append(bool(clipped) if clipped is not None else not bool(th.isin(tokens[mask.bool()].cpu(), eos).any()))
    return cut


def group_outcomes(rows: Rows, n_groups: int, group_size: int, gamma: float) -> tuple[th.Tensor, th.Tensor]:
    """``(n_groups,)`` whether each group's returns are all equal, and ``(n_groups,)`` its success rate (an episode
    succeeds when one of its turns did)."""
    returns = episode_returns(rows, n_groups * group_size, gamma).view(n_groups, group_size)  # (K, G)
    success = th.zeros(n_groups * group_size)
    for episode, info in zip(rows.episodes, rows.infos, strict=True):
        success[episode] = max(float(success[episode]), float(bool(info.get("is_success"))))
    return objective.uniform_group_mask(returns), success.view(n_groups, group_size).mean(dim=1)  # (K,), (K,)


def replace_groups(rows: Rows, new: Rows, slots: list[int], group_size: int) -> None:
    """Put ``new``'s groups (its episode ``e`` belongs to group ``e // G``) in place of ``rows``' groups ``slots``,
    in place; rows stay ordered by episode, turns in order."""
    gone = set(slots)
    entries = [(e, rows, i) for i, e in enumerate(rows.episodes) if e // group_size not in gone]
    entries += [(slots[e // group_size] * group_size + e % group_size, new, i) for i, e in enumerate(new.episodes)]
    entries.sort(key=lambda entry: entry[0])  # stable: the turns of an episode keep their order
    for name in (f.name for f in fields(Rows)):
        setattr(rows, name, [getattr(source, name)[i] for _, source, i in entries])
    rows.episodes = [episode for episode, _, _ in entries]
