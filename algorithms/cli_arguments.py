"""The options the grpo-gym commands share: the config and its preset, your model and task, the algorithm, and
training's flags; :mod:`algorithms.cli` builds the parser from them."""

from __future__ import annotations

import argparse
from typing import Any

from algorithms.cli_types import COUNT, DIFFICULTY, SEED, SOURCE, VERBOSITY, Integer
from algorithms.common.hyperparams import DEFAULT_CONFIG, default_config, load_hyperparams
from algorithms.engine_commands import add_engine_flags

ITERATIONS = Integer(low=0)  # an interval in iterations, 0 for never


def add_config_arguments(parser: argparse.ArgumentParser, config_default: str | None = str(DEFAULT_CONFIG)) -> None:
    shown = "zoo_configs/grpo.yml" if config_default else "the env the model file records"
    parser.add_argument("--config", default=config_default, help=f"rl-zoo3 style YAML (default: {shown})")
    parser.add_argument("--env", default="R1Zero-v0", help="env id, a top-level key of the config")
    parser.add_argument(
        "--preset", default=None, help="a preset of the config: demo, seed, tools (default: published GRPO)"
    )
    parser.add_argument("--eval-seed", type=SEED, default=0, help="selects the held-out problems and sampler seed")


def add_algo_argument(parser: argparse.ArgumentParser) -> None:
    from algorithms import ALGORITHMS

    names = ", ".join(f"{name} ({cls.__name__}: zoo_configs/{cls.config_file})" for name, cls in ALGORITHMS.items())
    parser.add_argument("--algo", choices=sorted(ALGORITHMS), default="grpo", help=f"the algorithm: {names}")


def algorithm_of(args: argparse.Namespace) -> Any:
    """The class ``--algo`` names (GRPO by default)."""
    from algorithms import ALGORITHMS

    return ALGORITHMS[getattr(args, "algo", "grpo")]


def config_of(args: argparse.Namespace) -> Any:
    """``--config``, or the default config of ``--algo`` when it was left at GRPO's default (or not given)."""
    if args.config in (None, str(DEFAULT_CONFIG)):
        return default_config(algorithm_of(args).config_file)
    return args.config


#: the preset ``--model`` trains with when no ``--preset`` is given: defaults fit for a pretrained model
PRETRAINED_PRESET = "pretrained"


def pretrained_defaults() -> str:
    """The ``pretrained`` preset's settings, one ``key: value`` list, as ``--help`` shows them."""
    try:
        config = load_hyperparams(DEFAULT_CONFIG, "R1Zero-v0", PRETRAINED_PRESET)
    except ValueError:  # an edited or missing config file: --help still works
        return "(zoo_configs/grpo.yml has no 'pretrained' preset)"
    flat = {k: v for k, v in config.items() if not isinstance(v, dict)}
    for name, settings in config.items():  # a settings dict's keys by their place: cold_start_kwargs.steps
        if isinstance(settings, dict):
            flat.update({f"{name}.{key}": value for key, value in settings.items()})
    return ", ".join(f"{key}: {value}" for key, value in flat.items() if key != "policy")


def add_source_arguments(parser: argparse.ArgumentParser, difficulty: bool = True) -> None:
    """``--model``, ``--tokenizer``, ``--task``, ``--difficulty`` and ``--max-new-tokens``: your model and task."""
    add = parser.add_argument
    add("--model", type=SOURCE, default=None, metavar="SOURCE",
        help="your model: a hub id, a folder or a .gguf file, with its own tokenizer; without --preset it trains with "
             f"the '{PRETRAINED_PRESET}' preset (below)")  # fmt: skip
    add(
        "--tokenizer",
        type=SOURCE,
        default=None,
        metavar="SOURCE",
        help="another tokenizer than the model's (hub id, folder, .gguf)",
    )
    add("--task", default=None, help="the task (grpo-gym tasks lists them; default: the preset's, arithmetic)")
    if difficulty:
        add(
            "--difficulty",
            type=DIFFICULTY,
            default=None,
            help="in [0.1, 1], trained and evaluated at (default: preset's)",
        )
    add("--max-new-tokens", type=COUNT, default=None, help="the longest completion, in tokens (default: the preset's)")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    add_source_arguments(parser)
    add_algo_argument(parser)
    parser.add_argument("--hyperparams", "-params", nargs="*", help="overrides, e.g. learning_rate:1e-5 n_groups:8")
    parser.add_argument("--tensorboard-log", "-tb", default=None, help="TensorBoard folder")
    parser.add_argument("--seed", type=SEED, default=0, help="the random seed of the model and the run")
    parser.add_argument("--save-path", default=None, help="where to save the model (.zip)")
    parser.add_argument("--verbose", type=VERBOSITY, default=0, help="1: print the logged values")


def add_train_arguments(command: argparse.ArgumentParser) -> None:
    add = command.add_argument
    add("-n", "--n-timesteps", type=COUNT, default=None, help="completions to train on (default: the preset's)")
    add("--no-progress-bar", dest="progress_bar", action="store_false", help="no progress bar")
    add("--nproc", type=COUNT, default=None, help="train on N processes (the groups spread over them), under torchrun")
    add("--sharding", choices=["fsdp"], default=None, help="shard weights, gradients, optimizer state over processes")
    add("--checkpoint-every", type=ITERATIONS, default=50, help="iterations between checkpoints (0: on a signal only)")
    add("--eval-every", type=ITERATIONS, default=0,
        help="held-out success every N iterations (0: never), printed and logged as eval/success_rate; the GRPO time "
             "printed at the end leaves these evaluations out")  # fmt: skip
    add("--checkpoint-dir", default=None, help="checkpoint folder (default: beside --save-path); the newest 2 kept")
    add("--resume", action="store_true", help="continue from the newest checkpoint to the same total")
    add_engine_flags(command)
