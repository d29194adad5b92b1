"""rl-baselines3-zoo with GRPO registered: ``grpo-gym zoo train ...`` or ``python -m algorithms.zoo train ...``.

Runs rl_zoo3's own ``train`` (training, saving, ``-optimize`` hyperparameter search with optuna) after adding
``grpo`` to its algorithms, its hyperparameter sampler and converter. Defaults filled in when not given:
``--algo grpo``, ``--env R1Zero-v0``, ``--conf-file`` the shipped ``zoo_configs/grpo.yml`` (its top-level
``R1Zero-v0`` entry: published GRPO). Needs the ``zoo`` extra (``pip install grpo-gym[zoo]``).

Note that rl_zoo3 evaluates ``-params`` values and string ``policy_kwargs`` with Python's ``eval`` (its own
behaviour); ``grpo-gym train -params`` reads literals only.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

#: the search space of ``-optimize``: a few choices that matter most for GRPO's held-out success
SEARCH_SPACE = {
    "n_groups": [2, 4, 8, 16],
    "group_size": [4, 8, 16],
    "beta": [0.0, 0.01, 0.04],
    "clip_range_high": [0.2, 0.28],
    "loss_aggregation": ["sequence", "token"],
}


def sample_grpo_params(trial: Any, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """rl_zoo3's sampler signature: one trial's GRPO hyperparameters (learning rate on a log scale)."""
    params: dict[str, Any] = {"learning_rate": trial.suggest_float("learning_rate", 1e-6, 1e-3, log=True)}
    for name, choices in SEARCH_SPACE.items():
        params[name] = trial.suggest_categorical(name, choices)
    return params


def register() -> None:
    """Add GRPO to rl_zoo3's algorithms, samplers and converters (idempotent)."""
    try:
        from rl_zoo3 import hyperparams_opt
        from rl_zoo3.utils import ALGOS
    except ImportError as error:
        raise ValueError(f"rl_zoo3 is not installed ({error}): pip install 'grpo-gym[zoo]'") from None
    import grpo_gym  # noqa: F401  (registers R1Zero-v0 in gymnasium's registry, which rl_zoo3 checks)
    from algorithms import GRPO

    ALGOS["grpo"] = GRPO
    hyperparams_opt.HYPERPARAMS_SAMPLER["grpo"] = sample_grpo_params
    hyperparams_opt.HYPERPARAMS_CONVERTER["grpo"] = dict


def with_defaults(argv: Sequence[str]) -> list[str]:
    """rl_zoo3 ``train`` arguments with GRPO's defaults added where the caller gave none."""
    from algorithms.common.hyperparams import DEFAULT_CONFIG

    argv = list(argv)
    given = {arg.split("=")[0] for arg in argv if arg.startswith("-")}
    for flags, value in ((("--algo",), "grpo"), (("--env",), "R1Zero-v0"), (("-conf", "--conf-file"), DEFAULT_CONFIG)):
        if not given & set(flags):
            argv += [flags[-1], str(value)]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    """``zoo train [rl_zoo3 train arguments]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "train":
        raise ValueError("usage: grpo-gym zoo train [rl_zoo3 train arguments, e.g. -n 20000 -optimize]")
    register()
    import rl_zoo3.train

    previous = sys.argv
    sys.argv = ["rl_zoo3.train", *with_defaults(argv[1:])]
    try:
        rl_zoo3.train.train()
    finally:
        sys.argv = previous
    return 0


if __name__ == "__main__":
    sys.exit(main())
