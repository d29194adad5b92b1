"""The model folder vLLM loads, and the weights pushed to it, in the form that makes vLLM's log-probs the sampler's.

vLLM reports a sampled token's log-prob under the softmax of the model's **raw** logits (``logprobs_mode=
"raw_logprobs"``, taken before its temperature and top-p), over the model's whole vocabulary. The sampler's
definition (:mod:`~algorithms.common.generation.sampler`) is the full softmax of the temperature-scaled logits over
the ids ``< vocab_size``. The folder written here closes that gap exactly, in the weights:

- **vocabulary**: the embedding table and the output layer keep their first ``vocab_size`` rows (the ids the
  tokenizer uses; the rest are never input nor sampled), and ``config.vocab_size`` says so;
- **temperature**: when it is not 1, the output layer is divided by it (``lm_head.weight / T``, untied from the
  embeddings), and vLLM samples at temperature 1: its raw logits are then ``logits / T``, so its samples are those of
  temperature ``T`` and its raw log-probs the sampler's; top-k and top-p select from the same distribution.

:class:`WeightFormat` records the two; every push goes through :meth:`WeightFormat.convert`, so the engine always
holds the trainer's weights in that form. A marker file (``grpo_gym_vllm.json``) in the folder tells a client which
form a server's folder has. No ``generation_config.json`` is written: vLLM would otherwise apply its defaults (a
repetition penalty, say) to requests that leave them out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from algorithms.common.generation.engines.base import EngineError, SamplingSettings, Weights, named_weights
from algorithms.common.model.lora import base_network, is_peft_model

MARKER = "grpo_gym_vllm.json"
#: attention head sizes vLLM's CPU backend runs (``CPUAttentionBackend.get_supported_head_sizes``, vLLM 0.32)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


@dataclass(frozen=True)
class WeightFormat:
    """How the trainer's weights are changed on their way to vLLM (see the module doc).

    :param vocab_size: rows kept in the embedding and output tables (None: all)
    :param temperature: the output layer is divided by it (1: unchanged)
    :param embed_name: the checkpoint name of the input embedding
    :param head_name: the checkpoint name of the output layer
    :param tied: whether the folder ties the output layer to the embedding (only when nothing is folded into it)
    """

    vocab_size: int | None
    temperature: float
    embed_name: str
    head_name: str
    tied: bool

    @classmethod
    def of(cls, model: nn.Module, settings: SamplingSettings) -> WeightFormat:
        """The format for ``model`` (a Hugging Face causal LM or a peft model) sampled with ``settings``."""
        network = base_network(model)
        names: dict[int, str] = {}
        for name, parameter in network.named_parameters(remove_duplicate=False):
            names.setdefault(id(parameter), name)  # a tied table's first name: the embedding's
        embed = network.get_input_embeddings().weight
        head = network.get_output_embeddings().weight
        embed_name, head_name = names[id(embed)], names[id(head)]
        embed_name = embed_name.replace(".base_layer.", ".")
        head_name = head_name.replace(".base_layer.", ".") if head is not embed else "lm_head.weight"
        rows = embed.shape[0]
        vocab = settings.vocab_size if settings.vocab_size is not None and settings.vocab_size < rows else None
        tied = bool(getattr(network.config, "tie_word_embeddings", False)) and settings.temperature == 1.0
        return cls(vocab, float(settings.temperature), embed_name, head_name, tied)

    @property
    def sample_temperature(self) -> float:
        """The temperature to ask vLLM for: 1 (the real one is in the weights)."""
        return 1.0

    def convert(self, weights: Weights) -> dict[str, torch.Tensor]:
        """``weights`` (checkpoint names; a LoRA model merged) in this format, as a new dict of float tensors."""
        state = dict(named_weights(weights))
        if self.embed_name not in state:
            raise EngineError(f"the weights have no {self.embed_name!r} (the input embedding): pass the whole model")
        if self.head_name not in state:
            state[self.head_name] = state[self.embed_name]  # a tied model's state dict may name it once
        rows = slice(None) if self.vocab_size is None else slice(0, self.vocab_size)
        state[self.embed_name] = state[self.embed_name][rows]
        head = state[self.head_name][rows]
        # kept when tied too: vLLM's in-place reload of a tied model keeps the old output layer unless it is pushed
        state[self.head_name] = head / self.temperature if self.temperature != 1.0 else head
        return {name: tensor.detach().contiguous() for name, tensor in state.items()}

    def config(self, model: nn.Module) -> dict[str, Any]:
        """The Hugging Face config of the folder: the model's, with this format's vocabulary and tying."""
        config = base_network(model).config.to_dict()
        if self.vocab_size is not None:
            config["vocab_size"] = self.vocab_size
        config["tie_word_embeddings"] = self.tied
        config.pop("_name_or_path", None)
        return config


def check_vllm_can_run(model: nn.Module) -> None:
    """Fail early, naming the fix, for a model vLLM cannot load here: an architecture it does not know, or (on the
    CPU) an attention head size its CPU backend does not run."""
    import vllm
    from vllm.platforms import current_platform

    config = base_network(model).config
    known = vllm.ModelRegistry.get_supported_archs()
    architectures = list(getattr(config, "architectures", None) or [])
    if architectures and not any(name in known for name in architectures):
        raise EngineError(
            f"vLLM {vllm.__version__} cannot run {architectures}: use rollout_engine='builtin' or 'hf', or a model "
            "vLLM supports"
        )
    heads = getattr(config, "num_attention_heads", None)
    head_size = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
    if current_platform.is_cpu() and head_size is not None and head_size not in CPU_HEAD_SIZES:
        raise EngineError(
            f"vLLM's CPU backend runs attention head sizes {list(CPU_HEAD_SIZES)}, this model's is {head_size} "
            "(hidden_size / num_attention_heads): use rollout_engine='builtin' or 'hf', or change the model's sizes"
        )


def write_folder(model: nn.Module, folder: str | os.PathLike, weights: dict[str, torch.Tensor], fmt: WeightFormat):
    """Write the folder vLLM loads: ``config.json``, ``model.safetensors`` (``weights``, already converted) and the
    marker file; returns the folder as a ``Path``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    architectures = base_network(model).config.architectures or [type(base_network(model)).__name__]
    config = {**fmt.config(model), "architectures": architectures}
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str), encoding="utf-8")
    save_file(_unshared(weights), str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / MARKER).write_text(json.dumps(asdict(fmt), indent=2), encoding="utf-8")
    return folder


def export_folder(
    model: nn.Module, settings: SamplingSettings, folder: str | os.PathLike, adapters: bool = False
) -> tuple[Path, WeightFormat]:
    """Write the folder vLLM loads for ``model`` sampled with ``settings``: its weights in :class:`WeightFormat`
    (a peft model's merged, or with ``adapters`` its base weights alone); returns the folder and the format.

    :param model: a Hugging Face causal LM or a peft model
    :param settings: how the engine samples (the temperature and vocabulary go into the weights)
    :param folder: the folder to write (created)
    :param adapters: write a peft model's base weights (its adapters are pushed as LoRA requests)
    """
    fmt = WeightFormat.of(model, settings)
    weights = fmt.convert(adapter_weights(model) if adapters else model)
    return write_folder(model, folder, weights, fmt), fmt


def write_weights(folder: str | os.PathLike, weights: dict[str, torch.Tensor]) -> Path:
    """Write ``weights`` as ``folder/model.safetensors`` (what vLLM's ``reload_weights(weights_path=folder)`` reads)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(_unshared(weights), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def read_marker(folder: str | os.PathLike) -> WeightFormat | None:
    """The :class:`WeightFormat` of a folder written by :func:`write_folder`, or None (another folder)."""
    path = Path(folder) / MARKER
    if not path.is_file():
        return None
    return WeightFormat(**json.loads(path.read_text(encoding="utf-8")))


def adapter_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """A peft model's base weights under their checkpoint names (adapters left out): what vLLM loads beside adapters
    pushed as LoRA requests."""
    if not is_peft_model(model):
        raise EngineError("lora='adapters' pushes a peft model's adapters: the model has none (use lora='merged')")
    for name, tensor in base_network(model).state_dict().items():
        if ".lora_" not in name:
            yield name.replace(".base_layer.", "."), tensor.detach()


def lora_rank(model: nn.Module) -> int:
    """The largest LoRA rank among a peft model's adapters (vLLM's ``max_lora_rank`` must reach it)."""
    configs = getattr(model, "peft_config", {}) or {}
    return max((int(getattr(c, "r", 0) or 0) for c in configs.values()), default=0)


def _unshared(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensors safetensors can write: no two sharing memory (a tied head is cloned), contiguous, on the CPU."""
    seen: set[int] = set()
    out = {}
    for name, tensor in weights.items():
        tensor = tensor.detach().cpu().contiguous()
        key = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if key in seen else tensor
        seen.add(key)
    return out
