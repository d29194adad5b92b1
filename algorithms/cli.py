"""The ``grpo-gym`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np


def env_demo(args: argparse.Namespace) -> int:
    """Play one gold and one random completion through R1Zero-v0 and print what the env says."""
    import gymnasium as gym

    import grpo_gym  # noqa: F401  (registers R1Zero-v0)

    env = gym.make("R1Zero-v0", task=args.task, difficulty=args.difficulty, render_mode="ansi")
    core = env.unwrapped
    for label in ("gold", "random"):
        env.reset(seed=args.seed)
        if label == "gold":
            reasoning, answer = core.task.solution(core.problem)
            ids = core.codec.encode(f"<think>{reasoning}</think><answer>{answer}</answer>")
            ids = np.concatenate([ids, [core.codec.eos_id]])[: core.max_new_tokens]
            action = np.full(core.max_new_tokens, core.codec.pad_id, dtype=np.int64)
            action[: len(ids)] = ids
        else:
            action = env.action_space.sample()
        _, reward, terminated, truncated, info = env.step(action)
        print(f"=== {label} completion ===")
        print(env.render())
        print(f"--- reward {reward:.3f}  components {info['reward_components']}  success {info['is_success']}")
        print(f"--- reasons {info['reward_reasons']}  terminated {terminated}  truncated {truncated}\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo-gym", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("env-demo", help="show one R1Zero-v0 episode with a gold and a random completion")
    demo.add_argument("--task", default="arithmetic")
    demo.add_argument("--difficulty", type=float, default=0.3)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=env_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``grpo-gym`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
