"""LoRA adapters through peft (the optional extra ``grpo-gym[peft]``, imported only when LoRA is asked for).

``policy_kwargs={"model": <name | folder | model object>, "lora": {"r": 16, "alpha": 32, "target_modules":
"all-linear", "dropout": 0.0}}`` wraps the policy's model with ``peft.get_peft_model``; a ready
``peft.PeftModel`` (one LoRA adapter, trainable) is accepted as ``model`` too. What follows from it:

- **Training**: only the adapters (and peft's ``modules_to_save``) train; the base weights are frozen, kept out
  of the optimizer, and stay frozen after ``load``. The cold start, when it runs, trains the adapters too.
- **Reference** (the KL term's, and the sampler of ``protected_rollouts``): the same network with its adapters
  disabled (``PeftModel.disable_adapter()``), i.e. the **base model**, as TRL's trainers do with a peft model; no
  second copy is kept (``ref_model`` stays None). With a cold start the reference is therefore the base model, not
  the cold-start policy.
- **Sampling**: the fast Llama-family decoder (:class:`~algorithms.common.generation.decoders.LlamaDecoder`) runs the
  effective weights ``W + scaling * B @ A``, merged once per ``sample()`` call, so a decoding step costs what it
  costs without adapters; other models run through their own (adapted) forward.
- **Saving**: when the base model comes from a folder or hub name, the model zip holds the adapter weights only
  (the base is read back from that folder at ``load``, which must still hold the same weights); for a built-in
  model (a random initialisation) or a model object, the zip holds every weight. ``save_pretrained(dir)`` writes a
  peft adapter folder (``PeftModel.from_pretrained(base, dir)`` reads it), ``save_pretrained(dir, merge=True)`` a
  standard model folder with the adapters merged into a copy of the weights.
- **Dropout**: the policy never runs dropout (its model stays in eval mode so a fresh rollout's ratio is exactly
  1), so ``dropout`` must be 0; a ready PeftModel's ``lora_dropout`` is recorded as 0 (it has no weights).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import warnings
from typing import Any

import torch
from torch import nn

from grpo_gym.validation import ArgumentError, check_choice, check_float, check_int, check_mapping

INSTALL_HINT = 'pip install "grpo-gym[peft]"'
#: the defaults of ``policy_kwargs["lora"]`` (peft's own are r=8, alpha=8, a per-model list of modules, which
#: ``target_modules=None`` selects: ``["q_proj", "v_proj"]`` for Llama, as a ``peft.LoraConfig()`` does)
DEFAULTS: dict[str, Any] = {"r": 16, "alpha": 32, "target_modules": "all-linear", "dropout": 0.0}
#: our keys that are named otherwise in ``peft.LoraConfig``
RENAMED = {"alpha": "lora_alpha", "dropout": "lora_dropout"}
#: ``peft.LoraConfig`` fields passed through by their own names (JSON values, checked by peft)
PASSED = (
    "exclude_modules",
    "bias",
    "use_rslora",
    "modules_to_save",
    "init_lora_weights",
    "layers_to_transform",
    "layers_pattern",
    "rank_pattern",
    "alpha_pattern",
    "use_dora",
    "lora_bias",
    "trainable_token_indices",
    "ensure_weight_tying",
)
#: the keys ``policy_kwargs["lora"]`` accepts (``adapter_name``: the adapter's name in the state dict)
LORA_KEYS = (*DEFAULTS, "adapter_name", *PASSED)
#: initialisations that leave the base weights as they are (PiSSA, OLoRA, LoftQ, EVA, ... change them, so the
#: base could not be read back from its folder)
SAFE_INITS = (True, False, "gaussian")


def require_peft() -> Any:
    """The ``peft`` module, or an ``ImportError`` naming the extra to install."""
    try:
        import peft
    except ImportError as error:
        raise ImportError(f"LoRA needs the peft package, an optional extra: {INSTALL_HINT}") from error
    return peft


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (checked without importing peft)."""
    return any(cls.__name__ == "PeftModel" and cls.__module__.startswith("peft.") for cls in type(model).__mro__)


def base_network(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a ``PeftModel`` (its LoRA layers injected in place, so it computes what the
    PeftModel does); any other model as it is."""
    return model.get_base_model() if is_peft_model(model) else model


def lora_config(spec: Any) -> Any:
    """The ``peft.LoraConfig`` of ``policy_kwargs["lora"]`` (see :data:`LORA_KEYS`), every key checked."""
    spec = {**DEFAULTS, **check_mapping("lora", spec, LORA_KEYS, allow_none=False)}
    peft = require_peft()
    check_int("lora['r']", spec["r"], low=1)
    check_float("lora['alpha']", spec["alpha"], low=0.0, low_open=True)
    check_float(
        "lora['dropout']", spec["dropout"], low=0.0, high=0.0,
        hint="the policy never runs dropout (its model stays in eval mode, so a fresh rollout's ratio is exactly 1)",
    )  # fmt: skip
    targets = spec["target_modules"]
    if not (targets is None or isinstance(targets, str) or _strings(targets)):
        raise ArgumentError(
            f"lora['target_modules'] must be a module name pattern, a list of names or None (peft's default for the "
            f"model type), e.g. 'all-linear' or ['q_proj', 'v_proj'], got {targets!r}"
        )
    check_choice("lora['init_lora_weights']", spec.get("init_lora_weights", True), SAFE_INITS,
                 hint="initialisations that change the base weights are not supported")  # fmt: skip
    kwargs = {RENAMED.get(key, key): value for key, value in spec.items() if key != "adapter_name"}
    if isinstance(targets, (list, tuple)):
        kwargs["target_modules"] = list(targets)
    try:
        return peft.LoraConfig(task_type="CAUSAL_LM", **kwargs)
    except (TypeError, ValueError) as error:
        raise ArgumentError(f"lora: {error}") from None


def apply_lora(model: nn.Module, spec: dict[str, Any], seed: int | None = None) -> nn.Module:
    """``model`` wrapped by ``peft.get_peft_model`` with the adapter ``spec`` describes (``seed``: the adapters'
    initial weights, without touching the global RNG)."""
    config = lora_config(spec)
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    if isinstance(hidden, int) and config.r > hidden:  # before peft allocates r x hidden matrices per layer
        raise ArgumentError(
            f"lora['r']={config.r} is larger than the model's hidden size ({hidden}): an adapter's rank cannot exceed "
            f"its layer's smaller side, so the rest is only cost; use r <= {hidden} (8 to 64 is usual)"
        )
    peft = require_peft()
    rng = torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext()
    with rng, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        if seed is not None:
            torch.manual_seed(seed)
        try:
            return peft.get_peft_model(model, config, adapter_name=spec.get("adapter_name", "default"))
        except ValueError as error:  # e.g. no module matches target_modules
            raise ArgumentError(f"lora: {error}") from None


def lora_record(model: nn.Module) -> dict[str, Any]:
    """``policy_kwargs["lora"]`` describing a ready PeftModel's adapter, so ``load`` builds the same layout (plain
    JSON; fields at peft's defaults are left out)."""
    peft = require_peft()
    if len(model.peft_config) != 1:
        raise ValueError(
            f"model: a PeftModel with one adapter is needed, this one has {sorted(model.peft_config)}; "
            "keep one (model.delete_adapter(name)) or merge the others first"
        )
    name, config = next(iter(model.peft_config.items()))
    if not isinstance(config, peft.LoraConfig):
        raise ValueError(f"model: only LoRA adapters are supported, this PeftModel has a {type(config).__name__}")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            "model: the PeftModel has no trainable parameters (an adapter loaded for inference); load it with "
            "PeftModel.from_pretrained(base, folder, is_trainable=True)"
        )
    record: dict[str, Any] = {
        "r": config.r,
        "alpha": config.lora_alpha,
        "target_modules": _plain(config.target_modules),
        "dropout": 0.0,
    }
    if name != "default":
        record["adapter_name"] = name
    defaults = peft.LoraConfig()
    for key in PASSED:
        value = getattr(config, key)
        if key == "init_lora_weights" and value not in SAFE_INITS:
            continue  # the weights are loaded after the layout is built: any safe initialisation does
        if value != getattr(defaults, key):
            record[key] = _plain(value)
    json.dumps(record)  # plain JSON, or a clear error here rather than at save
    return record


def _strings(value: Any) -> bool:
    return isinstance(value, (list, tuple, set)) and len(value) > 0 and all(isinstance(v, str) for v in value)


def _plain(value: Any) -> Any:
    """A JSON form of a LoraConfig value: sets as sorted lists, tuples as lists."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, tuple):
        return list(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def frozen_base_names(model: nn.Module) -> set[str]:
    """The state-dict names of ``model``'s frozen parameters, tied aliases included (``lm_head.weight`` beside
    ``model.embed_tokens.weight``): right after ``get_peft_model``, the base model's weights."""
    return {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}


# ---------------------------------------------------------------------------------------------- the decoder's view
def is_lora_linear(module: nn.Module) -> bool:
    """Whether ``module`` is a peft LoRA layer around a ``nn.Linear`` (checked by its attributes)."""
    names = ("base_layer", "lora_A", "lora_B", "scaling", "get_delta_weight")
    return all(hasattr(module, name) for name in names) and isinstance(module.base_layer, nn.Linear)


def plain_lora(module: nn.Module) -> bool:
    """Whether :func:`effective_linear` computes ``module``'s output: a plain ``nn.Linear``-like module, or a LoRA
    layer whose active adapters are vanilla LoRA (no DoRA or other variant) and not mixed per row."""
    if not hasattr(module, "lora_A"):  # a plain layer; peft's other wrappers (modules_to_save, ...) are not read
        return hasattr(module, "weight") and not type(module).__module__.startswith("peft.")
    variants, dora = getattr(module, "lora_variant", {}), getattr(module, "use_dora", {})  # (older peft: use_dora)
    return is_lora_linear(module) and not any(name in variants or dora.get(name) for name in module.active_adapters)


def effective_linear(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(weight, bias)`` for ``F.linear`` computing ``module(x)``: a plain layer's own, or a LoRA layer's effective
    ones, ``W + scaling * B @ A`` (and ``b + scaling * b_B`` with ``lora_bias``) summed over its active adapters
    that are not merged into ``W`` yet; the base's alone when the adapters are disabled. New tensors only where
    an adapter adds something."""
    if not hasattr(module, "lora_A"):
        return module.weight, module.bias
    base = module.base_layer
    if module.disable_adapters:
        if module.merged:
            module.unmerge()  # what the layer's own forward does
        return base.weight, base.bias
    weight, bias = base.weight, base.bias
    for name in module.active_adapters:
        if name not in module.lora_A or name in module.merged_adapters:
            continue
        weight = weight + module.get_delta_weight(name).to(weight.dtype)
        extra = module.lora_B[name].bias
        if extra is not None:
            extra = (extra * module.scaling[name]).to(weight.dtype)
            bias = extra if bias is None else bias + extra
    return weight, bias
