"""``grpo-gym tasks`` and ``grpo-gym env-demo``: what the env offers, before training."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from algorithms.cli_types import DIFFICULTY, SEED


def add_task_commands(commands: Any) -> None:
    """Add ``tasks`` and ``env-demo`` to the ``grpo-gym`` subcommands ``commands``."""
    listing = commands.add_parser("tasks", help="list the tasks, and the reasoning-gym datasets when installed")
    listing.set_defaults(func=tasks)
    demo = commands.add_parser("env-demo", help="show one R1Zero-v0 episode with a gold and a random completion")
    demo.add_argument("--task", default="arithmetic")
    demo.add_argument("--difficulty", type=DIFFICULTY, default=0.3, help="in [0.1, 1]")
    demo.add_argument("--seed", type=SEED, default=0)
    demo.set_defaults(func=env_demo)


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


def tasks(args: argparse.Namespace) -> int:
    """List the built-in tasks and, when reasoning-gym is installed, its datasets with their difficulty mapping."""
    import grpo_gym.tasks as registry
    from grpo_gym.tasks import reasoning_gym

    print("tasks (task=<name>):")
    for name in registry.list_tasks():
        print(f"  {name}")
    print(f"  {reasoning_gym.PREFIX}<dataset>   (the reasoning-gym datasets below)")
    try:
        names = reasoning_gym.dataset_names()
    except ImportError as error:
        print(f"\nreasoning-gym is not installed: {error}")
        return 0
    print(f"\nreasoning-gym datasets ({len(names)}; difficulty -> curriculum levels, or fixed):")
    for name in names:
        try:
            mapping = reasoning_gym.difficulty_mapping(name)
        except Exception as error:  # a family that cannot build its curriculum here
            mapping, note = {}, f"curriculum unavailable ({type(error).__name__})"
        else:
            note = ", ".join(f"{attr} ({levels} levels)" for attr, levels in mapping.items()) or "fixed"
        print(f"  {reasoning_gym.PREFIX}{name:<28} {note}")
    return 0
