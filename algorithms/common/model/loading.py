"""Built-in model configurations and :func:`load_model`.

The built-in models are small Llama-style decoders (``transformers.LlamaForCausalLM``) sized for the
built-in character tokenizer (359 tokens with byte fallback, ``<pad>`` = 0, ``<eos>`` = 1, see
:mod:`grpo_gym.tokenizer`).
They attend to at most 2048 positions (``max_position_embeddings``): the policy's 2048-token memory. They are
standard Hugging Face models, so ``model.save_pretrained(dir)`` writes a folder that ``load_model(dir)``
(or ``AutoModelForCausalLM.from_pretrained``) reads back.

=========  ======  ======  =====  ========  ============  ===========
name       hidden  layers  heads  kv heads  intermediate  parameters
=========  ======  ======  =====  ========  ============  ===========
``tiny``   128     4       4      2         384           ~0.8M
``small``  256     6       8      4         768           ~4.8M
``medium`` 512     8       8      4         1536          ~25M
``base``   768     12      12     12        2560          ~99M
=========  ======  ======  =====  ========  ============  ===========
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

import torch

from algorithms.common.model.finite_state import first_nonfinite
from grpo_gym.gguf import is_gguf, load_gguf_model
from grpo_gym.hub import check_hf_source, check_hub_reachable, check_loaded_weights, trust_kwargs

if TYPE_CHECKING:
    from transformers import PreTrainedModel

#: size of the built-in character tokenizer's vocabulary, ``len(grpo_gym.tokenizer.build_char_tokenizer())``
#: (3 specials + 96 characters + 4 template tags + 256 byte-fallback tokens; a test keeps the two in step)
BUILTIN_VOCAB_SIZE = 359
#: ``<pad>`` and ``<eos>`` ids of the built-in tokenizer
BUILTIN_PAD_ID, BUILTIN_EOS_ID = 0, 1

_COMMON: dict[str, Any] = {
    "vocab_size": BUILTIN_VOCAB_SIZE,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "pad_token_id": BUILTIN_PAD_ID,
    "eos_token_id": BUILTIN_EOS_ID,
    "bos_token_id": BUILTIN_EOS_ID,  # the built-in tokenizer has no BOS; prompts start without one
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "attention_dropout": 0.0,
}


def _config(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int) -> dict[str, Any]:
    return {
        **_COMMON,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": intermediate,
    }


#: ``LlamaConfig`` keyword arguments of the built-in models, by name
BUILTIN_MODELS: dict[str, dict[str, Any]] = {
    "tiny": _config(128, 4, 4, 2, 384),
    "small": _config(256, 6, 8, 4, 768),
    "medium": _config(512, 8, 8, 4, 1536),
    "base": _config(768, 12, 12, 12, 2560),
}


def is_builtin_model(name: Any) -> bool:
    """Whether ``name`` is the name of a built-in model (a key of :data:`BUILTIN_MODELS`)."""
    return isinstance(name, str) and name in BUILTIN_MODELS


def count_parameters(model: torch.nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters of ``model`` (tied weights counted once).

    :param model: any ``torch.nn.Module``
    :param trainable_only: count only parameters with ``requires_grad``
    """
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def build_builtin_model(
    name: str, *, vocab_size: int | None = None, seed: int | None = None, **overrides: Any
) -> PreTrainedModel:
    """A freshly, randomly initialised built-in model (float32).

    :param name: a key of :data:`BUILTIN_MODELS`
    :param vocab_size: embedding rows; default: the built-in tokenizer's size
    :param seed: seeds the initialisation without touching the global RNG; ``None`` uses the global RNG
    :param overrides: ``LlamaConfig`` fields to change, e.g. ``num_hidden_layers=2``
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    kwargs = {**BUILTIN_MODELS[name], **overrides}
    if vocab_size is not None:
        kwargs["vocab_size"] = int(vocab_size)
    config = LlamaConfig(**kwargs)
    rng = torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext()
    with rng:
        if seed is not None:
            torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model


def load_model(
    model: str | os.PathLike | PreTrainedModel = "tiny",
    *,
    vocab_size: int | None = None,
    dtype: torch.dtype | str | None = None,
    seed: int | None = None,
    trust_remote_code: bool = False,
    **overrides: Any,
) -> PreTrainedModel:
    """Return a causal language model: a built-in one, a saved one, or the one given.

    - a built-in name (``"tiny"``, ``"small"``, ``"medium"``, ``"base"``): a new randomly initialised
      Llama-style model, deterministic for a given ``seed``; ``overrides`` change its config fields;
    - a local folder with a ``config.json`` (e.g. written by ``save_pretrained``) or a hub name available
      offline: loaded with ``AutoModelForCausalLM.from_pretrained(model, dtype=dtype, **overrides)``;
    - a ``.gguf`` file (llama.cpp, Ollama): dequantized to ``dtype`` (float32 by default) by
      :func:`grpo_gym.gguf.load_gguf_model`, a plain model from then on;
    - a ``PreTrainedModel`` instance or a ``peft.PeftModel``: returned as is.

    A folder or file that lacks some of the model's weights (transformers would start them from random values) or
    holds a NaN or an infinity is refused with a ``ValueError`` naming the weights.

    :param model: built-in name, folder / hub name, or model instance
    :param vocab_size: built-ins: embedding rows (default: the built-in tokenizer's 359). Loaded models:
        the tokenizer's size, checked against the embedding table (a larger table is fine: generation
        masks the ids ``>= vocab_size``; a smaller one is an error)
    :param dtype: parameter dtype (e.g. ``torch.bfloat16``); ``None``: float32 for built-ins, the
        checkpoint's own default otherwise
    :param seed: initialisation seed of built-ins (the global RNG is left untouched)
    :param trust_remote_code: run a folder's own model code (its config's ``"auto_map"``); without it such a folder
        is refused with a clear error (:mod:`grpo_gym.hub`). Opt in only for code you have read
    :param overrides: config fields of built-ins, or keyword arguments of ``from_pretrained``
    """
    from transformers import PreTrainedModel

    from algorithms.common.model.lora import is_peft_model

    if isinstance(model, PreTrainedModel) or is_peft_model(model):
        return model
    if is_builtin_model(model):
        built = build_builtin_model(model, vocab_size=vocab_size, seed=seed, **overrides)
        return built.to(dtype=_as_dtype(dtype)) if dtype is not None else built
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(
            f"model must be a name, a folder, a PreTrainedModel or a peft PeftModel, not {type(model).__name__}"
        )
    if is_gguf(model):
        loaded = load_gguf_model(model, dtype)
    else:
        loaded = _from_pretrained(os.fspath(model), dtype, {**overrides, **trust_kwargs(trust_remote_code)})
    check_finite_weights(loaded, f"the model {os.fspath(model)!r}", "download or export it again from finite weights")
    rows = loaded.get_input_embeddings().num_embeddings
    if vocab_size is not None and vocab_size > rows:
        raise ValueError(
            f"the model {os.fspath(model)!r} has {rows} token embeddings but the tokenizer has {vocab_size} "
            "tokens; use the tokenizer saved with the model, or resize the embeddings first "
            "(`model.resize_token_embeddings(len(tokenizer))`)"
        )
    return loaded


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def _from_pretrained(path: str, dtype: torch.dtype | str | None, kwargs: dict[str, Any]) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained`` with errors that name the fix.

    A local folder must hold a ``config.json``. A hub name is looked up in the local cache first; only an
    ``owner/name`` id not found there is fetched from the hub (a bare unknown name fails at once instead
    of waiting on the network). The folder (or the cached hub files) is checked first (:func:`check_hf_source`:
    no remote code unless ``kwargs["trust_remote_code"]``, bounded config files and model sizes).
    """
    from transformers import AutoModelForCausalLM

    hint = (
        f"pass a built-in model name ({', '.join(repr(n) for n in BUILTIN_MODELS)}), a local folder "
        "containing config.json and weights (as written by `save_pretrained`), or a hub id 'owner/name'"
    )
    is_dir = os.path.isdir(path)
    if is_dir or os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1:
        if not is_dir:
            raise ValueError(f"model folder {path!r} does not exist: {hint}")
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"model folder {path!r} has no config.json: {hint}")
    check_hf_source(path, trust_remote_code=kwargs["trust_remote_code"], what="model folder")
    kwargs = {**kwargs, "output_loading_info": True, **({"dtype": _as_dtype(dtype)} if dtype is not None else {})}
    try:
        loaded, info = AutoModelForCausalLM.from_pretrained(path, **{"local_files_only": True, **kwargs})
    except (OSError, ValueError, KeyError) as error:
        if is_dir or "/" not in path or kwargs.get("local_files_only"):
            where = "could not be loaded" if is_dir else "is not a built-in name nor in the local HF cache"
            raise ValueError(f"model {path!r} {where} ({type(error).__name__}): {hint}") from error
        check_hub_reachable(path, "model")
        try:
            loaded, info = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        except (OSError, ValueError, KeyError) as failure:
            raise ValueError(f"could not load a causal LM from {path!r} ({failure}): {hint}") from failure
    fix = "its weight files are incomplete or of another model: save_pretrained it again, or download it again"
    check_loaded_weights(info, loaded, f"model {'folder' if is_dir else 'source'} {path!r}", fix)
    return loaded


def check_finite_weights(
    model: torch.nn.Module, what: str = "the model", fix: str = "use a checkpoint saved before the weights diverged"
) -> None:
    """Raise a ``ValueError`` naming ``what``, the first parameter or buffer of ``model`` that holds a NaN or an
    infinity, and ``fix``: such a model generates garbage (or nothing) for every request, and cannot train. A sharded
    (FSDP2) parameter is checked on the shard this process holds."""
    found = first_nonfinite([*model.named_parameters(), *model.named_buffers()])
    if found is not None:
        name, bad, _ = found
        raise ValueError(f"{what} has {bad} NaN or infinite values in {name!r}: it cannot generate or train; {fix}")
