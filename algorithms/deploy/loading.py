"""Load a trained model for deployment, whatever form it was saved in, as a :class:`TransformerPolicy` + tokenizer.

Four forms are read: a GRPO zip (``model.save``; the tokenizer is not in the zip: the built-in one unless given),
a Hugging Face folder (``save_pretrained``; its own tokenizer when it has one), an INT8 export
(:func:`~algorithms.deploy.quantize.save_int8`) and a GGUF file (:mod:`grpo_gym.gguf`: dequantized, its own
tokenizer). The server and distillation then sample through the policy, with
the project's sampler and decoders: one code path for training rollouts and serving.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from torch import nn

from algorithms.common.model.loading import check_finite_weights
from algorithms.common.model.tokenizer_check import has_tokenizer
from algorithms.common.policies import TransformerPolicy
from algorithms.deploy.quantize import is_int8_folder, load_int8
from grpo_gym.gguf import is_gguf


def policy_for_model(
    model: nn.Module,
    tokenizer: Any,
    max_new_tokens: int = 256,
    device: th.device | str = "cpu",
    **policy_kwargs: Any,
) -> TransformerPolicy:
    """A :class:`TransformerPolicy` around a loaded model, with spaces made from the tokenizer.

    :param model: a Hugging Face causal LM (float or INT8)
    :param tokenizer: its tokenizer (gives the vocabulary, EOS and pad ids)
    :param max_new_tokens: the policy's default completion budget
    :param device: where the model runs
    :param policy_kwargs: other :class:`TransformerPolicy` arguments (``temperature``, ``top_p``, ...)
    """
    from grpo_gym.tokenizer import TokenCodec

    codec = TokenCodec(tokenizer)
    window = spaces.Box(0, codec.vocab_size - 1, shape=(1,), dtype=np.int64)
    observation_space = spaces.Dict({"input_ids": window, "attention_mask": spaces.Box(0, 1, (1,), np.int64)})
    action_space = spaces.MultiDiscrete(np.full(max_new_tokens, codec.vocab_size, dtype=np.int64))
    policy = TransformerPolicy(
        observation_space,
        action_space,
        lambda _: 0.0,
        model=model,
        eos_token_id=codec.eos_id,
        pad_token_id=codec.pad_id,
        **policy_kwargs,
    )
    return policy.to(device)


def load_policy(
    path: str | os.PathLike,
    tokenizer: Any = None,
    device: th.device | str = "cpu",
    max_new_tokens: int = 256,
    trust_remote_code: bool = False,
) -> tuple[TransformerPolicy, Any]:
    """Load a saved model as ``(policy, tokenizer)``; a model with a NaN or infinite weight is refused
    (:func:`check_finite_weights`), and one whose file lacks weights (:func:`load_model`).

    :param path: a GRPO zip, a ``save_pretrained`` folder, an INT8 export folder or a ``.gguf`` file
    :param tokenizer: a tokenizer (object, folder or ``"builtin"``); default: the folder's own, else the built-in
    :param device: where the model runs (an INT8 export runs its int8 kernel on CPU)
    :param max_new_tokens: the default completion budget of a folder's policy (a zip keeps its own)
    :param trust_remote_code: run a folder's own model/tokenizer code (``"auto_map"``, see :mod:`grpo_gym.hub`);
        refused by default. Opt in only for code you have read
    """
    from grpo_gym.tokenizer import load_tokenizer

    location = Path(path)
    if is_gguf(location):  # llama.cpp's / Ollama's format: the model, and the tokenizer the file carries
        from algorithms.common.model.loading import load_model

        model = load_model(os.fspath(location))
        tokenizer = load_tokenizer(location if tokenizer is None else tokenizer, trust_remote_code=trust_remote_code)
        return policy_for_model(model, tokenizer, max_new_tokens, device), tokenizer
    if location.is_dir():
        if (location / ADAPTER_CONFIG).is_file():
            model, own = adapter_model(location, trust_remote_code)
        elif is_int8_folder(location):
            model, own = load_int8(location, trust_remote_code=trust_remote_code), path
        else:
            from algorithms.common.model.loading import load_model
            from algorithms.common.saving.model_file import check_not_checkpoint_folder

            if not (location / "config.json").is_file():
                check_not_checkpoint_folder(location)
            model, own = load_model(os.fspath(location), trust_remote_code=trust_remote_code), path
        own = own if own is not None and has_tokenizer(own) else None
        tokenizer = load_tokenizer(tokenizer if tokenizer is not None else own, trust_remote_code=trust_remote_code)
        check_finite_weights(model, f"the model {os.fspath(path)!r}")
        return policy_for_model(model, tokenizer, max_new_tokens, device), tokenizer
    if not location.is_file():
        raise ValueError(
            f"model {os.fspath(path)!r} does not exist: pass a GRPO or LMPPO zip (model.save), a save_pretrained "
            "folder, or an INT8 export folder"
        )
    from algorithms.common.saving.run_file import recorded_tokenizer

    algorithm = saved_algorithm(location)
    # the policy alone: no env, no rollout engine (a run's vLLM is not started to serve it); load refuses NaN or
    # infinite weights
    policy = algorithm.load(
        location, device=device, rebuild_env=False, rollout_engine="builtin", read_optimizer=False
    ).policy
    recorded = tokenizer if tokenizer is not None else recorded_tokenizer(location)  # the run's, as the zip records
    tokenizer = load_tokenizer(recorded, trust_remote_code=trust_remote_code)
    check_tokenizer(policy, tokenizer, what=f"the model {os.fspath(path)!r}")
    return policy, tokenizer


def saved_algorithm(path: str | os.PathLike) -> Any:
    """The registered class that wrote the zip at ``path``, by the class name the zip records (GRPO when it
    records another, whose load then names the class to use)."""
    from algorithms import GRPO, LMBaseAlgorithm
    from algorithms.common.saving.model_file import read_model_file

    return LMBaseAlgorithm.registered(str(read_model_file(Path(path))[0].get("algorithm"))) or GRPO


#: the file that makes a folder a peft adapter folder
ADAPTER_CONFIG = "adapter_config.json"


def adapter_model(folder: Path, trust_remote_code: bool = False) -> tuple[nn.Module, str | None]:
    """A LoRA adapter folder's base model with the adapters merged in, and the folder to read the tokenizer from
    (the adapter folder's own, else the base's, else ``None``: the built-in one)."""
    from algorithms.common.model.loading import load_model
    from algorithms.common.model.lora import require_peft

    peft = require_peft()
    base = peft.PeftConfig.from_pretrained(os.fspath(folder)).base_model_name_or_path
    if not base or not (Path(base).is_dir() or "/" in base):  # a folder here, or a hub name (org/name)
        raise ValueError(
            f"{os.fspath(folder)} is a LoRA adapter folder whose base model {base!r} is not a folder or hub name: "
            "serve the merged export instead (model.save_pretrained(folder, merge=True)), or a zip"
        )
    model = load_model(base, trust_remote_code=trust_remote_code)
    model = peft.PeftModel.from_pretrained(model, os.fspath(folder)).merge_and_unload()
    model.requires_grad_(True)  # a plain model again, as load_model gives one (peft froze the base)
    own = folder if has_tokenizer(folder) else (base if has_tokenizer(base) else None)
    return model, None if own is None else os.fspath(own)


def check_tokenizer(policy: TransformerPolicy, tokenizer: Any, what: str = "the model") -> None:
    """Raise a ``ValueError`` naming the fix when ``tokenizer`` is not the one ``policy`` was trained with (its
    size, EOS and pad ids)."""
    size, eos, pad = len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id
    if (policy.vocab_size, policy.eos_token_id, policy.pad_token_id) != (size, eos, pad):
        raise ValueError(
            f"{what} was trained with a tokenizer of {policy.vocab_size} tokens (EOS {policy.eos_token_id}, pad "
            f"{policy.pad_token_id}), not this one ({size} tokens, EOS {eos}, pad {pad}): pass the run's tokenizer "
            "(--tokenizer <folder>), or serve its save_pretrained folder, which holds it"
        )
