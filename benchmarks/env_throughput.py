"""Scored completions per second of R1Zero-v0 (sequence mode, built-in tokenizer, arithmetic, rule reward).

One completion = one ``reset(options={"problem": p})`` + one
``step()`` of a whole completion, the way GRPO drives the env. The
completions are a fixed mix of gold (correct), wrong-answer and malformed texts, encoded once up front so
the measurement is the env, not the text generator. Run on one core:

    taskset -c 0 python benchmarks/env_throughput.py
"""

from __future__ import annotations

import argparse
import platform
import time

import gymnasium as gym
import numpy as np

import grpo_gym


def completions(env: gym.Env, n: int, seed: int) -> list[tuple[grpo_gym.Problem, np.ndarray]]:
    """``n`` (problem, sequence-mode action) pairs: a third gold, a third wrong answers, a third malformed."""
    core = env.unwrapped
    pairs = []
    for i in range(n):
        core.reset(seed=seed + i)
        reasoning, answer = core.task.solution(core.problem)
        text = [
            f"<think>{reasoning}</think><answer>{answer}</answer>",
            f"<think>{reasoning}</think><answer>{answer}1</answer>",
            f"{reasoning} <answer>{answer}",
        ][i % 3]
        ids = np.append(core.codec.encode(text), core.codec.eos_id)[: core.max_new_tokens]
        action = np.full(core.max_new_tokens, core.codec.pad_id, dtype=np.int64)
        action[: len(ids)] = ids
        pairs.append((core.problem, action))
    return pairs


def measure(env: gym.Env, pairs: list[tuple[grpo_gym.Problem, np.ndarray]], seconds: float) -> tuple[float, float]:
    """Run reset(problem)+step until ``seconds`` pass; returns (completions per second, success rate)."""
    n = successes = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for problem, action in pairs:
            env.reset(options={"problem": problem})
            successes += env.step(action)[4]["is_success"]
        n += len(pairs)
    return n / (time.perf_counter() - start), successes / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    for label, kwargs in [
        ("gym.make (default wrappers)", {}),
        ("R1ZeroEnv (unwrapped)", None),
    ]:
        env_kwargs = {"max_new_tokens": args.max_new_tokens}
        env = gym.make("R1Zero-v0", **env_kwargs) if kwargs is not None else grpo_gym.R1ZeroEnv(**env_kwargs)
        env.reset(seed=0)
        pairs = completions(env, 300, seed=1000)
        measure(env, pairs, 0.5)  # warm-up
        rate, success = measure(env, pairs, args.seconds)
        print(f"{label:30s} {rate:10,.0f} completions/s  (success {success:.2f})")
    print(f"python {platform.python_version()} on {platform.machine()}, {platform.processor() or 'cpu'}")


if __name__ == "__main__":
    main()
