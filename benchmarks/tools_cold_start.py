"""The `tools` preset's cold start, step by step: how soon the built-in tiny model copies the expression into the
calculator call and the tool's result into its answer.

The preset's own cold start (``cold_start_kwargs`` of ``R1Zero-v0-tools`` in
``zoo_configs/grpo.yml``, overridable) runs through :func:`~algorithms.common.cold_start.supervised_finetune`; every
``--every`` steps, on 128 held-out problems at difficulty 0.5, it reports the share whose gold episode (the call, the
tool's result, the answer) greedy decoding reproduces exactly: every model token of the episode is the argmax given
the gold tokens before it (so greedy success is at least this share), for the call turn alone and the answer turn
alone too, and the seconds spent training so far.

    python benchmarks/tools_cold_start.py --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch as th
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from common import cpu_flags, cpu_name, others_share, update_results, usage

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Episodes with tools"
TITLE = "The tools preset's cold start, step by step"
HELD_OUT = 10**6  # problem seeds of the held-out episodes, far from the run's own stream


def held_out_episodes(env: Any, n: int, difficulty: float) -> list[Any]:
    """``n`` gold tool episodes ``(prompt, completion, roles)`` of problems from held-out seeds."""
    from grpo_gym.gold import tool_episode

    inner = env.envs[0].unwrapped
    episodes, seed = [], HELD_OUT
    while len(episodes) < n:
        episode = tool_episode(inner, inner.task.sample_seeded(difficulty, seed))
        seed += 1
        if episode is not None:
            episodes.append(episode)
    return episodes


def greedy_exact(policy: Any, episodes: list[Any]) -> tuple[float, float, float]:
    """The shares of ``episodes`` whose every model token (call turn, answer turn, both) is the policy's argmax
    given the gold tokens before it, with each turn's context as a rollout shows it."""
    from algorithms.common.cold_start import episode_logits
    from grpo_gym.gold import ENV_TOKEN, TURN_END

    with th.no_grad():
        logits, completion_ids, present, roles = episode_logits(policy, episodes)
    right = (logits.argmax(-1) == completion_ids) | ~(present & (roles != ENV_TOKEN))  # env tokens: not the model's
    positions = th.arange(completion_ids.shape[1], device=roles.device)[None]
    first_end = (roles == TURN_END).long().argmax(dim=1, keepdim=True)  # the call turn's EOS
    call = (right | (positions > first_end)).all(dim=1)
    answer = (right | (positions <= first_end)).all(dim=1)
    return (call & answer).float().mean().item(), call.float().mean().item(), answer.float().mean().item()


class CurveLogger:
    """Stands in for the SB3 logger :func:`supervised_finetune` writes to: each ``dump`` measures the held-out
    exact-match shares (the clock stops meanwhile)."""

    def __init__(self, policy: Any, episodes: list[Any]) -> None:
        self.policy, self.episodes, self.rows = policy, episodes, []
        self.values: dict[str, float] = {}
        self.trained_s, self._since = 0.0, time.perf_counter()

    def record(self, key: str, value: float) -> None:
        self.values[key] = value

    def dump(self, step: int) -> None:
        self.trained_s += time.perf_counter() - self._since
        both, call, answer = greedy_exact(self.policy, self.episodes)
        self.rows.append((step, self.trained_s, self.values.get("sft/loss", float("nan")), both, call, answer))
        print(f"step {step}: {self.trained_s:.0f} s, loss {self.rows[-1][2]:.3f}, exact {both:.3f} "
              f"(call {call:.3f}, answer {answer:.3f})", flush=True)  # fmt: skip
        self._since = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    preset = yaml.safe_load((ROOT / "zoo_configs" / "grpo.yml").read_text())["R1Zero-v0-tools"]
    cold = preset["cold_start_kwargs"]
    parser.add_argument("--steps", type=int, default=cold["steps"])
    parser.add_argument("--batch-size", type=int, default=cold["batch_size"])
    parser.add_argument("--learning-rate", type=float, default=cold["learning_rate"])
    parser.add_argument("--every", type=int, default=250, help="steps between measurements")
    parser.add_argument("--held-out", type=int, default=128, help="held-out problems at difficulty 0.5")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", default=None, help="write the table into this RESULTS.md")
    args = parser.parse_args()
    th.set_num_threads(args.threads)

    from stable_baselines3.common.env_util import make_vec_env

    import grpo_gym  # noqa: F401  (registers R1Zero-v0)
    from algorithms import GRPO
    from algorithms.common.cold_start import supervised_finetune

    env = make_vec_env("R1Zero-v0", n_envs=2, env_kwargs=preset["env_kwargs"], seed=args.seed)
    model = GRPO("TransformerPolicy", env, n_groups=1, group_size=2, cold_start=False, mixed_precision="no",
                 policy_kwargs=preset["policy_kwargs"], seed=args.seed)  # fmt: skip
    env.reset()
    curve = CurveLogger(model.policy, held_out_episodes(env, args.held_out, 0.5))
    begin = usage()
    supervised_finetune(model.policy, env, args.steps, args.batch_size, args.learning_rate,
                        generator=model._seeds.generator, logger=curve, log_interval=args.every)  # fmt: skip
    share = others_share(begin, usage())
    lines = ["| SFT step | training s | loss | greedy reproduces the episode | the call turn | the answer turn |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for step, seconds, loss, both, call, answer in curve.rows:
        lines.append(f"| {step} | {seconds:.0f} | {loss:.3f} | {100 * both:.1f}% | {100 * call:.1f}% | "
                     f"{100 * answer:.1f}% |")  # fmt: skip
    body = "\n\n".join(
        [
            f"Command: `python benchmarks/tools_cold_start.py {' '.join(sys.argv[1:])}` ({datetime.date.today()}): "
            f"the preset's cold start, {args.steps} steps of batch {args.batch_size} at learning rate "
            f"{args.learning_rate:g} (cosine to a tenth), seed {args.seed}, on the built-in tiny model; "
            f"{args.held_out} held-out problems at difficulty 0.5.",
            f"Machine: {os.cpu_count()} cores of a {cpu_name()} ({cpu_flags()}), torch threads {args.threads}, "
            f"others' CPU share {100 * share:.0f}%.",
            "\n".join(lines),
        ]
    )
    print(body)
    if args.results:
        update_results(
            Path(args.results), SECTION, f"{TITLE}: batch {args.batch_size}, learning rate {args.learning_rate:g}", body
        )


if __name__ == "__main__":
    main()
