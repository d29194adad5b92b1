"""``GRPO.from_trl``: a TRL ``GRPOTrainer(model, reward_funcs, args, train_dataset)`` call as a GRPO model.

It builds what a TRL script describes in this project's terms, by the table of :mod:`algorithms.common.trl_names`:

- the env: ``gym.make("R1Zero-v0", task="dataset", ...)`` over ``train_dataset`` (its ``prompt`` column, string or
  conversational; ``eval_dataset`` as the held-out split), with ``reward_funcs`` (a list, named after the functions
  as TRL names them), ``reward_weights`` from TRL's list, the built-in components at weight 0 (TRL scores with your
  functions alone; their sum is not clipped), ``processing_class`` (or the model folder's tokenizer) as the
  tokenizer, string prompts used as they are (``template="{prompt}"``, as TRL does) and conversations rendered by the
  chat template (or the plain layout without one), ``max_new_tokens`` from ``max_completion_length``;
- the model: ``GRPO("TransformerPolicy", env, ...)`` with the ``args`` fields that have an equivalent, ``model`` and
  ``peft_config`` in ``policy_kwargs``, then your own keyword arguments over them.

Which ``args`` fields are read: a ``GRPOConfig`` brings TRL's values, its defaults included (TRL's run, ported),
but for the fields ``GRPOConfig`` fills in itself (:data:`FILLED_BY_TRL`: ``bf16``, ``generation_batch_size``, ...;
give them in a dict to port them); a dict brings its keys, the rest taking our defaults. A ``GRPOConfig``'s
``steps_per_generation`` is read as TRL filled it (per process: from ``generation_batch_size`` when you gave that),
so its generation batch ports too. A field you set (a dict's key, or a ``GRPOConfig`` field changed from TRL's
default) that has no equivalent the port can copy (a scheduler, a callback) is named in one warning with what
to do instead.
Batching: ``n_groups`` (prompts per rollout) is ``generation_batch_size / num_generations``, where TRL's
``generation_batch_size`` is ``per_device_train_batch_size x steps_per_generation`` (or
``x gradient_accumulation_steps``) when not given; ``batch_size`` (completions per optimizer step) is
``per_device_train_batch_size x gradient_accumulation_steps``. A generation batch that is not whole groups of
``num_generations`` is refused, as TRL refuses it.
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from algorithms.common.env_util import unwrapped_errors
from algorithms.common.trl_names import GRPO_CONFIG, TRL_CONFIG
from grpo_gym.trl_names import TrlName, spelled
from grpo_gym.validation import check_float, check_int

if TYPE_CHECKING:
    from algorithms.common.base_class import LMBaseAlgorithm

ANSWER_COLUMNS = ("answer", "solution", "ground_truth", "target")
"""The columns ``from_trl`` looks for reference answers in, in this order, when ``answer`` is not given."""
FILLED_BY_TRL = frozenset(
    {
        "output_dir",
        "bf16",
        "activation_checkpointing",
        "disable_tqdm",
        "report_to",
        "debug",
        "pad_to_multiple_of",
        "generation_batch_size",
        "accelerator_config",
        "dataloader_pin_memory",
        "logging_dir",
    }
)
"""Fields whose value ``GRPOConfig`` sets itself: not read from a ``GRPOConfig`` (a dict may give them)."""
BATCHING = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "generation_batch_size",
)
BUILTIN_OFF = {"syntax": 0.0, "consistency": 0.0, "task": 0.0, "length": 0.0}
#: TRL 1.16's defaults where ours differ: (TRL's value, our argument that sets it, how to read ours from the built
#: model). ``from_trl`` names each when ``args`` leaves the field out and you did not set ours, so a port never
#: changes a value silently
TRL_DEFAULTS: dict[str, tuple[Any, str, Any]] = {
    "learning_rate": (1e-6, "learning_rate", lambda m: m.learning_rate),
    "beta": (0.0, "beta", lambda m: m.beta),
    "max_completion_length": (512, "env_kwargs", lambda m: m.env.get_attr("max_new_tokens", indices=[0])[0]),
    "top_p": (1.0, "policy_kwargs", lambda m: m.policy.top_p),
    "loss_type": ("dapo", "loss_aggregation", lambda m: m.loss_aggregation),
    "max_grad_norm": (1.0, "max_grad_norm", lambda m: m.max_grad_norm),
    "weight_decay": (0.0, "policy_kwargs", lambda m: m.policy.optimizer.param_groups[0].get("weight_decay", 0.0)),
    "entropy_coef": (0.0, "ent_coef", lambda m: m.ent_coef),  # ours: a small bonus, decaying
}


def config_values(args: Any) -> tuple[dict[str, Any], set[str]]:
    """The fields ``args`` gives and those you set: a mapping's keys (both), or a ``GRPOConfig``'s fields but
    :data:`FILLED_BY_TRL` and, as set, those that differ from TRL's defaults. ``TypeError`` for a name that is not a
    ``GRPOConfig`` field."""
    if args is None:
        return {}, set()
    if isinstance(args, Mapping):
        values, changed = dict(args), set(args)
    elif dataclasses.is_dataclass(args) and not isinstance(args, type):
        values, changed = {}, set()
        for spec in dataclasses.fields(args):
            if spec.name in FILLED_BY_TRL:
                continue
            default = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
            values[spec.name] = getattr(args, spec.name)
            if values[spec.name] != default:
                changed.add(spec.name)
    else:
        raise TypeError(f"args must be a trl.GRPOConfig or a dict of its fields, got {type(args).__name__}")
    unknown = sorted(name for name in values if name not in TRL_CONFIG)
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(TRL_CONFIG), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(
            f"args: {', '.join(unknown)} are not fields of TRL's GRPOConfig (1.16) or AsyncGRPOConfig{hint}"
        )
    return values, changed


def _converted(name: str, entry: TrlName, value: Any) -> tuple[bool, Any]:
    """``(use it, our value)``: TRL's value through the entry's ``values``; a false value with no mapping
    (``bf16=False``) is not used, another one with no equivalent is a ``ValueError``."""
    if entry.values is None:
        return True, value
    if value in entry.values:
        return True, entry.values[value]
    if not value:
        return False, None
    choices = sorted(set(entry.values.values()))
    raise ValueError(f"{name}={value!r} has no equivalent here; ours: {entry.ours} in {choices}")


def _batching(values: dict[str, Any], group_size: int) -> dict[str, int]:
    """``n_groups`` and ``batch_size`` from TRL's batch fields (see the module docstring); only those they set."""
    if not any(name in values for name in BATCHING):
        return {}

    def count(name: str, default: int) -> int:  # TRL's None (unset) is its default; anything else a count >= 1
        value = values.get(name)
        return default if value is None else check_int(f"args[{name!r}]", value, low=1)  # type: ignore[return-value]

    per_device = count("per_device_train_batch_size", 8)
    accumulation = count("gradient_accumulation_steps", 1)
    steps = count("steps_per_generation", accumulation)
    generation = count("generation_batch_size", per_device * steps)
    if generation % group_size:
        raise ValueError(
            f"the generation batch ({generation}: generation_batch_size, or per_device_train_batch_size x "
            f"steps_per_generation) must be divisible by num_generations ({group_size}), as in TRL: a rollout holds "
            "whole groups of completions of one prompt"
        )
    return {"n_groups": max(1, generation // group_size), "batch_size": per_device * accumulation}


IS_MODE = "vllm_importance_sampling_mode"


def _importance_sampling_mode(values: dict[str, Any]) -> dict[str, Any]:
    """TRL's ``vllm_importance_sampling_mode`` as ``sampler_correction`` ("token_truncate": "tis", "sequence_mask":
    "mask"), only where TRL applies it: with ``use_vllm`` and the correction on (without vLLM TRL ignores it, and
    ours stays at what ``vllm_importance_sampling_correction`` says)."""
    if IS_MODE not in values or not values.get("use_vllm"):
        return {}
    if values.get("vllm_importance_sampling_correction", True) is False:
        return {}
    return {"sampler_correction": _converted(IS_MODE, GRPO_CONFIG[IS_MODE], values[IS_MODE])[1]}


def translate(
    values: dict[str, Any], changed: set[str], names: list[str]
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The GRPO arguments, env arguments and the fields you set that are left for you (with ours) of a TRL config's
    ``values``; ``names``: the reward functions' names, for TRL's list of ``reward_weights``."""
    algorithm: dict[str, Any] = {}
    env: dict[str, Any] = {}
    policy: dict[str, Any] = {}
    left: list[str] = []
    for name, value in values.items():
        entry = TRL_CONFIG[name]
        if name in BATCHING or name in ("output_dir", IS_MODE):
            continue
        if name == "reward_weights":
            if value is None:
                continue
            if not isinstance(value, (list, tuple)):
                raise ValueError(f"reward_weights must be a list of weights, one per reward function as in TRL, got "
                                 f"{value!r:.60}")  # fmt: skip
            if len(value) != len(names):
                raise ValueError(f"reward_weights has {len(value)} weights for {len(names)} reward functions")
            weights = [check_float(f"reward_weights[{i}]", weight) for i, weight in enumerate(value)]
            env["reward_weights"] = dict(zip(names, weights, strict=True))
            continue
        if not entry.ported:
            if name in changed:
                ours = "no equivalent" if entry.where == "none" else spelled(name, entry)
                left.append(f"{name} ({ours}{': ' + entry.note if entry.note else ''})")
            continue
        used, ours = _converted(name, entry, value)
        if not used or value is None:  # TRL's None is "unset" (e.g. epsilon_high): ours applies; a mapped None is kept
            continue
        key, _, inner = str(entry.ours).partition(".")
        if entry.where == "policy" and inner:
            policy.setdefault(key, {})[inner] = ours
        elif entry.where == "arg" and inner:  # a key of a settings dict (rollout_engine_kwargs)
            algorithm.setdefault(key, {})[inner] = ours
        else:
            {"arg": algorithm, "env": env, "policy": policy}[entry.where][key] = ours
    algorithm.update(_batching(values, int(algorithm.get("group_size", 8))))
    algorithm.update(_importance_sampling_mode(values))
    if policy:
        algorithm["policy_kwargs"] = policy
    return algorithm, env, left


def _answer_column(first: Mapping[str, Any], answer: str | None) -> str:
    """``answer``, or the first of :data:`ANSWER_COLUMNS` the first row has."""
    found = answer if answer is not None else next((name for name in ANSWER_COLUMNS if name in first), None)
    if found is None:
        raise ValueError(
            "from_trl: the env's dataset task needs a column of reference answers (success, evaluation and the cold "
            f"start read it): pass answer='<column>'; the dataset's columns: {', '.join(map(str, first))}"
        )
    return found


def port_env(
    train_dataset: Any, eval_dataset: Any, funcs: dict[str, Any], tokenizer: Any, answer: str | None, env_args: dict
) -> Any:
    """The ``R1Zero-v0`` env of a TRL script (see the module docstring); ``env_args`` go over what it sets."""
    import gymnasium as gym

    import grpo_gym  # noqa: F401  (registers R1Zero-v0)
    from grpo_gym.tasks.dataset import load_records

    records = load_records(train_dataset, "train_dataset")[0]
    if not records:
        raise ValueError("from_trl: train_dataset has no rows; give at least one row with a 'prompt' column")
    first = records[0][1]
    if not isinstance(first, Mapping):
        raise ValueError(
            f"from_trl: train_dataset's rows must be dicts of columns, row 1 is a {type(first).__name__} "
            f"({first!r:.60}); give rows like {{'prompt': '...', 'answer': '...'}}"
        )
    conversational = isinstance(first.get("prompt"), (list, tuple))
    task_kwargs = {"data": train_dataset, "answer": _answer_column(first, answer)}
    if eval_dataset is not None:
        task_kwargs["eval_data"] = eval_dataset
    kwargs = {
        "task": "dataset",
        "task_kwargs": task_kwargs,
        "reward_funcs": funcs,
        "tokenizer": tokenizer,
        "template": "{prompt}",  # TRL uses a string prompt as it is
        "use_chat_template": "auto" if conversational else False,
        **env_args,
        "reward_weights": {**BUILTIN_OFF, **env_args.get("reward_weights", {})},  # TRL scores with your functions
    }
    return unwrapped_errors(gym.make, "R1Zero-v0", **kwargs)


def _lora(peft_config: Any) -> dict[str, Any]:
    """``policy_kwargs["lora"]`` from a ``peft.LoraConfig`` (dropout 0: the policy never runs dropout); without
    ``target_modules``, peft's default for the model type, as in TRL (``["q_proj", "v_proj"]`` for Llama)."""
    import peft

    from algorithms.common.model.lora import PASSED, lora_config

    defaults = peft.LoraConfig()
    target = peft_config.target_modules
    lora = {"r": peft_config.r, "alpha": peft_config.lora_alpha, "dropout": 0.0}
    lora["target_modules"] = target if target is None or isinstance(target, str) else sorted(target)
    lora.update({k: getattr(peft_config, k) for k in PASSED if getattr(peft_config, k) != getattr(defaults, k)})
    if peft_config.lora_dropout:
        warnings.warn(
            f"peft_config.lora_dropout={peft_config.lora_dropout} is not used: the policy never runs dropout (its "
            "model stays in eval mode, so a fresh rollout's importance ratio is exactly 1)",
            UserWarning,
            stacklevel=3,
        )
    lora_config(lora)  # checked now, with the key named
    return lora


def from_trl(
    cls: type[LMBaseAlgorithm],
    model: Any,
    reward_funcs: Any,
    args: Any = None,
    train_dataset: Any = None,
    eval_dataset: Any = None,
    processing_class: Any = None,
    peft_config: Any = None,
    answer: str | None = None,
    env_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> LMBaseAlgorithm:
    """TRL's ``GRPOTrainer(model, reward_funcs, args, train_dataset, ...)`` as a ``cls`` (GRPO) model: see the module
    docstring for what it builds. ``GRPO.from_trl(...)`` calls it.

    :param cls: the algorithm class (GRPO)
    :param model: a built-in size, a model folder or hub name, or a model object (TRL's ``model``)
    :param reward_funcs: TRL's reward functions: one, a list (named after them) or a dict; ``"module:function"``
        strings are imported. An empty list is refused (the port scores with them alone); a batch that every
        function scores ``None`` (not applicable) is warned about, not refused (see
        :mod:`grpo_gym.rewards.composite`)
    :param args: a ``trl.GRPOConfig`` or a dict of its fields (those with an equivalent are ported)
    :param train_dataset: the rows (a ``datasets.Dataset``, a list of dicts, a data file) with a ``prompt`` column
    :param eval_dataset: the held-out rows, or ``None``
    :param processing_class: the tokenizer (default: the model folder's, else the built-in one)
    :param peft_config: a ``peft.LoraConfig`` (LoRA adapters are trained)
    :param answer: the column of reference answers (default: the first of :data:`ANSWER_COLUMNS` the rows have)
    :param env_kwargs: env arguments over what the port sets
    :param kwargs: GRPO arguments over what ``args`` gives (``verbose``, ``seed``, ``cold_start_kwargs``, ...)
    """
    from algorithms.common.model.tokenizer_check import model_tokenizer
    from grpo_gym.rewards.functions import named_reward_funcs

    if train_dataset is None:
        raise ValueError("from_trl needs train_dataset= (a datasets.Dataset, a list of dicts or a data file)")
    specs = [reward_funcs] if isinstance(reward_funcs, str) else reward_funcs
    if isinstance(specs, (list, tuple)) and any(isinstance(spec, str) and ":" not in spec for spec in specs):
        raise ValueError(
            "from_trl: a reward model named by a string is a TRL reward function we do not take; give a reward model "
            "folder as the env's reward_model= (env_kwargs), or name functions as 'module:function'"
        )
    funcs = named_reward_funcs(reward_funcs)
    if not funcs:
        raise ValueError(
            "from_trl: reward_funcs is empty; TRL scores completions with your reward functions alone (the "
            "built-in components are off), so every completion would score 0: pass at least one function"
        )
    values, changed = config_values(args)
    algorithm, env_args, left = translate(values, changed, list(funcs))
    if left:
        warnings.warn(
            "from_trl: these GRPOConfig fields were set but are not ported; do it by hand: " + "; ".join(left),
            UserWarning,
            stacklevel=3,
        )
    tokenizer = processing_class if processing_class is not None else model_tokenizer(model)
    env = port_env(train_dataset, eval_dataset, funcs, tokenizer, answer, {**env_args, **(env_kwargs or {})})
    policy_kwargs = {**algorithm.pop("policy_kwargs", {}), "model": model}
    if peft_config is not None:
        policy_kwargs["lora"] = _lora(peft_config)
    policy_kwargs.update(kwargs.pop("policy_kwargs", None) or {})
    for name, argument in cls.arguments.items():  # a settings dict given too: its keys over the port's
        if argument.settings is not None and isinstance(kwargs.get(name), dict) and name in algorithm:
            kwargs[name] = {**algorithm[name], **kwargs[name]}
    built = cls("TransformerPolicy", env, **{**algorithm, **kwargs, "policy_kwargs": policy_kwargs})
    yours = set(kwargs) | ({"env_kwargs"} if env_kwargs else set())
    changed_defaults = defaults_not_trl(built, set(values), yours)
    if changed_defaults:
        warnings.warn(
            "from_trl: these differ from TRL's defaults (args did not set them): " + "; ".join(changed_defaults)
            + ". Give them in args (or as GRPO arguments) to choose",
            UserWarning,
            stacklevel=3,
        )  # fmt: skip
    return built


def defaults_not_trl(model: LMBaseAlgorithm, given: set[str], yours: set[str]) -> list[str]:
    """Each value of ``model`` that TRL's default would set otherwise (:data:`TRL_DEFAULTS`), for the fields
    ``args`` did not give and whose argument you did not pass (``yours``): ``"learning_rate=1e-05 (TRL 1e-06)"``."""
    said = []
    for name, (trl_default, argument, ours) in TRL_DEFAULTS.items():
        if name in given or argument in yours:
            continue
        value = ours(model)
        if value != trl_default:
            said.append(f"{name}={value!r} (TRL {trl_default!r})")
    return said
