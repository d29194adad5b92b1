"""``grpo-gym eval``: the held-out success of a saved model, or of your model as it is, per difficulty."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from algorithms.cli_arguments import (
    add_algo_argument,
    add_config_arguments,
    add_source_arguments,
    algorithm_of,
    config_of,
)
from algorithms.cli_options import reward_funcs_argument
from algorithms.cli_types import COUNT, DIFFICULTY, Integer
from algorithms.common.env_util import make_env
from algorithms.common.hyperparams import load_hyperparams


def add_eval_command(commands: Any) -> None:
    """Add ``eval`` to the ``grpo-gym`` subcommands ``commands``."""
    ev = commands.add_parser("eval", help="held-out success of a saved model, or of your model, per difficulty")
    ev.add_argument("saved", nargs="?", metavar="model", help="a model saved by grpo-gym train --save-path")
    add_config_arguments(ev, config_default=None)
    add_source_arguments(ev, difficulty=False)
    add_algo_argument(ev)
    ev.add_argument("--difficulty", type=DIFFICULTY, nargs="+", default=[0.1, 0.3, 0.5], help="in [0.1, 1]")
    ev.add_argument("--n", type=COUNT, default=100, help="held-out problems per difficulty")
    ev.add_argument("--greedy", action="store_true", help="greedy decoding instead of the policy's sampling")
    ev.add_argument(
        "--samples", type=Integer(low=0), default=0, metavar="K",
        help="also sample K answers per problem: the greedy success beside the samples' success and pass@K (the "
             "problems one of the K solves: the room reinforcement learning can turn into greedy success)",
    )  # fmt: skip
    ev.add_argument("--eval-data", default=None, help="held-out split of a dataset or jsonl task (a data file)")
    ev.add_argument(
        "--reward-funcs", nargs="+", default=None, metavar="[NAME=]MODULE:FUNCTION",
        help="the run's reward functions, importable from here (a run made in Python with reward_funcs=[...])",
    )  # fmt: skip
    ev.set_defaults(func=evaluate)


def evaluate(args: argparse.Namespace) -> int:
    """Held-out success of a saved model (or of ``--model``: a hub id, folder or .gguf file, as it is) at each
    ``--difficulty``, as a table."""
    from algorithms.common.saving.run_file import recorded_env_kwargs, recorded_tokenizer

    if (args.saved is None) == (args.model is None):
        raise ValueError("eval takes a saved model (grpo-gym eval run.zip) or --model SOURCE, one of the two")
    if args.model is not None:
        return _evaluate_source(args)
    args.model = args.saved
    from algorithms.deploy.loading import saved_algorithm

    # the class the zip records (its default config with --preset), whatever --algo says; a file that cannot be read
    # is named with what is wrong with it (no advice about --config: no config makes it readable)
    algorithm = saved_algorithm(args.model)
    args.algo = algorithm.algo_name
    extra: dict[str, Any] = {"task_kwargs": {"eval_data": args.eval_data}} if args.eval_data is not None else {}
    if args.reward_funcs:
        extra["reward_funcs"] = reward_funcs_argument(args.reward_funcs)
    if args.config is None and args.preset is None:  # the env the model file records
        try:
            env_id, env_kwargs, _ = recorded_env_kwargs(args.model, **extra)
        except ValueError as error:
            raise ValueError(f"{error} (or give the training run's --config / --preset)") from error
    else:
        env_id = args.env
        env_kwargs = dict(load_hyperparams(config_of(args), args.env, args.preset, {}).get("env_kwargs") or {})
        env_kwargs.setdefault("tokenizer", recorded_tokenizer(args.model))  # the run's, as the zip records it
        if "task_kwargs" in extra:  # the held-out split of a dataset / jsonl task
            env_kwargs["task_kwargs"] = {**(env_kwargs.get("task_kwargs") or {}), **extra.pop("task_kwargs")}
        env_kwargs.update(extra)
    try:
        env = make_env(env_id, 1, env_kwargs, args.eval_seed)
    except ValueError as error:
        if args.config is not None or args.preset is not None or extra:  # not the record alone: its own message
            raise
        raise ValueError(
            f"the env {args.model} records could not be built ({error}); the file's env record is damaged: give the "
            "training run's --config / --preset to evaluate on that env instead"
        ) from error
    model = algorithm.load(args.model, env=env, rollout_engine="builtin", read_optimizer=False)  # our sampler
    return _print_results(args, model.policy, env, Path(args.model).stem)


def _evaluate_source(args: argparse.Namespace) -> int:
    """``grpo-gym eval --model SOURCE``: the model as it is (no training), on the env its tokenizer and the flags
    make."""
    env_kwargs = {"tokenizer": args.tokenizer or args.model}
    env_kwargs.update({k: v for k, v in (("task", args.task), ("max_new_tokens", args.max_new_tokens)) if v})
    if args.eval_data is not None:
        env_kwargs["task_kwargs"] = {"eval_data": args.eval_data}
    if args.reward_funcs:
        env_kwargs["reward_funcs"] = reward_funcs_argument(args.reward_funcs)
    env = make_env(args.env, 1, env_kwargs, args.eval_seed)
    model = algorithm_of(args)("TransformerPolicy", env, policy_kwargs={"model": args.model}, cold_start=False)
    return _print_results(args, model.policy, env, Path(args.model).name[:16])


def _print_results(args: argparse.Namespace, policy: Any, env: Any, label: str) -> int:
    """The held-out table of ``policy`` at each ``--difficulty``, ``--n`` problems, greedy or ``--samples``."""
    from algorithms.common.evaluation import evaluate_difficulties, format_table

    results = evaluate_difficulties(
        policy, env, args.difficulty, args.n, seed=args.eval_seed, greedy=args.greedy, samples=args.samples
    )
    print(format_table({label: results}))
    return 0
