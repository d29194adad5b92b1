"""The ``grpo-gym`` command line: ``train``, ``sft``, ``eval``, ``env-demo``, ``distill``, ``quantize``, ``serve``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from algorithms.common.hyperparams import DEFAULT_CONFIG, load_hyperparams, parse_overrides
from algorithms.deploy.commands import add_deploy_commands


def _make_env(env_id: str, n_envs: int, env_kwargs: dict[str, Any], seed: int | None) -> Any:
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv

    import grpo_gym  # noqa: F401  (registers R1Zero-v0)

    return make_vec_env(env_id, n_envs=n_envs, seed=seed, env_kwargs=env_kwargs, vec_env_cls=DummyVecEnv)


def _setup(args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any]]:
    """Read the config, apply the command line, build the env and the model."""
    from algorithms import GRPO

    config = load_hyperparams(args.config, args.env, args.preset, parse_overrides(args.hyperparams or []))
    n_timesteps = int(config.pop("n_timesteps"))
    if args.n_timesteps is not None:
        n_timesteps = args.n_timesteps
    env = _make_env(args.env, int(config.pop("n_envs", 1)), config.pop("env_kwargs", {}), args.seed)
    eval_kwargs = {"difficulties": config.pop("eval_difficulties", None), "n": config.pop("eval_problems", 100)}
    model = GRPO(
        config.pop("policy", "TransformerPolicy"),
        env,
        seed=args.seed,
        verbose=args.verbose,
        tensorboard_log=args.tensorboard_log,
        **config,
    )
    return model, env, {"n_timesteps": n_timesteps, **eval_kwargs}


def _evaluate(model: Any, env: Any, difficulties: list[float] | None, n: int, seed: int) -> list[Any]:
    from algorithms.common.evaluation import evaluate_difficulties

    levels = difficulties or [float(env.get_attr("difficulty", indices=[0])[0])]
    return evaluate_difficulties(model.policy, env, levels, n, seed=seed)


def _torchrun(nproc: int, argv: Sequence[str]) -> int:
    """``grpo-gym train --nproc N ...``: the same command under ``torchrun --standalone --nproc_per_node N``."""
    import subprocess

    rest, skip = [], False
    for arg in argv:  # drop --nproc and its value
        if skip or arg == "--nproc":
            skip = not skip
            continue
        if not arg.startswith("--nproc="):
            rest.append(arg)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return subprocess.call([*command, "-m", "algorithms.cli", *rest])


def train(args: argparse.Namespace) -> int:
    """Cold start (when due), held-out evaluation, GRPO, held-out evaluation again; save and summarise.

    With several processes (torchrun) every rank trains its groups; rank 0 alone evaluates, prints and saves."""
    from algorithms.common.evaluation import format_table

    model, env, plan = _setup(args)
    main = model._dist.is_main
    say = print if main else lambda *_, **__: None
    started = time.perf_counter()
    model._setup_learn(0, None, True, "GRPO", False)  # the logger, so the cold start logs to the same run
    if model._needs_cold_start():
        say(f"cold start: {model.sft_steps} SFT steps on gold solutions ...", flush=True)
        model.run_cold_start()
    sft_seconds = time.perf_counter() - started
    rows = {"before GRPO": _evaluate(model, env, plan["difficulties"], plan["n"], args.eval_seed) if main else []}
    say(format_table(rows), flush=True)
    say(f"GRPO: {plan['n_timesteps']} completions ...", flush=True)
    model.learn(plan["n_timesteps"], reset_num_timesteps=False, progress_bar=args.progress_bar and main)
    grpo_seconds = time.perf_counter() - started - sft_seconds
    if not main:
        return 0
    rows["after GRPO"] = _evaluate(model, env, plan["difficulties"], plan["n"], args.eval_seed)
    print(format_table(rows))
    for before, after in zip(rows["before GRPO"], rows["after GRPO"], strict=True):
        change = 100 * (after.success_rate - before.success_rate)
        print(f"held-out success at difficulty {after.difficulty:.2f}: {change:+.1f} percentage points")
    print(
        f"time: cold start {sft_seconds:.0f} s, GRPO {grpo_seconds:.0f} s, total {time.perf_counter() - started:.0f} s"
    )
    if args.save_path:
        model.save(args.save_path)
        print(f"saved to {args.save_path}")
    if args.tensorboard_log:
        print(f"tensorboard --logdir {args.tensorboard_log}")
    return 0


def sft(args: argparse.Namespace) -> int:
    """The cold-start stage alone; saves the model for a later ``train --load`` or ``eval``."""
    from algorithms.common.evaluation import format_table

    model, env, plan = _setup(args)
    model._setup_learn(0, None, True, "GRPO", False)
    model.run_cold_start()
    print(format_table({"after SFT": _evaluate(model, env, plan["difficulties"], plan["n"], args.eval_seed)}))
    if args.save_path:
        model.save(args.save_path)
        print(f"saved to {args.save_path}")
    return 0


def evaluate(args: argparse.Namespace) -> int:
    """Held-out success of a saved model at each ``--difficulty``, as a table."""
    from algorithms import GRPO
    from algorithms.common.evaluation import evaluate_difficulties, format_table

    config = load_hyperparams(args.config, args.env, args.preset, {})
    env = _make_env(args.env, 1, config.get("env_kwargs", {}), args.eval_seed)
    model = GRPO.load(args.model, env=env)
    results = evaluate_difficulties(model.policy, env, args.difficulty, args.n, seed=args.eval_seed, greedy=args.greedy)
    print(format_table({Path(args.model).stem: results}))
    return 0


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


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="rl-zoo3 style YAML (zoo_configs/grpo.yml)")
    parser.add_argument("--env", default="R1Zero-v0", help="env id, a top-level key of the config")
    parser.add_argument("--preset", default=None, help="a preset of the config (e.g. demo); default: the env id's")
    parser.add_argument("--eval-seed", type=int, default=0, help="selects the held-out problems and sampler seed")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``grpo-gym``."""
    parser = argparse.ArgumentParser(prog="grpo-gym", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, func, text in [
        ("train", train, "cold start (when due) then GRPO; prints held-out success before and after"),
        ("sft", sft, "the cold-start SFT stage alone"),
    ]:
        command = commands.add_parser(name, help=text)
        _add_config_arguments(command)
        command.add_argument("--hyperparams", "-params", nargs="*", help="overrides, e.g. learning_rate:1e-5")
        command.add_argument("--n-timesteps", "-n", type=int, default=None, help="completions to train on")
        command.add_argument("--tensorboard-log", "-tb", default=None, help="TensorBoard folder")
        command.add_argument("--seed", type=int, default=0)
        command.add_argument("--save-path", default=None, help="where to save the model (.zip)")
        command.add_argument("--verbose", type=int, default=0)
        command.add_argument("--no-progress-bar", dest="progress_bar", action="store_false")
        command.set_defaults(func=func)
        if name == "train":
            command.add_argument("--nproc", type=int, default=None,
                                 help="train on N processes: runs this command under torchrun (S17)")  # fmt: skip
    ev = commands.add_parser("eval", help="held-out success of a saved model, per difficulty")
    ev.add_argument("model", help="a model saved by `grpo-gym train --save-path`")
    _add_config_arguments(ev)
    ev.add_argument("--difficulty", type=float, nargs="+", default=[0.1, 0.3, 0.5])
    ev.add_argument("--n", type=int, default=100, help="held-out problems per difficulty")
    ev.add_argument("--greedy", action="store_true", help="greedy decoding instead of the policy's sampling")
    ev.set_defaults(func=evaluate)
    demo = commands.add_parser("env-demo", help="show one R1Zero-v0 episode with a gold and a random completion")
    demo.add_argument("--task", default="arithmetic")
    demo.add_argument("--difficulty", type=float, default=0.3)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=env_demo)
    add_deploy_commands(commands, _add_config_arguments)  # distill, quantize, serve (S25-S27)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``grpo-gym`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "nproc", None):
        return _torchrun(args.nproc, list(sys.argv[1:] if argv is None else argv))
    try:
        return int(args.func(args))
    except ValueError as error:  # a bad config, file or argument: say what to fix, no traceback
        parser.exit(2, f"grpo-gym {args.command}: error: {error}\n")


if __name__ == "__main__":
    sys.exit(main())
