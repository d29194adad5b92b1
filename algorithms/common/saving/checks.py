"""What a model file must hold before anything is built from it (:mod:`~algorithms.common.saving.run_file` reads
it): the run state a run can continue from, the weight entries, arguments the algorithm takes, weights that fit the
model those arguments build. Each refusal names the file, the entry and the fix (use another save)."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import torch as th

from grpo_gym.validation import ArgumentError

#: the run-state counters, each an integer >= 0
COUNTERS = ("num_timesteps", "_n_updates", "_iteration", "_skipped_steps", "_episode_num")


def check_run_state(state: dict[str, Any], rng: dict[str, Any], name: str) -> None:
    """Refuse, naming the file and the entry, a run state that could not be continued: a counter that is not an
    integer >= 0, a progress that is not a number, episode statistics that are not numbers, or random-generator states
    their generators do not take (each tried on a fresh generator, so nothing global changes)."""

    def damaged(key: str, what: str) -> ValueError:
        return ValueError(f"{name}: the run state's {key!r} {what}; the file is damaged: use another save")

    for key in COUNTERS:
        value = state.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise damaged(key, f"must be an integer >= 0, got {value!r:.40}")
    progress = state.get("_current_progress_remaining", 1.0)  # SB3's 1 - done / total: below 0 past the total
    if isinstance(progress, bool) or not isinstance(progress, (int, float)) or not math.isfinite(progress):
        raise damaged("_current_progress_remaining", f"must be a finite number, got {progress!r:.40}")
    if not isinstance(state.get("_cold_start_done", False), bool):
        raise damaged("_cold_start_done", "must be true or false")
    episodes = state.get("ep_info_buffer", [])
    fields = ("r", "l", "t")
    if not isinstance(episodes, list) or not all(
        isinstance(e, dict) and all(isinstance(e.get(k), (int, float)) for k in fields) for e in episodes
    ):
        raise damaged("ep_info_buffer", "must be a list of episodes {'r': return, 'l': length, 't': time}")
    if not isinstance(state.get("ep_success_buffer", []), list):
        raise damaged("ep_success_buffer", "must be a list of true/false")
    tries = {
        "numpy_rng": lambda: np.random.RandomState().set_state(tuple(state["numpy_rng"])),
        "python_rng": lambda: random.Random().setstate((*state["python_rng"][:1], tuple(state["python_rng"][1]),
                                                        *state["python_rng"][2:])),
        "problem_rng": lambda: setattr(np.random.PCG64(), "state", state["problem_rng"]),
        "rng (torch)": lambda: th.Generator().set_state(rng["torch"]),
        "rng (generator)": lambda: th.Generator().set_state(rng["generator"]),
    }  # fmt: skip
    for key, attempt in tries.items():
        try:
            attempt()
        except Exception as error:  # any way a crafted state can fail its generator
            raise damaged(key, f"is not a state its generator takes ({type(error).__name__}: {error})") from None


#: the weight entries every model file holds (a sharded checkpoint's file excepted: its shards hold them)
WEIGHT_ENTRIES = {"policy": "the policy's weights", "policy.optimizer": "the optimizer's state"}


def check_weight_entries(state_dicts: dict[str, Any], name: str) -> None:
    """Refuse, naming the file, the entry and the fix, a model file without the policy's weights or the optimizer's
    state, or with one that is not a dict of tensors (SB3 said only "Names of parameters do not match")."""
    for entry, what in WEIGHT_ENTRIES.items():
        found = state_dicts.get(entry)
        if entry not in state_dicts:
            problem = "has no"
        elif not isinstance(found, dict) or (
            entry == "policy" and not all(isinstance(v, th.Tensor) for v in found.values())
        ):
            problem = f"holds a {type(found).__name__}, not a dict of tensors, in its"
        else:
            continue
        raise ValueError(
            f"{name} {problem} {entry}.pth ({what}): the file was not written whole, or was edited; use another save "
            "(a checkpoint's previous iteration, or the run's --save-path)"
        )


def check_saved_arguments(saved: Any, algorithm: Any, name: str) -> None:
    """Refuse, naming the file and the fix, recorded arguments ``algorithm`` (the class) does not take or whose
    values its rules refuse, and a policy class it does not know, in ``saved`` (a
    :class:`~algorithms.common.saving.run_file.SavedRun`): before anything is built from them."""
    unknown = sorted(set(saved.arguments) - set(algorithm.arguments))
    fix = "the file was written by another version of grpo-gym, or edited: load it with the version that wrote it"
    if unknown:
        raise ValueError(f"{name} records arguments {algorithm.__name__} does not take: {unknown}; {fix}")
    try:
        algorithm.arguments.check(saved.arguments)
    except ArgumentError as error:
        raise ValueError(f"{name}: its recorded arguments are refused ({error}); {fix}, or use another save") from None
    if saved.policy_class not in algorithm.policy_aliases:
        known = ", ".join(algorithm.policy_aliases)
        raise ValueError(f"{name} records the policy class {saved.policy_class!r:.60}, not one of {known}; {fix}")


def check_weights_fit(saved: dict[str, th.Tensor], expected: dict[str, th.Tensor], name: str) -> None:
    """Refuse, naming the file and up to three problems, weights that do not fit the model the file's arguments
    build: missing or unexpected tensors, other shapes, or integers where the model has floats (torch would copy
    them in, rounded)."""
    problems = [f"missing {key!r}" for key in expected if key not in saved]
    problems += [f"unexpected {key!r}" for key in saved if key not in expected]
    for key in saved.keys() & expected.keys():
        mine, theirs = expected[key], saved[key]
        if tuple(mine.shape) != tuple(theirs.shape):
            problems.append(f"{key!r} of shape {tuple(theirs.shape)}, the model's is {tuple(mine.shape)}")
        elif mine.is_floating_point() and not theirs.is_floating_point():
            problems.append(f"{key!r} of {theirs.dtype}, the model's is {mine.dtype}")
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        raise ValueError(
            f"{name}: its policy.pth does not fit the model its arguments describe ({shown}): the weights and the "
            "'data' entry come from different saves, or the file was edited; use another save"
        )
