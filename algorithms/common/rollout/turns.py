"""The later turns of multi-turn episodes (tool calls, the env's feedback): played in batches across the envs, each
sampled from the KV cache of the turn before; and what a rollout logs of its turns.

Where it sits in the data flow: :meth:`play <algorithms.common.rollout_collection.RolloutCollector.play>` samples the
first turns of all K x G episodes in one batch (keeping its KV cache when the env plays several turns,
:func:`keeps_turn_cache`) and steps them; :func:`play_later_turns` then samples the next turn of every episode of
the chunk still playing in one batch, until all ended. Each later turn continues from the cache of its episode's
last turn and runs only the tokens the env added (the tool result, the feedback): see
:mod:`~algorithms.common.generation.continuation`, which falls back to a fresh prefill for a row whose window
dropped old tokens. :func:`log_turns` records the tool and turn statistics (``rollout/tool_call_rate``, ...).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.vec_env import VecEnv

from algorithms.common.generation.continuation import TurnCache
from algorithms.common.generation.sampler import Completions
from algorithms.common.rollout.env_steps import Obs, stack_obs, step_envs
from algorithms.common.rollout.rows import Rows, contexts_from_obs
from algorithms.common.runtime.distributed import Distributed

#: ``sample(contexts, cache=..., cache_rows=..., keep_cache=...)``: the algorithm's sampler for one turn's batch
Sampler = Callable[..., Completions]
#: ``record(episodes, turn, played, outcome, scope)``: count the step, tell the callback, keep the rows; False stops
Recorder = Callable[..., bool]


def keeps_turn_cache(setting: bool | str, env: VecEnv) -> bool:
    """Whether rollouts keep the KV cache of each turn for the next (``turn_cache``): ``True``/``False`` as given;
    ``"auto"`` when the env's episodes may have more than one model turn (``max_turns > 1`` or ``tools``; an env
    without ``max_turns`` is taken to play several)."""
    if setting != "auto":
        return bool(setting)
    if not env.has_attr("max_turns"):
        return True
    many = int(env.get_attr("max_turns", indices=[0])[0]) > 1
    return many or (env.has_attr("tools") and env.get_attr("tools", indices=[0])[0] is not None)


def play_later_turns(
    env: VecEnv,
    sample: Sampler,
    record: Recorder,
    context_limit: int,
    episodes: list[int],
    live: list[int],
    obs: list[Obs],
    cache: TurnCache | None,
    rows: list[int],
) -> float | None:
    """The envs ``live`` (their observations ``obs``; env ``live[j]`` plays episode ``episodes[j]``) answer again
    from their new context, one batch per turn, until every episode ended; each env is stepped alone, so an ended
    episode is not reset (:func:`~algorithms.common.rollout.env_steps.step_envs`). ``cache``: the KV cache of the
    turn before, its row ``rows[j]`` for ``episodes[j]`` (``None``: every turn prefilled afresh). The generation
    seconds, or None when ``record`` stopped training."""
    generation_seconds, turn = 0.0, 0
    while live:
        turn += 1
        contexts = contexts_from_obs(stack_obs(obs), context_limit)
        timer = time.perf_counter()
        kept = {"cache": cache, "cache_rows": rows} if cache is not None else {}
        answer = sample(contexts, keep_cache=cache is not None, **kept)
        generation_seconds += time.perf_counter() - timer
        obs, rewards, dones, infos = step_envs(env, live, answer.tokens.cpu().numpy())
        played = contexts, (answer.tokens, answer.mask), answer.log_probs
        if not record(episodes, turn, played, (rewards, dones, infos), locals()):
            return None
        going = [j for j, done in enumerate(dones) if not done]
        live, obs, episodes = [live[j] for j in going], [obs[j] for j in going], [episodes[j] for j in going]
        cache, rows = answer.cache, going
    return generation_seconds


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
