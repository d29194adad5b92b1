"""Held-out success rate: a fixed problem set, sampled completions in one batch, scored by the env in one batch.

The problems come from the task's :meth:`~grpo_gym.tasks.Task.eval_problems`: fresh seeds for procedural tasks,
the eval split (``eval_data=``) for tasks read from data, or their training rows (with a warning) when they have no
eval split; the table's ``source`` column says which.

An env with tools (``R1ZeroEnv(tools=...)``), or a wrapped Gymnasium env (:mod:`grpo_gym.wrappers`), is evaluated on
whole episodes (:func:`play_episodes`): the model calls tools and answers as in training, and success is the
episode's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th

from algorithms.common.env_util import keeps_turn_cache, stack_obs, step_envs
from algorithms.common.rollout.batch import left_pad
from algorithms.common.rollout.rows import contexts_from_obs
from grpo_gym.tasks.base import HELD_OUT_SEED

__all__ = [
    "HELD_OUT_SEED",
    "EvalResult",
    "evaluate_difficulties",
    "evaluate_problems",
    "format_table",
    "held_out_problems",
    "held_out_source",
    "pass_at_k",
    "play_episodes",
]


@dataclass(frozen=True)
class EvalResult:
    """Held-out results at one difficulty."""

    difficulty: float
    n_problems: int
    success_rate: float
    mean_reward: float
    mean_length: float
    source: str = ""  # where the problems came from: "new seeds", "eval split", "training rows"
    samples: int = 0  # K sampled answers per problem (0: none beyond the one answer success_rate scores)
    sampled_success: float | None = None  # the K samples' mean success (pass@1), when samples
    pass_at_k: float | None = None  # the problems at least one of the K samples solves, when samples


def pass_at_k(successes: np.ndarray) -> tuple[float, float]:
    """The sampled success (pass@1) and pass@k of a ``(problems, k)`` grid of successes: the mean over every sample,
    and the share of problems that at least one of their ``k`` samples solves."""
    grid = np.asarray(successes, dtype=bool)
    if grid.ndim != 2 or not grid.size:
        raise ValueError(f"pass_at_k takes a (problems, k) grid of successes, got shape {grid.shape}")
    return float(grid.mean()), float(grid.any(axis=1).mean())


def held_out_problems(env: Any, n: int, difficulty: float, seed: int = 0) -> list[Any]:
    """The task's held-out problems at ``difficulty``, the same set every time (``Task.eval_problems``).

    Procedural tasks: ``n`` problems from seeds ``HELD_OUT_SEED + seed * n + i``; training problems come from the
    env's seeded generator, so they are different draws (a task with a small problem space, one-digit sums, can
    still repeat a problem by content). Tasks read from data: their eval split (at most ``n`` rows eligible at the
    level), or, without one, draws from the training rows with a warning.
    """
    return env.env_method("eval_problems", n, difficulty, seed, indices=[0])[0]


def held_out_source(env: Any) -> str:
    """Where :func:`held_out_problems` takes its problems from (``Task.eval_source``)."""
    return str(env.get_attr("task", indices=[0])[0].eval_source)


def evaluate_problems(
    policy: Any, env: Any, problems: list[Any], seed: int = 0, greedy: bool = False, samples: int = 0
) -> EvalResult:
    """Answer every problem once with the policy's sampling settings (one batch), score each through the env.

    With ``samples=K``, the answer scored in ``success_rate`` is the greedy one, and ``K`` more answers per problem are
    sampled (``K`` batches of the problems, so memory stays that of one): ``sampled_success`` is their mean success
    (pass@1), ``pass_at_k`` the share of problems one of them solves. The gap between ``pass_at_k`` and the greedy
    success is the room reinforcement learning can turn into pass@1.

    :param policy: a :class:`TransformerPolicy`
    :param env: a VecEnv of ``R1ZeroEnv`` (its first env scores)
    :param problems: the problems (see :func:`held_out_problems`)
    :param seed: seeds the sampler, so the same policy gives the same completions
    :param greedy: take the most likely token instead of sampling (with ``samples``: always greedy)
    :param samples: ``K`` sampled answers per problem for pass@k (0: none)
    """
    if not problems:
        raise ValueError("no problems to evaluate: ask for at least one (e.g. --n 100)")
    if samples < 0:
        raise ValueError(f"samples must be 0 (no pass@k) or a count of samples per problem, got {samples}")
    answer = _play_once if plays_episodes(env) else _answer_once
    successes, rewards, lengths = answer(policy, env, problems, seed, greedy or samples > 0)
    result = EvalResult(
        difficulty=float(problems[0].difficulty),
        n_problems=len(problems),
        success_rate=float(np.mean(successes)),
        mean_reward=float(np.mean(rewards)),
        mean_length=float(np.mean(lengths)),
        source=held_out_source(env),
    )
    if not samples:
        return result
    draws = [answer(policy, env, problems, seed + 1 + k)[0] for k in range(samples)]  # other seeds than the first
    sampled, at_k = pass_at_k(np.stack(draws, axis=1))
    return dataclasses.replace(result, samples=samples, sampled_success=sampled, pass_at_k=at_k)


#: per problem: success, reward, tokens written
Answers = tuple[np.ndarray, np.ndarray, np.ndarray]


def _answer_once(policy: Any, env: Any, problems: list[Any], seed: int, greedy: bool = False) -> Answers:
    """Every problem answered once, in one batch, and scored through the env."""
    device = next(policy.parameters()).device
    prompts = []
    for problem in problems:
        prompt, _ = env.env_method("encode_example", problem.prompt_input, "", indices=[0])[0]
        prompts.append(th.as_tensor(prompt[-policy.context_limit :]))
    generator = th.Generator(device=device)
    generator.manual_seed(seed)
    ids, mask = left_pad(prompts, policy.pad_token_id)
    completions = policy.generate(ids.to(device), mask.to(device), generator=generator, greedy=greedy)
    actions = completions.tokens.cpu().numpy()
    env.env_method("score_ahead", problems, list(actions), indices=[0])  # one batch per reward function
    successes, rewards = [], []
    for problem, action in zip(problems, actions, strict=True):
        _, reward, _, _, info = env.env_method("score_completion", problem, action, indices=[0])[0]
        successes.append(bool(info["is_success"]))
        rewards.append(float(reward))
    return np.array(successes), np.array(rewards), completions.lengths.cpu().numpy()


def _play_once(policy: Any, env: Any, problems: list[Any], seed: int, greedy: bool = False) -> Answers:
    """Each problem's episode played to its end, ``n_envs`` episodes at a time (:func:`play_episodes`)."""
    generator = th.Generator(device=next(policy.parameters()).device)
    generator.manual_seed(seed)
    played = []
    for start in range(0, len(problems), env.num_envs):
        played += play_episodes(policy, env, problems[start : start + env.num_envs], generator, greedy)
    return tuple(np.array(column) for column in zip(*played, strict=True))  # type: ignore[return-value]


def plays_episodes(env: Any) -> bool:
    """Whether to evaluate whole episodes: an R1ZeroEnv with tools, or an env that does not score one completion
    alone (no ``score_completion``, e.g. :class:`~grpo_gym.wrappers.LMEnvWrapper`)."""
    if not env.has_attr("score_completion"):
        return True
    try:
        return env.get_attr("tools", indices=[0])[0] is not None
    except AttributeError:
        return False


def play_episodes(
    policy: Any, env: Any, problems: list[Any], generator: th.Generator, greedy: bool = False
) -> list[tuple[bool, float, int]]:
    """Env ``i`` plays ``problems[i]`` (at most ``n_envs`` of them) to the end of the episode; every turn of the
    episodes still playing is sampled in one batch, from the KV cache of the turn before when the env may play
    several turns (:mod:`~algorithms.common.generation.continuation`), and each env is stepped alone
    (``env_method``, so an ended episode is not auto-reset). Per problem: success, the sum of the rewards, the
    tokens the model wrote."""
    device = next(policy.parameters()).device
    keep_cache = keeps_turn_cache("auto", env)
    obs = [env.env_method("reset", options={"problem": p}, indices=[i])[0][0] for i, p in enumerate(problems)]
    live = list(range(len(problems)))
    results = [(False, 0.0, 0) for _ in problems]
    cache, rows = None, None
    while live:
        ids, mask = left_pad(contexts_from_obs(stack_obs(obs), policy.context_limit), policy.pad_token_id)
        turns = {"keep_cache": True, **({"cache": cache, "cache_rows": rows} if cache is not None else {})}
        completions = policy.generate(
            ids.to(device), mask.to(device), generator=generator, greedy=greedy, **(turns if keep_cache else {})
        )
        obs, rewards, dones, infos = step_envs(env, live, completions.tokens.cpu().numpy())
        for j, i in enumerate(live):
            _, total, length = results[i]
            written = int(completions.lengths[j])
            results[i] = (bool(infos[j].get("is_success", False)), total + float(rewards[j]), length + written)
        rows = [j for j, done in enumerate(dones) if not done]
        live, obs, cache = [live[j] for j in rows], [obs[j] for j in rows], completions.cache
    return results


def evaluate_difficulties(
    policy: Any, env: Any, difficulties: list[float], n: int, seed: int = 0, greedy: bool = False, samples: int = 0
) -> list[EvalResult]:
    """:func:`evaluate_problems` on ``n`` held-out problems at each difficulty (``samples``: pass@k too)."""
    return [
        evaluate_problems(policy, env, held_out_problems(env, n, d, seed), seed, greedy, samples) for d in difficulties
    ]


def format_table(rows: dict[str, list[EvalResult]]) -> str:
    """A plain-text table: one line per (label, difficulty); a ``source`` column when the results say where their
    problems came from ("training rows" is a warning sign: no eval split); with pass@k results (``samples``), the
    success column is the greedy one, beside the samples' mean success and pass@k."""
    results = [r for rs in rows.values() for r in rs]
    sources = any(r.source for r in results)
    ks = sorted({r.samples for r in results if r.samples})
    at_k = f"pass@{ks[0]}" if len(ks) == 1 else "pass@k"
    header = f"{'policy':<16}{'difficulty':>11}{'problems':>10}{'greedy' if ks else 'success':>10}"
    header += f"{'sampled':>10}{at_k:>10}" if ks else ""
    header += f"{'reward':>9}{'length':>9}"
    lines = [header + ("  source" if sources else "")]
    for label, rs in rows.items():
        for r in rs:
            line = f"{label:<16}{r.difficulty:>11.2f}{r.n_problems:>10d}{r.success_rate:>10.1%}"
            if ks:
                line += "".join(f"{'-':>10}" if v is None else f"{v:>10.1%}" for v in (r.sampled_success, r.pass_at_k))
            line += f"{r.mean_reward:>9.3f}{r.mean_length:>9.1f}"
            lines.append(line + (f"  {r.source or '-'}" if sources else ""))
    return "\n".join(lines)
