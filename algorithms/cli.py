"""The grpo-gym command line: train, sft, eval, env-demo, tasks, zoo (rl-baselines3-zoo with GRPO registered),
distill, quantize, serve, openenv-serve and vllm-serve."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from algorithms.cli_arguments import (
    PRETRAINED_PRESET,
    add_model_arguments,
    add_train_arguments,
    algorithm_of,
    config_of,
    pretrained_defaults,
)
from algorithms.cli_options import (
    checkpoint_dir,
    main_says,
    next_step,
    progress_callbacks,
    resume_hint,
    resumed_params,
    stop_on_signals,
    torchrun,
    where_it_goes,
)
from algorithms.common.env_util import make_env
from algorithms.common.generation.engines.base import EngineError
from algorithms.common.hyperparams import (
    RUN_KEYS,
    check_keys,
    load_hyperparams,
    parse_overrides,
    preset_key,
)
from algorithms.common.lm_arguments import ENGINE_ARGUMENTS
from algorithms.common.model.finite_state import NonFiniteStateError
from algorithms.deploy.commands import add_deploy_commands
from algorithms.engine_commands import (
    add_engine_commands,
    checkpoint_on_engine_error,
    engine_overrides,
)
from algorithms.eval_commands import add_eval_command
from algorithms.interop_commands import add_interop_commands
from algorithms.task_commands import add_task_commands


def _setup(args: argparse.Namespace, load: Path | None = None) -> tuple[Any, Any, dict[str, Any]]:
    """Read the config, apply the command line, build the env and the model (or ``load`` a saved one into it)."""
    algorithm = algorithm_of(args)
    config = load_hyperparams(config_of(args), args.env, args.preset, parse_overrides(args.hyperparams or []))
    apply_source_flags(args, config)  # --model, --tokenizer, --task, --difficulty, --max-new-tokens
    sharding = {"sharding": args.sharding} if getattr(args, "sharding", None) else {}  # --sharding over the config
    config.update({**sharding, **engine_overrides(args, config)})
    where = f"{config_of(args)} [{preset_key(args.env, args.preset)}] with -params"
    for key, value in config.items():  # a flat name of an earlier version: where it lives now
        moved = algorithm.arguments.moved(key, value)
        if moved is not None:
            raise ValueError(f"{where}: {moved}")
    check_keys(config, _grpo_keys(algorithm), where)
    n_timesteps = int(config.pop("n_timesteps"))
    if getattr(args, "n_timesteps", None) is not None:
        n_timesteps = args.n_timesteps
    config.pop("save_path", None)  # read by train() (preset_save_path)
    env_id, n_envs, env_kwargs = args.env, int(config.pop("n_envs", 1)), config.pop("env_kwargs", {})
    if load is not None:  # the env the checkpoint records (resumed_params has refused a change to it)
        env_id, env_kwargs, n_envs = _recorded_env(load, env_id, env_kwargs, n_envs)
    env = make_env(env_id, n_envs, env_kwargs, args.seed)
    eval_kwargs = {
        "difficulties": config.pop("eval_difficulties", None),
        "n": config.pop("eval_problems", 100),
        "greedy": bool(config.pop("eval_greedy", False)),
        "samples": int(config.pop("eval_samples", 0)),
    }
    if load is not None:  # the engine may change on --resume (a server on another port): the config's and flags'
        engine = {key: config[key] for key in ENGINE_ARGUMENTS if key in config}
        model = algorithm.load(load, env=env, tensorboard_log=args.tensorboard_log, verbose=args.verbose, **sharding,
                               **engine)  # fmt: skip
        return model, env, {"n_timesteps": n_timesteps, **eval_kwargs}
    model = algorithm(
        config.pop("policy", "TransformerPolicy"),
        env,
        seed=args.seed,
        verbose=args.verbose,
        tensorboard_log=args.tensorboard_log,
        **config,
    )
    return model, env, {"n_timesteps": n_timesteps, **eval_kwargs}


def _recorded_env(load: Path, env_id: str, env_kwargs: dict[str, Any], n_envs: int) -> tuple[str, dict, int]:
    """The env id, arguments and count the model file ``load`` records, or the config's when the record needs objects
    a file cannot hold (the config names them: reward functions by import path, say)."""
    from algorithms.common.saving.run_file import recorded_env_kwargs

    try:
        return recorded_env_kwargs(load)
    except ValueError:
        return env_id, env_kwargs, n_envs


def _grpo_keys(algorithm: Any = None) -> set[str]:
    """The keys a preset may hold: the algorithm's (GRPO's) constructor arguments (but what the command line sets)
    and RUN_KEYS."""
    import inspect

    from algorithms import GRPO

    given_by_flags = {"self", "env", "seed", "verbose", "tensorboard_log", "device", "_init_setup_model"}
    return (set(inspect.signature((algorithm or GRPO).__init__).parameters) - given_by_flags) | set(RUN_KEYS)


def apply_source_flags(args: argparse.Namespace, config: dict[str, Any]) -> None:
    """The model, tokenizer and task flags over a preset's ``config`` (in place): ``--model`` the policy's model and,
    unless ``--tokenizer`` names another, the env's tokenizer; ``--difficulty`` the level trained and evaluated at."""
    env_kwargs = dict(config.get("env_kwargs") or {})
    policy_kwargs = dict(config.get("policy_kwargs") or {})
    model, tokenizer = getattr(args, "model", None), getattr(args, "tokenizer", None)
    if model is not None:
        policy_kwargs["model"] = model
        env_kwargs["tokenizer"] = tokenizer if tokenizer is not None else model
    elif tokenizer is not None:
        env_kwargs["tokenizer"] = tokenizer
    for flag, key in (("task", "task"), ("difficulty", "difficulty"), ("max_new_tokens", "max_new_tokens")):
        if getattr(args, flag, None) is not None:
            env_kwargs[key] = getattr(args, flag)
    if getattr(args, "difficulty", None) is not None:
        config["eval_difficulties"] = [args.difficulty]
    if env_kwargs:
        config["env_kwargs"] = env_kwargs
    if policy_kwargs:
        config["policy_kwargs"] = policy_kwargs


def _evaluate(model: Any, env: Any, plan: dict[str, Any], seed: int) -> list[Any]:
    """Held-out results on rank 0 (``[]`` on the others) at the plan's difficulties (the env's when it names none),
    on its ``n`` problems, greedy when it says so; every rank calls it: a sharded policy is gathered."""
    from algorithms.common.evaluation import evaluate_difficulties

    with model.gathered_policy():
        if not model.distributed.is_main:
            return []
        levels = plan["difficulties"] or [float(env.get_attr("difficulty", indices=[0])[0])]
        return evaluate_difficulties(
            model.policy, env, levels, plan["n"], seed=seed, greedy=plan["greedy"], samples=plan["samples"]
        )


def preset_save_path(args: argparse.Namespace) -> str | None:
    """``--save-path``, else the preset's ``save_path`` (the demo's: ``demo.zip``), else ``None`` (not saved); an
    empty ``--save-path`` is kept, for the up-front check to refuse."""
    if args.save_path is not None:
        return args.save_path
    config = load_hyperparams(config_of(args), args.env, args.preset, parse_overrides(args.hyperparams or []))
    return config.get("save_path")


def _start_or_resume(args: argparse.Namespace, directory: Path, say: Any) -> tuple[Any, Any, dict[str, Any]]:
    """A new run (cold start when due, held-out results before GRPO) or the newest checkpoint of ``directory``."""
    from algorithms.common.evaluation import format_table
    from algorithms.common.saving.checkpoints import MODEL, REPLAY, read_run_json, resume_point
    from algorithms.common.saving.checks import check_saved_arguments
    from algorithms.common.saving.run_file import read_saved_run

    if not args.resume:
        model, env, plan = _setup(args)
        say = main_says(model, say)
        model.start_run()  # the logger: the cold start logs to the run
        run: dict[str, Any] = {"total_timesteps": plan["n_timesteps"]}
        started = time.perf_counter()
        if model.needs_cold_start():
            if not model.policy.is_builtin:  # a pretrained model: where it starts, so the cold start's gain shows
                start = _evaluate(model, env, plan, args.eval_seed)
                say(format_table({"before training": start}), flush=True)
                run["start"] = [dataclasses.asdict(r) for r in start]
                started = time.perf_counter()
            say(f"cold start: {model.sft_steps} SFT steps on gold solutions ...", flush=True)
            model.run_cold_start(progress_bar=args.progress_bar and model.distributed.is_main)
        plan["sft_seconds"] = time.perf_counter() - started
        before = _evaluate(model, env, plan, args.eval_seed)
        say(format_table({"before GRPO": before}), flush=True)
        run["before"] = [dataclasses.asdict(r) for r in before]
        return model, env, {**plan, "run": run}
    folder, skipped = resume_point(directory)  # the newest complete one; newer incomplete ones are named
    run = read_run_json(folder)
    try:
        saved = read_saved_run(folder / MODEL)
    except ValueError as error:  # a damaged model.zip: the checkpoint before it may be whole
        moved = f"or move {os.fspath(folder)!r} away to resume from the one before"
        raise ValueError(f"--resume: {error}, {moved}") from None
    from algorithms import LMBaseAlgorithm

    wrote = LMBaseAlgorithm.registered(saved.algorithm)
    if saved.algorithm != algorithm_of(args).__name__:  # the algorithm first: its arguments would differ anyway
        fix = (
            f"resume it with --algo {wrote.algo_name}" if wrote else f"resume it in Python with {saved.algorithm}.load"
        )
        raise ValueError(f"--resume: the checkpoint {os.fspath(folder)!r} is a {saved.algorithm} run: {fix}")
    flags: dict[str, Any] = {}
    apply_source_flags(args, flags)  # the env settings --model, --task, ... name: the run's, or refused
    record = (saved.env or {}).get("record") or {}  # the env arguments the checkpoint records, when it does
    env_record = record.get("kwargs") if isinstance(record.get("kwargs"), dict) else None
    try:  # arguments regrouped as today's names hold an earlier version's; a file lacking some is refused here
        check_saved_arguments(saved, algorithm_of(args), os.fspath(folder / MODEL))
    except ValueError as error:
        raise ValueError(
            f"--resume: {error}, or move {os.fspath(folder)!r} away to resume from the one before"
        ) from None
    taken = resumed_params(args.hyperparams, saved.arguments, run, env_record, flags.get("env_kwargs"))
    model, env, plan = _setup(args, load=folder / MODEL)
    say = main_says(model, say)
    for note in skipped:
        say(note, flush=True)
    if taken:
        say(f"resuming with the saved settings; -params taken: {', '.join(taken)}", flush=True)
    if getattr(model, "replay_buffer", None) is not None:  # a run with replay: its buffer is part of the checkpoint
        if not (folder / REPLAY).is_file():
            raise ValueError(
                f"--resume: {os.fspath(folder)!r} has no {REPLAY} (the replay buffer, which every checkpoint of a run "
                f"with controls_kwargs['replay_ratio'] > 0 holds): restore it, or move {os.fspath(folder)!r} away to "
                "resume from the one before"
            )
        model.load_replay_buffer(folder / REPLAY)
    say(f"resuming from {folder} at {model.num_timesteps} of {run['total_timesteps']} completions", flush=True)
    return model, env, {**plan, "run": run, "sft_seconds": 0.0, "resumed_from": folder}


def train(args: argparse.Namespace) -> int:
    """Cold start (when due), held-out evaluation, GRPO, held-out evaluation again; save and summarise.

    Checkpoints every ``--checkpoint-every`` iterations (the newest two kept); SIGINT / SIGTERM write one and
    exit 130 / 143; ``--resume`` continues from the newest to the same total. With several processes (torchrun)
    every rank trains its groups; rank 0 alone evaluates, prints and saves."""
    from algorithms.common.saving.checkpoints import IterationCheckpoint, check_writable_dir, check_writable_file

    args.save_path = preset_save_path(args)
    save_path = check_writable_file(args.save_path) if args.save_path is not None else None  # before any work
    created = not Path(checkpoint_dir(args)).exists()
    directory = check_writable_dir(checkpoint_dir(args))
    checkpoint = IterationCheckpoint(directory, args.checkpoint_every, run={})
    started = time.perf_counter()
    with stop_on_signals(checkpoint, args.argv) as signals:
        try:
            model, env, plan = _start_or_resume(args, directory, print)
        except KeyboardInterrupt:
            if not signals["code"]:
                raise
            print(f"\nstopped before training started. {next_step(directory, args.argv)}", file=sys.stderr)
            return signals["code"]
        except Exception:  # bad arguments: leave no empty checkpoint folder behind
            if created and not any(directory.iterdir()):
                directory.rmdir()
            raise
        signals["learning"] = 1
        checkpoint.run = plan["run"]
        checkpoint.written = plan.get("resumed_from")  # on disk already: not written again at its boundary
        main = model.distributed.is_main
        say = main_says(model, print)
        total = int(plan["run"]["total_timesteps"])
        say(f"{type(model).__name__}: {total} completions ...", flush=True)
        say(where_it_goes(save_path, directory, args.checkpoint_every), flush=True)
        remaining = max(total - model.num_timesteps, 0)
        callback, bar = progress_callbacks(checkpoint, args.progress_bar and main, type(model).__name__)
        evaluations = None
        if args.eval_every:  # held-out success along the way, its time kept apart
            from algorithms.common.callbacks import HeldOutEvalCallback

            evaluations = HeldOutEvalCallback(
                env, args.eval_every, plan["difficulties"], plan["n"], plan["greedy"], args.eval_seed, say,
                samples=plan["samples"],
            )  # fmt: skip
            callback = [*(callback if isinstance(callback, list) else [callback]), evaluations]
        learning = time.perf_counter()
        with checkpoint_on_engine_error(model, checkpoint, resume_hint(args.argv)):  # a server that died, say
            model.learn(remaining, callback=callback, reset_num_timesteps=False, progress_bar=bar)
    if signals["code"]:
        say(
            f"stopped; checkpoint {checkpoint.save()} ({model.iteration} iterations). {resume_hint(args.argv)}",
            flush=True,
        )
        return signals["code"]
    along = evaluations.seconds if evaluations else 0.0
    grpo_seconds = time.perf_counter() - learning - along
    plan["iterations"] = model.iteration
    after = _evaluate(model, env, plan, args.eval_seed)  # on the run's engine, as before
    model.close_engine()
    if save_path is not None:
        model.save(save_path)  # every rank: a sharded model is gathered to rank 0, which writes
    if not main:
        return 0
    _summarise(args, plan, after, (plan["sft_seconds"], grpo_seconds, time.perf_counter() - started, along))
    print(f"saved to {save_path}; checkpoints: {directory}" if save_path is not None else
          f"the model was not saved (pass --save-path run.zip); checkpoints: {directory}")  # fmt: skip
    if args.tensorboard_log:
        print(shlex.join(["tensorboard", "--logdir", str(args.tensorboard_log)]))  # pasted into a shell as it is
    return 0


def _summarise(args: argparse.Namespace, plan: dict[str, Any], after: list[Any], seconds: tuple[float, ...]) -> None:
    """The held-out table before and after GRPO, each difficulty's change, and the time each stage took (``seconds``:
    the cold start, GRPO, the whole run, the held-out evaluations along the way)."""
    from algorithms.common.evaluation import EvalResult, format_table

    start = [EvalResult(**row) for row in plan["run"].get("start", [])]  # a pretrained model's, before its cold start
    before_grpo = [EvalResult(**row) for row in plan["run"].get("before", [])]  # none in a run.json that lost it
    rows = {"before GRPO": before_grpo, "after GRPO": after}
    print(format_table({"before training": start, **rows} if start else rows))
    firsts = {row.difficulty: row for row in start}
    earlier = {row.difficulty: row for row in before_grpo}
    for later in (row for row in after if row.difficulty in earlier):  # each difficulty measured before GRPO too
        before = earlier[later.difficulty]
        grpo = 100 * (later.success_rate - before.success_rate)
        if later.difficulty in firsts:
            cold = 100 * (before.success_rate - firsts[later.difficulty].success_rate)
            print(
                f"held-out success at difficulty {later.difficulty:.2f}: {cold + grpo:+.1f} percentage points over the "
                f"start (the cold start {cold:+.1f}, GRPO {grpo:+.1f})"
            )
        else:
            print(f"held-out success at difficulty {later.difficulty:.2f}: {grpo:+.1f} percentage points")
    along = f" (held-out evaluations along the way: {seconds[3]:.0f} s)" if seconds[3] else ""
    print(f"time: cold start {seconds[0]:.0f} s, GRPO {seconds[1]:.0f} s, total {seconds[2]:.0f} s{along}")
    print(f"GRPO iterations: {plan['iterations']}")


def sft(args: argparse.Namespace) -> int:
    """The cold-start stage alone; saves the model for grpo-gym eval, or to continue in Python with GRPO.load."""
    from algorithms.common.evaluation import format_table
    from algorithms.common.saving.checkpoints import check_writable_file

    save_path = check_writable_file(args.save_path) if args.save_path is not None else None  # before any work
    model, env, plan = _setup(args)
    model.start_run()
    model.run_cold_start(progress_bar=model.distributed.is_main)  # the command's whole job: show its progress
    results = _evaluate(model, env, plan, args.eval_seed)
    if save_path is not None:
        model.save(save_path)
    if model.distributed.is_main:
        saved = f"saved to {save_path}" if save_path is not None else "not saved (pass --save-path sft.zip)"
        print(format_table({"after SFT": results}) + f"\n{saved}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of grpo-gym."""
    parser = argparse.ArgumentParser(prog="grpo-gym", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    epilog = (
        f"--model without --preset: the '{PRETRAINED_PRESET}' preset of zoo_configs/grpo.yml, defaults fit for a "
        f"pretrained model (a cold start on the task's gold solutions, then GRPO, greedy held-out success): "
        f"{pretrained_defaults()}. Any of them: -params key:value."
    )
    command = commands.add_parser(
        "train", help="cold start (when due) then GRPO; held-out success before and after", epilog=epilog
    )
    add_model_arguments(command)
    add_train_arguments(command)
    command.set_defaults(func=train)
    command = commands.add_parser("sft", help="the cold-start SFT stage alone", epilog=epilog)
    add_model_arguments(command)
    command.set_defaults(func=sft)
    add_eval_command(commands)  # eval
    add_task_commands(commands)  # tasks, env-demo
    zoo = commands.add_parser("zoo", help="rl-baselines3-zoo's train (and -optimize) with GRPO registered")
    zoo.add_argument("zoo_args", nargs=argparse.REMAINDER, help="train [rl_zoo3 train arguments]")
    zoo.set_defaults(func=lambda args: _zoo(args.zoo_args))
    add_deploy_commands(commands)  # distill, quantize, export, serve
    add_interop_commands(commands)  # openenv-serve
    add_engine_commands(commands)  # vllm-serve
    return parser


def _zoo(argv: list[str]) -> int:
    from algorithms.zoo import main as zoo_main

    return zoo_main(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``grpo-gym`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.command in ("train", "sft") and args.model is not None and args.preset is None:
        args.preset = PRETRAINED_PRESET  # your model: defaults fit for a pretrained one
    if getattr(args, "nproc", None):
        return torchrun(args.nproc, list(sys.argv[1:] if argv is None else argv))
    if os.getcwd() not in sys.path:  # "module:function" names resolve from the working folder, as with python -m
        sys.path.insert(0, os.getcwd())
    try:
        return int(args.func(args))
    except ValueError as error:  # a bad config, file or argument: say what to fix, no traceback
        parser.exit(2, f"grpo-gym {args.command}: error: {error}\n")
    except EngineError as error:  # the rollout engine failed (start, server, push): the message names the fix
        parser.exit(1, f"grpo-gym {args.command}: error: {error}\n")
    except NonFiniteStateError as error:  # the weights diverged: stopped before anything was written from them
        parser.exit(1, f"grpo-gym {args.command}: error: {error}\n")


if __name__ == "__main__":
    sys.exit(main())
