"""What a rollout collects: one row per completion the env scored, the episodes' returns, the rollout's logs and
checks (reward errors, every rank's episode statistics, the turns and tool calls of multi-turn episodes).

Where it sits in the data flow: :meth:`collect_rollouts
<algorithms.common.rollout_collection.RolloutCollector.collect>` samples K problems x G completions in one
batch and steps them through the env(s); every completion the env scored is recorded in :class:`Rows` (one row per
completion, one per turn in multi-turn episodes). The algorithm then turns the rows into returns
(:func:`turn_returns`, once per rollout) and its own advantages, and
:func:`~algorithms.common.rollout.batch.rows_to_batch` makes the tensors of the rows it keeps (the next room,
:mod:`~algorithms.common.rollout.batch`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.utils import safe_mean

from algorithms.common.runtime.distributed import Distributed

#: the outputs a histogram or a text is kept out of (TensorBoard only)
TEXT_ONLY = ("stdout", "log", "json", "csv")


@dataclass
class Rows:
    """What one rollout collected, one entry per completion (per turn in multi-turn episodes)."""

    episodes: list[int] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    contexts: list[th.Tensor] = field(default_factory=list)
    tokens: list[th.Tensor] = field(default_factory=list)
    masks: list[th.Tensor] = field(default_factory=list)
    log_probs: list[th.Tensor] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)

    def add(self, episodes, turn, contexts, completions, log_probs, rewards, infos) -> None:
        """Record the completions the envs of one step scored (row ``i`` is episode ``episodes[i]``)."""
        tokens, masks = completions
        for i, episode in enumerate(episodes):
            self.episodes.append(episode)
            self.turns.append(turn)
            self.contexts.append(contexts[i])
            self.tokens.append(tokens[i])
            self.masks.append(masks[i])
            self.log_probs.append(log_probs[i])
            self.rewards.append(float(rewards[i]))
            self.infos.append(infos[i])

    def first_turns(self) -> list[int]:
        """The rows of each episode's first turn (the problem's own prompt)."""
        return [i for i, turn in enumerate(self.turns) if turn == 0]


def contexts_from_obs(obs: dict[str, np.ndarray], limit: int) -> list[th.Tensor]:
    """The unpadded context of each env's observation, cut to its newest ``limit`` tokens (the policy's memory)."""
    pairs = zip(obs["input_ids"], obs["attention_mask"], strict=True)
    return [th.as_tensor(ids[mask == 1][-limit:]) for ids, mask in pairs]


def returns_to_go(rewards: th.Tensor, gamma: float, mask: th.Tensor) -> th.Tensor:
    """Each turn's discounted return to the end of its episode, ``G_t = sum_{u >= t} gamma^(u - t) r_u`` over the
    turns that happened; column 0 is the episode's return ``sum_t gamma^t r_t`` (turn 0 undiscounted).

    The one discounted-return formula: GRPO scores an episode by ``G_0`` (per-turn credit: each turn by its own
    ``G_t``), the PPO baseline each turn by its ``G_t`` (the original design's gamma: 0.95 for dialogues, 0.99 for
    generation).

    :param rewards: per-turn rewards, shape ``(E, U)``
    :param gamma: discount factor in ``[0, 1]``
    :param mask: ``True`` on the turns that happened, shape ``(E, U)``
    :return: shape ``(E, U)``, 0 on turns that did not happen
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}.")
    if mask.shape != rewards.shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {tuple(rewards.shape)}.")
    played = mask.bool()
    rewards = th.where(played, rewards, 0.0)  # (E, U)
    result = th.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])  # (E,)
    for turn in reversed(range(rewards.shape[1])):  # one step per turn (a handful), vectorised over the episodes
        running = rewards[:, turn] + gamma * running
        result[:, turn] = running
    return th.where(played, result, 0.0)


def turn_returns(rows: Rows, n_episodes: int, gamma: float) -> th.Tensor:
    """``(n_episodes, U)`` each turn's discounted return to the end of its episode over the turns the episode played
    (:func:`returns_to_go`); column 0 holds the episodes' returns, and
    ``[rows.episodes, rows.turns]`` each row's."""
    turn_rewards = th.zeros((n_episodes, max(rows.turns, default=0) + 1))  # (E, U)
    played = th.zeros_like(turn_rewards, dtype=th.bool)
    turn_rewards[rows.episodes, rows.turns] = th.as_tensor(rows.rewards, dtype=th.float32)
    played[rows.episodes, rows.turns] = True
    return returns_to_go(turn_rewards, gamma, played)  # (E, U)


def merge_episode_infos(dist: Distributed, finished: list[tuple[Any, Any]], infos: deque, successes: deque) -> None:
    """Several processes: rank 0's episode statistics (``rollout/ep_rew_mean``, ``success_rate``: SB3's
    ``ep_info_buffer`` and ``ep_success_buffer``, ``infos`` and ``successes`` here) cover every rank's ``finished``
    episodes (Monitor episode, is_success)."""
    if not dist.enabled:
        return
    for rank, episodes in enumerate(dist.gather_objects(finished)):
        if rank == dist.rank:
            continue
        for episode, success in episodes:
            if episode is not None:
                infos.extend([episode])
            if success is not None:
                successes.append(success)


def check_reward_errors(dist: Distributed, rows: Rows, logger: Logger) -> None:
    """Log ``rollout/reward_errors`` (completions whose reward raised, every rank's); when every completion of
    the iteration erred, stop training with that error (the env has warned with each first one)."""
    errors = [info["reward_errors"] for info in rows.infos if info.get("reward_errors")]
    failed, total = dist.sum(float(len(errors))), dist.sum(float(len(rows.infos)))
    logger.record("rollout/reward_errors", failed)
    if total and failed == total:
        component, message = next(iter(errors[0].items())) if errors else ("?", "on another process")
        raise RuntimeError(
            f"the reward of every completion of this iteration raised an error ({component}: {message}); "
            "fix the reward function or verifier (R1ZeroEnv(on_reward_error='raise') shows the traceback)"
        )


def _gathered(dist: Distributed, infos: list[dict[str, Any]], key: str) -> dict[str, list[float]]:
    """Every rank's values of ``info[key][name]`` per name, ``None`` left out (names in first-seen order)."""
    values: dict[str, list[float]] = {}
    for info in infos:
        for name, value in (info.get(key) or {}).items():
            values.setdefault(name, [])
            if value is not None:
                values[name].append(float(value))
    if not dist.enabled:
        return values
    merged: dict[str, list[float]] = {}
    for rank_values in dist.gather_objects(values):  # every rank calls, in the same order
        for name, rank_list in rank_values.items():
            merged.setdefault(name, []).extend(rank_list)
    return merged


def log_rollout(
    logger: Logger,
    dist: Distributed,
    returns: th.Tensor,
    masks: list[th.Tensor],
    infos: list[dict[str, Any]],
    generation_seconds: float,
) -> None:
    """Record what every algorithm logs of a rollout: completion lengths, rewards, each reward component's mean
    (``rollout/reward/<name>``, ``None`` values left out) and what reward functions logged with ``log_metric``
    (``rollout/reward_metric/<name>``), every rank's; generation speed, a histogram of the ``(K, G)`` returns and one
    sample completion as text."""
    lengths = dist.gather(th.stack(masks).sum(dim=1).float())  # every rank's completions
    logger.record("rollout/completion_length", lengths.mean().item())
    logger.record("rollout/reward_mean", returns.mean().item())
    for prefix, key in (("rollout/reward/", "reward_components"), ("rollout/reward_metric/", "reward_metrics")):
        for name, values in _gathered(dist, infos, key).items():
            if values:  # every value None (not applicable): nothing to log
                logger.record(prefix + name, safe_mean(values))
    logger.record("time/tokens_per_second", lengths.sum().item() / max(generation_seconds, 1e-9))
    logger.record("rollout/rewards", returns.flatten().cpu().numpy(), exclude=TEXT_ONLY)
    sample = infos[0]
    text = f"reward {sample.get('reward_components')}\n\n{sample.get('completion', '')}"
    logger.record("samples/completion", text, exclude=TEXT_ONLY)


def turn_statistics(rows: Rows) -> dict[str, Any] | None:
    """What a rollout's turns tell (None when every episode was played in one turn without tools): the share of
    model turns that called a tool, the share of calls that failed, the model turns per episode, and the success
    rate of the episodes by their number of model turns (``{turns: (successes, episodes)}``)."""
    tools = any("tool_calls" in info for info in rows.infos)
    if not tools and not any(rows.turns):
        return None
    calls = [info.get("tool_calls") or [] for info in rows.infos]
    made = sum(len(c) for c in calls)
    failed = sum(1 for c in calls for record in c if "error" in record)
    last: dict[int, tuple[int, bool]] = {}  # episode -> (its last turn, its success)
    for episode, turn, info in zip(rows.episodes, rows.turns, rows.infos, strict=True):
        if turn >= last.get(episode, (-1, False))[0]:
            last[episode] = (turn, bool(info.get("is_success")))
    by_turns: dict[int, list[int]] = {}
    for turn, success in last.values():
        counts = by_turns.setdefault(turn + 1, [0, 0])
        counts[0] += int(success)
        counts[1] += 1
    return {
        "turns": len(rows.turns),
        "tool_turns": sum(1 for c in calls if c),
        "calls": made,
        "failed_calls": failed,
        "episodes": len(last),
        "by_turns": {n: tuple(c) for n, c in by_turns.items()},
        "tools": tools,
    }


def log_turns(logger: Logger, dist: Distributed, rows: Rows) -> None:
    """Record, over every rank's episodes, ``rollout/tool_call_rate`` (model turns that called a tool / model turns),
    ``rollout/tool_error_rate`` (failed calls / calls; not logged without calls), ``rollout/turns_per_episode`` and
    ``rollout/success_by_turns/<n>`` (the success rate of the episodes that ended after ``n`` model turns); nothing
    for single-turn episodes without tools."""
    stats = [s for s in (dist.gather_objects(turn_statistics(rows)) if dist.enabled else [turn_statistics(rows)]) if s]
    if not stats:
        return
    turns, episodes = sum(s["turns"] for s in stats), sum(s["episodes"] for s in stats)
    if any(s["tools"] for s in stats):
        logger.record("rollout/tool_call_rate", sum(s["tool_turns"] for s in stats) / max(turns, 1))
        calls = sum(s["calls"] for s in stats)
        if calls:
            logger.record("rollout/tool_error_rate", sum(s["failed_calls"] for s in stats) / calls)
    logger.record("rollout/turns_per_episode", turns / max(episodes, 1))
    merged: dict[int, np.ndarray] = {}
    for s in stats:
        for n, counts in s["by_turns"].items():
            merged[n] = merged.get(n, np.zeros(2)) + np.asarray(counts)
    for n, (successes, count) in sorted(merged.items()):
        logger.record(f"rollout/success_by_turns/{n}", float(successes / count))
