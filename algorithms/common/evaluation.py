"""Held-out success rate: a fixed problem set, sampled completions in one batch, scored by the env."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th

from algorithms.common.batch import left_pad

HELD_OUT_SEED = 10**12  # problem seeds start here; training draws its seeds from the env's own generator


@dataclass(frozen=True)
class EvalResult:
    """Held-out results at one difficulty."""

    difficulty: float
    n_problems: int
    success_rate: float
    mean_reward: float
    mean_length: float


def held_out_problems(env: Any, n: int, difficulty: float, seed: int = 0) -> list[Any]:
    """``n`` problems at ``difficulty`` from seeds ``HELD_OUT_SEED + seed * n + i``: the same set every time.

    Training problems come from the env's seeded generator, so they are different draws; a task with a small
    problem space (one-digit sums) can still repeat a problem by content.
    """
    task = env.get_attr("task", indices=[0])[0]
    return [task.sample_seeded(difficulty, HELD_OUT_SEED + seed * n + i) for i in range(n)]


def evaluate_problems(policy: Any, env: Any, problems: list[Any], seed: int = 0, greedy: bool = False) -> EvalResult:
    """Answer every problem once with the policy's sampling settings (one batch), score each through the env.

    :param policy: a :class:`TransformerPolicy`
    :param env: a VecEnv of ``R1ZeroEnv`` (its first env scores)
    :param problems: the problems (see :func:`held_out_problems`)
    :param seed: seeds the sampler, so the same policy gives the same completions
    :param greedy: take the most likely token instead of sampling
    """
    if not problems:
        raise ValueError("no problems to evaluate: ask for at least one (e.g. --n 100)")
    device = next(policy.parameters()).device
    prompts = []
    for problem in problems:
        prompt, _ = env.env_method("encode_example", problem.prompt, "", indices=[0])[0]
        prompts.append(th.as_tensor(prompt[-policy.context_limit :]))
    generator = th.Generator(device=device)
    generator.manual_seed(seed)
    ids, mask = left_pad(prompts, policy.pad_token_id)
    completions = policy.generate(ids.to(device), mask.to(device), generator=generator, greedy=greedy)
    actions = completions.tokens.cpu().numpy()
    successes, rewards = [], []
    for problem, action in zip(problems, actions, strict=True):
        _, reward, _, _, info = env.env_method("score_completion", problem, action, indices=[0])[0]
        successes.append(info["is_success"])
        rewards.append(reward)
    return EvalResult(
        difficulty=float(problems[0].difficulty),
        n_problems=len(problems),
        success_rate=float(np.mean(successes)),
        mean_reward=float(np.mean(rewards)),
        mean_length=float(completions.lengths.float().mean().item()),
    )


def evaluate_difficulties(
    policy: Any, env: Any, difficulties: list[float], n: int, seed: int = 0, greedy: bool = False
) -> list[EvalResult]:
    """:func:`evaluate_problems` on ``n`` held-out problems at each difficulty."""
    return [evaluate_problems(policy, env, held_out_problems(env, n, d, seed), seed, greedy) for d in difficulties]


def format_table(rows: dict[str, list[EvalResult]]) -> str:
    """A plain-text table: one line per (label, difficulty)."""
    lines = [f"{'policy':<14}{'difficulty':>11}{'problems':>10}{'success':>10}{'reward':>9}{'length':>9}"]
    for label, results in rows.items():
        for r in results:
            lines.append(
                f"{label:<14}{r.difficulty:>11.2f}{r.n_problems:>10d}{r.success_rate:>10.1%}"
                f"{r.mean_reward:>9.3f}{r.mean_length:>9.1f}"
            )
    return "\n".join(lines)
