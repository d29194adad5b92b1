"""The later turns of multi-turn episodes (tool calls, the env's feedback): played in batches across the envs, each
sampled from the KV cache of the turn before.

Where it sits in the data flow: :meth:`play <algorithms.common.rollout_collection.RolloutCollector.play>` samples the
first turns of all K x G episodes in one batch (keeping its KV cache when the env plays several turns,
:func:`~algorithms.common.env_util.keeps_turn_cache`) and steps them; :func:`play_later_turns` then samples the next
turn of every episode of the chunk still playing in one batch, until all ended. Each later turn continues from the
cache of its episode's last turn and runs only the tokens the env added (the tool result, the feedback): see
:mod:`~algorithms.common.generation.continuation`, which falls back to a fresh prefill for a row whose window
dropped old tokens. What a rollout logs of its turns: :func:`~algorithms.common.rollout.rows.log_turns`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from stable_baselines3.common.vec_env import VecEnv

from algorithms.common.env_util import Obs, stack_obs, step_envs
from algorithms.common.generation.continuation import TurnCache
from algorithms.common.generation.sampler import Completions
from algorithms.common.rollout.rows import contexts_from_obs

#: ``sample(contexts, cache=..., cache_rows=..., keep_cache=...)``: the algorithm's sampler for one turn's batch
Sampler = Callable[..., Completions]
#: ``record(episodes, turn, played, outcome, scope)``: count the step, tell the callback, keep the rows; False stops
Recorder = Callable[..., bool]


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
    episode is not reset (:func:`~algorithms.common.env_util.step_envs`). ``cache``: the KV cache of the
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
