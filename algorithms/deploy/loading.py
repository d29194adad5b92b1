"""Load a trained model for deployment, whatever form it was saved in, as a :class:`TransformerPolicy` + tokenizer.

Four forms are read: a GRPO zip (``model.save``; the tokenizer is not in the zip: the folder or hub name its env
record names, else the built-in one, unless given), a Hugging Face folder (``save_pretrained``; its own tokenizer
when it has one), a LoRA adapter folder (``save_pretrained`` of a LoRA policy: ``adapter_config.json``; its base
model is read from the folder the adapter config names and the adapters merged into it) and an INT8 export
(:func:`~algorithms.deploy.quantize.save_int8`). The server and distillation then sample through the policy, with
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

from algorithms.common.policies import TransformerPolicy
from algorithms.common.vocabulary import has_tokenizer
from algorithms.deploy.quantize import is_int8_folder, load_int8


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
) -> tuple[TransformerPolicy, Any]:
    """Load a saved model as ``(policy, tokenizer)``.

    :param path: a GRPO zip, a ``save_pretrained`` folder or an INT8 export folder
    :param tokenizer: a tokenizer (object, folder or ``"builtin"``); default: the folder's own, else the built-in
    :param device: where the model runs (an INT8 export runs its int8 kernel on CPU)
    :param max_new_tokens: the default completion budget of a folder's policy (a zip keeps its own)
    """
    from grpo_gym.tokenizer import load_tokenizer

    location = Path(path)
    if location.is_dir():
        if (location / ADAPTER_CONFIG).is_file():
            model, own = adapter_model(location)
        else:
            from algorithms.common.models import load_model

            model = load_int8(location) if is_int8_folder(location) else load_model(os.fspath(location))
            own = path if has_tokenizer(path) else None
        tokenizer = load_tokenizer(tokenizer if tokenizer is not None else own)
        return policy_for_model(model, tokenizer, max_new_tokens, device), tokenizer
    if not location.is_file():
        raise ValueError(
            f"model {os.fspath(path)!r} does not exist: pass a GRPO or LMPPO zip (model.save), a save_pretrained "
            "folder, or an INT8 export folder"
        )
    import algorithms
    from algorithms.common.serialization import read_model_file
    from algorithms.common.state import recorded_tokenizer

    name = read_model_file(location)[0].get("algorithm")  # GRPO or LMPPO: the class that wrote the zip
    algorithm = getattr(algorithms, name) if name in ("GRPO", "LMPPO") else algorithms.GRPO  # else: GRPO names it
    policy = algorithm.load(location, device=device, rebuild_env=False).policy  # the policy alone: no env
    tokenizer = load_tokenizer(tokenizer if tokenizer is not None else recorded_tokenizer(location))
    check_tokenizer(policy, tokenizer, what=f"the model {os.fspath(path)!r}")
    return policy, tokenizer


ADAPTER_CONFIG = "adapter_config.json"


def adapter_model(folder: Path) -> tuple[nn.Module, str | None]:
    """A LoRA adapter folder's base model with the adapters merged in, and the folder to read the tokenizer from
    (the adapter folder's own, else the base's, else ``None``: the built-in one)."""
    from algorithms.common.adapters import require_peft
    from algorithms.common.models import load_model

    peft = require_peft()
    base = peft.PeftConfig.from_pretrained(os.fspath(folder)).base_model_name_or_path
    if not base or not (Path(base).is_dir() or "/" in base):  # a folder here, or a hub name (org/name)
        raise ValueError(
            f"{os.fspath(folder)} is a LoRA adapter folder whose base model {base!r} is not a folder or hub name: "
            "serve the merged export instead (model.save_pretrained(folder, merge=True)), or a zip"
        )
    model = peft.PeftModel.from_pretrained(load_model(base), os.fspath(folder)).merge_and_unload()
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
