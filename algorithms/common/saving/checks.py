"""What a model file must hold before anything is built from it (:mod:`~algorithms.common.saving.run_file` reads
it): the run state a run can continue from, the weight entries, arguments the algorithm takes, weights that fit the
model those arguments build. Each refusal names the file, the entry and the fix (use another save)."""

from __future__ import annotations

import inspect
import math
import random
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch as th

from algorithms.common.saving.model_file import FORMAT
from grpo_gym.validation import ArgumentError, user_stacklevel

#: the fix for weights a file holds that no save writes (a NaN, a damaged optimizer state)
DAMAGED_FIX = (
    "the file was edited or damaged: use another save (a checkpoint's previous iteration, or the run's --save-path)"
)
#: the run-state counters, each an integer >= 0 (GRPO's ``_groups_seen`` too, when the file has it)
COUNTERS = ("num_timesteps", "_n_updates", "_iteration", "_skipped_steps", "_episode_num", "_groups_seen")
#: the largest a counter may be (2**53: exact in JSON and in a float; more than any run makes)
MOST_COUNT = 2**53
#: the largest an episode statistic may be in magnitude (a return, a length, a time)
MOST_STATISTIC = 1e15


def check_run_state(state: dict[str, Any], rng: dict[str, Any], name: str) -> None:
    """Refuse, naming the file and the entry, a run state that could not be continued: a counter that is not an
    integer >= 0, a progress that is not a number, episode statistics that are not numbers, or random-generator states
    their generators do not take (each tried on a fresh generator, so nothing global changes)."""

    def damaged(key: str, what: str) -> ValueError:
        return ValueError(f"{name}: the run state's {key!r} {what}; the file is damaged: use another save")

    for key in COUNTERS:
        value = state.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MOST_COUNT:
            raise damaged(key, f"must be an integer in [0, 2**53], got {value!r:.40}")
    variance = state.get("_between_variance", 0.0)  # GRPO's adaptive competition: a NaN would pin its coefficient
    if isinstance(variance, bool) or not isinstance(variance, (int, float)) or not 0 <= variance < math.inf:
        raise damaged("_between_variance", f"must be a finite number >= 0, got {variance!r:.40}")
    progress = state.get("_current_progress_remaining", 1.0)  # SB3's 1 - done / total: below 0 past the total
    if isinstance(progress, bool) or not isinstance(progress, (int, float)) or not math.isfinite(progress):
        raise damaged("_current_progress_remaining", f"must be a finite number, got {progress!r:.40}")
    if not isinstance(state.get("_cold_start_done", False), bool):
        raise damaged("_cold_start_done", "must be true or false")
    episodes = state.get("ep_info_buffer", [])
    fields = ("r", "l", "t")
    if not isinstance(episodes, list) or not all(
        isinstance(e, dict) and all(_statistic(e.get(k)) for k in fields) for e in episodes
    ):
        raise damaged(
            "ep_info_buffer", "must be a list of episodes {'r': return, 'l': length, 't': time}, each a finite number"
        )
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


def _statistic(value: Any) -> bool:
    """A finite episode statistic of a sane size (an int of 400 digits would overflow the float mean)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return (isinstance(value, int) or math.isfinite(value)) and abs(value) <= MOST_STATISTIC


def check_env_states(states: Any, env: Any, name: str) -> None:
    """Refuse, naming the file and the entry, recorded env states that do not fit ``env`` (a VecEnv): not one per
    env, or one its env refuses; each accepted one is applied (``set_state`` checks a whole state before it applies
    any of it). ``load`` calls it for the env it rebuilt from the file (a damaged file fails there, not in the middle
    of ``learn``), and training's start again, after SB3's reset, for whichever env the model then has."""
    if states is None or env is None:
        return
    if not isinstance(states, list) or len(states) != env.num_envs:
        shown = f"a list of {len(states)}" if isinstance(states, list) else f"a {type(states).__name__}"
        raise ValueError(
            f"{name}: the run state's 'env_states' is {shown}, not one state per env ({env.num_envs}): the file is "
            "damaged (use another save), or the env is not the one it was saved with"
        )
    if not env.has_attr("set_state"):
        return
    for index, state in enumerate(states):
        try:
            env.env_method("set_state", state, indices=[index])
        except (ValueError, TypeError) as error:
            raise ValueError(
                f"{name}: the run state's 'env_states'[{index}] does not fit the env ({error}); use another save, or "
                "load it with the env it was saved with"
            ) from None


#: the weight entries every model file holds (a sharded checkpoint's file excepted: its shards hold them)
WEIGHT_ENTRIES = {"policy": "the policy's weights", "policy.optimizer": "the optimizer's state"}
#: the weight entry a model file holds when its run has a frozen reference (``beta`` > 0, no LoRA)
REFERENCE_ENTRY = {"ref_model": "the frozen reference's weights"}


def check_weight_entries(state_dicts: dict[str, Any], name: str, reference: bool = False) -> None:
    """Refuse, naming the file, the entry and the fix, a model file without the policy's weights or the optimizer's
    state (or the reference's, when it records that its run keeps one: ``reference``), or with one (or a reference's
    weights) that is not a dict of tensors (SB3 said only "Names of parameters do not match", torch "Expected
    state_dict to be dict-like")."""
    entries = {**WEIGHT_ENTRIES, **(REFERENCE_ENTRY if reference or "ref_model" in state_dicts else {})}
    for entry, what in entries.items():
        found = state_dicts.get(entry)
        if entry not in state_dicts:
            problem = "has no"
        elif not isinstance(found, dict) or (
            entry != "policy.optimizer" and not all(isinstance(v, th.Tensor) for v in found.values())
        ):
            problem = f"holds a {type(found).__name__}, not a dict of tensors, in its"
        else:
            continue
        raise ValueError(f"{name} {problem} {entry}.pth ({what}): {DAMAGED_FIX}")


def check_saved_arguments(saved: Any, algorithm: Any, name: str, overrides: Mapping[str, Any] | None = None) -> None:
    """Refuse, naming the file and the fix, recorded arguments ``algorithm`` (the class) does not take or whose
    values its rules refuse, and a policy class it does not know, in ``saved`` (a
    :class:`~algorithms.common.saving.run_file.SavedRun`), and what a file of its format lacks
    (:func:`check_complete`): before anything is built from them. ``overrides``: what ``load`` was given over them (a
    retired argument is read as the run it is loaded into)."""
    try:  # a file of an earlier version: its flat names (vllm_mode, sft_steps, ...) go into their settings dicts
        saved.arguments = algorithm.arguments.regrouped(saved.arguments, f"{name}: ", overrides)
    except ArgumentError as error:
        raise ValueError(f"{error}; the file was edited: use another save") from None
    unknown = sorted(set(saved.arguments) - set(algorithm.arguments))
    fix = "the file was written by another version of grpo-gym, or edited: load it with the version that wrote it"
    if unknown:
        raise ValueError(f"{name} records arguments {algorithm.__name__} does not take: {unknown}; {fix}")
    try:  # each value by its rule; what they mean together is checked once load's overrides are in (the constructor)
        algorithm.arguments.check(saved.arguments, combinations=False)
    except ArgumentError as error:
        raise ValueError(f"{name}: its recorded arguments are refused ({error}); {fix}, or use another save") from None
    if saved.policy_class not in algorithm.policy_aliases:
        known = ", ".join(algorithm.policy_aliases)
        raise ValueError(f"{name} records the policy class {saved.policy_class!r:.60}, not one of {known}; {fix}")
    check_complete(saved, algorithm, name, overrides)


#: what ``policy_kwargs`` holds in every file (the architecture, so that load builds it offline; the parameters kept
#: frozen, which would otherwise train)
RECORDED_POLICY_KWARGS = ("model_config", "frozen_parameters")


def missing_entries(saved: Any, algorithm: Any) -> list[str]:
    """What a file of the current format would hold that ``saved`` (a
    :class:`~algorithms.common.saving.run_file.SavedRun`, its arguments regrouped) lacks, as ``arguments.<name>``
    (a settings dict's ``arguments.<name>.<key>``), ``state.<key>`` and ``env.record.kwargs.<name>``: every argument
    ``algorithm`` saves, the run state's entries (:attr:`~algorithms.common.base_class.LMBaseAlgorithm.run_state_keys`,
    the env's states with an env record, the weight versions with ``max_staleness`` > 0, the collapse guard's state
    when it was switched on) and every argument of the recorded env."""
    arguments, state = saved.arguments, saved.state
    missing = []
    for key, argument in algorithm.arguments.items():
        if not argument.saved:
            continue
        if key not in arguments:
            missing.append(f"arguments.{key}")
        elif argument.settings is not None and (arguments[key] is None or isinstance(arguments[key], Mapping)):
            recorded = arguments[key] or {}  # None: every setting's default
            missing += [f"arguments.{key}.{inner}" for inner in argument.settings if inner not in recorded]
    policy_kwargs = arguments.get("policy_kwargs")
    if isinstance(policy_kwargs, Mapping):
        missing += [f"arguments.policy_kwargs.{k}" for k in RECORDED_POLICY_KWARGS if k not in policy_kwargs]
    staleness, guard = arguments.get("max_staleness"), arguments.get("collapse_guard")
    optional = {
        "env_states": saved.env is not None,
        "weight_versions": isinstance(staleness, int) and staleness > 0,
        "collapse_guard": guard is True or isinstance(guard, Mapping),
    }
    needed = [*algorithm.state_attributes, *algorithm.run_state_keys, *(k for k, kept in optional.items() if kept)]
    missing += [f"state.{key}" for key in dict.fromkeys(needed) if key not in state]
    return missing + [f"env.record.kwargs.{key}" for key in missing_env_arguments(saved.env)]


def missing_env_arguments(recorded: Any) -> list[str]:
    """The arguments of :class:`~grpo_gym.env.R1ZeroEnv` an env record (``{"record": ..., "n_envs": N}``) lacks:
    a record holds every one (:meth:`~grpo_gym.env.R1ZeroEnv.describe`). [] when it holds no readable kwargs (what
    else is wrong with it is refused where it is rebuilt)."""
    from grpo_gym.env import R1ZeroEnv

    record = recorded.get("record") if isinstance(recorded, Mapping) else None
    kwargs = record.get("kwargs") if isinstance(record, Mapping) else None
    if not isinstance(kwargs, Mapping):
        return []
    return [key for key in inspect.signature(R1ZeroEnv).parameters if key not in kwargs]


def check_complete(saved: Any, algorithm: Any, name: str, overrides: Mapping[str, Any] | None = None) -> None:
    """Refuse a file of the current format that lacks what every file of it holds (:func:`missing_entries`): it was
    edited or damaged, and filling its gaps with defaults would train another run than the one saved. The message
    names the file, each entry and the fix; ``load``'s ``overrides`` may give the missing arguments (the run's
    values). A file of an earlier format (``saved.current`` false) lacks what was added since: each takes its
    default, with a warning naming them."""
    given = {f"arguments.{key}" for key in overrides or {}}  # load(path, n_groups=2): the run's value, given
    missing = [entry for entry in missing_entries(saved, algorithm) if ".".join(entry.split(".")[:2]) not in given]
    if not missing:
        return
    shown = ", ".join(missing)
    if not saved.current:
        defaults = ", ".join(_with_default(entry, algorithm) for entry in missing)
        warnings.warn(
            f"{name} was written by an earlier version of grpo-gym, and records no {defaults}: each takes its default "
            "(a run-state entry: a fresh run's value); save the model again to record them",
            stacklevel=user_stacklevel(),
        )
        return
    arguments = [entry.split(".")[1] for entry in missing if entry.startswith("arguments.")]
    passed = ""
    if overrides is not None and arguments and len(arguments) == len(missing):
        example = ", ".join(f"{key}=..." for key in dict.fromkeys(arguments))
        passed = f", or give the run's values: {algorithm.__name__}.load(path, {example})"
    raise ValueError(f"{name} lacks {shown}, which every file of format {FORMAT!r} records; {DAMAGED_FIX}{passed}")


def _with_default(entry: str, algorithm: Any) -> str:
    """A missing entry as a warning names it: an argument (or a setting of a settings dict) with its default."""
    parts = entry.split(".")
    argument = algorithm.arguments.get(parts[1]) if parts[0] == "arguments" else None
    if argument is not None and len(parts) == 3 and argument.settings is not None and parts[2] in argument.settings:
        argument = argument.settings[parts[2]]
    elif argument is not None and len(parts) != 2:
        argument = None
    return entry if argument is None else f"{entry} (default {argument.default!r:.40})"


#: the names a causal LM's token embedding has in transformers' architectures (Llama, GPT-2, BLOOM, GPT-NeoX)
EMBEDDING_NAMES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "embed_in.weight")


def check_recorded_vocabulary(saved: Any, name: str) -> None:
    """Refuse, naming the file and the key, a recorded ``policy_kwargs.model_config.vocab_size`` the saved token
    embedding disagrees with: checked before the model is built, since building it compares the vocabulary with
    the env's tokenizer, which would take the blame for the file."""
    config = (saved.arguments.get("policy_kwargs") or {}).get("model_config")
    weights = saved.state_dicts.get("policy") or {}
    if not isinstance(config, dict) or "vocab_size" not in config:
        return
    for key, tensor in weights.items():
        if key.endswith(EMBEDDING_NAMES) and tensor.dim() == 2 and tensor.shape[0] != config["vocab_size"]:
            raise ValueError(
                f"{name}: arguments.policy_kwargs.model_config.vocab_size is {config['vocab_size']!r:.40}, but its "
                f"policy.pth's {key!r} has {tensor.shape[0]} rows: the 'data' entry was edited or comes from "
                "another save; use another save (a checkpoint's previous iteration, or the run's --save-path)"
            )


def check_weights_fit(
    saved: dict[str, th.Tensor], expected: dict[str, th.Tensor], name: str, entry: str = "policy.pth"
) -> None:
    """Refuse, naming the file, its ``entry`` (``policy.pth``, ``ref_model.pth``) and up to three problems, weights
    that do not fit the model the file's arguments build: missing or unexpected tensors, other shapes, or integers
    where the model has floats (torch would copy them in, rounded)."""
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
            f"{name}: its {entry} does not fit the model its arguments describe ({shown}): the weights and the "
            "'data' entry come from different saves, or the file was edited; use another save"
        )


#: the optimizer settings a file may set, each with the range a usable value lies in
OPTIMIZER_SETTINGS = {
    "lr": (lambda x: 0 <= x < math.inf, "a learning rate >= 0"),
    "eps": (lambda x: 0 < x < 1, "an epsilon in (0, 1)"),
    "weight_decay": (lambda x: 0 <= x < math.inf, "a weight decay >= 0"),
}


def check_optimizer_state(saved: dict[str, Any], optimizer: th.optim.Optimizer, name: str) -> None:
    """Refuse, naming the file, the entry and the fix, an optimizer state the optimizer would take and then train into
    NaN or fail on later: other parameter groups or sizes, a moment of another shape or holding a NaN or an infinity,
    settings out of range (a learning rate that is not finite, ``betas`` outside [0, 1), ``eps`` <= 0)."""

    def damaged(what: str) -> ValueError:
        return ValueError(f"{name}: its policy.optimizer.pth {what}; {DAMAGED_FIX}")

    groups, state = saved.get("param_groups"), saved.get("state")
    if not isinstance(groups, list) or not isinstance(state, dict) or set(saved) - {"param_groups", "state"}:
        raise damaged("is not an optimizer state ({'state': ..., 'param_groups': [...]} and nothing else)")
    mine = optimizer.param_groups
    if len(groups) != len(mine) or any(
        not isinstance(g, dict) or not isinstance(g.get("params"), list) or len(g["params"]) != len(m["params"])
        for g, m in zip(groups, mine, strict=True)
    ):
        sizes = [len(g["params"]) if isinstance(g, dict) and isinstance(g.get("params"), list) else "?" for g in groups]
        expected = [len(m["params"]) for m in mine]
        raise damaged(f"has parameter groups of sizes {sizes}, the model's optimizer {expected}")
    for index, group in enumerate(groups):
        for key, (usable, what) in OPTIMIZER_SETTINGS.items():
            value = group.get(key)
            if key in group and (isinstance(value, bool) or not isinstance(value, (int, float)) or not usable(value)):
                raise damaged(f"sets {key}={value!r:.40} in group {index}: it must be {what}")
        betas = group.get("betas")
        if "betas" in group and not (
            isinstance(betas, (list, tuple))
            and len(betas) == 2
            and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)
        ):
            raise damaged(f"sets betas={betas!r:.60} in group {index}: they must be two numbers in [0, 1)")
    shapes = [tuple(p.shape) for m in mine for p in m["params"]]  # in the optimizer's parameter order
    position = {key: n for n, key in enumerate(key for group in groups for key in group["params"])}
    for key, moments in state.items():
        if key not in position or not isinstance(moments, dict):
            raise damaged(f"holds state for a parameter {key!r:.20} no group names")
        for moment, value in moments.items():
            if not isinstance(value, th.Tensor):
                raise damaged(f"holds a {type(value).__name__} as {moment!r:.30} of parameter {key}")
            if value.is_floating_point() and not bool(th.isfinite(value).all()):
                raise damaged(f"holds NaN or infinite values in {moment!r:.30} of parameter {key}")
            if value.dim() > 0 and tuple(value.shape) != shapes[position[key]]:
                shape = tuple(value.shape)
                raise damaged(f"holds {moment!r:.30} of parameter {key} of shape {shape}, not its weight's")


def check_reference_kept(reference: bool | None, name: str) -> None:
    """A file whose weights hold no frozen reference, loaded by a model that keeps one: refused when the file records
    that its run kept one (``reference`` true: a sharded checkpoint's shards that lost it; a whole file's lack is
    refused as it is read), warned about for a file of an earlier version (``None``: it does not say)."""
    if reference:
        raise ValueError(
            f"{name}: the shards of its checkpoint hold no frozen reference, which the file records its run kept; "
            f"{DAMAGED_FIX}"
        )
    if reference is None:
        warnings.warn(
            f"{name} was written by an earlier version of grpo-gym and holds no frozen reference (ref_model.pth): "
            "the reference is a copy of the loaded policy",
            stacklevel=user_stacklevel(),
        )
