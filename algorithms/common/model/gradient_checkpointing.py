"""Gradient checkpointing every N decoder layers (the original design's: every 4), for built-in and Hugging Face
models alike.

The decoder's layers are split into chunks of N consecutive layers. During a forward pass with gradients,
the first layer of a chunk runs the whole chunk under ``torch.utils.checkpoint`` (non-reentrant) and the
other layers of the chunk pass their input through; so only each chunk's input is kept for the backward
pass, which recomputes the chunk. Without gradients (sampling, the reference model) the layers run as usual.
The module tree and the ``state_dict`` are untouched: the layers' ``forward`` methods are wrapped in place.

Gradients are exactly those of the plain forward (the recomputation repeats the same operations; the models
run without dropout). Memory: N-layer chunks keep L/N chunk inputs plus one chunk's activations at a time,
instead of all L layers' activations; the time cost is one more forward pass.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

#: the original design's chunk size: a checkpoint every 4 layers
DEFAULT_EVERY = 4


def decoder_layers(model: nn.Module, required: bool = True) -> nn.ModuleList:
    """The decoder's list of layers: the ``ModuleList`` with ``config.num_hidden_layers`` entries (Llama's
    ``model.layers``, GPT-2's ``transformer.h``, ...); the unit gradient checkpointing chunks and FSDP2 shards.

    :param model: a Hugging Face causal LM (or any module)
    :param required: raise when there is none (else an empty list: a module that is no decoder, e.g. a value head)
    """
    count = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == count:
            return module
    if not required:
        return nn.ModuleList()
    raise ValueError(
        f"cannot find the decoder's layer list in {type(model).__name__} (a ModuleList of config.num_hidden_layers "
        "layers); turn gradient_checkpointing off for this model"
    )


def checkpoint_every(model: nn.Module, every: int = DEFAULT_EVERY) -> int:
    """Checkpoint ``model``'s decoder layers in chunks of ``every`` (see the module doc); returns the number of
    chunks. Calling it again re-chunks from the original layer methods."""
    if every < 1:
        raise ValueError(f"checkpoint every N layers needs N >= 1, got {every}")
    layers = decoder_layers(model)
    originals = [getattr(layer, "_plain_forward", layer.forward) for layer in layers]
    for start in range(0, len(layers), every):
        chunk = originals[start : start + every]
        shape: dict[str, bool] = {"tuple": False}  # whether the layers return tuples (older transformers)
        layers[start]._plain_forward = originals[start]
        layers[start].forward = functools.partial(_chunk_forward, chunk, shape)
        for offset in range(1, len(chunk)):
            layers[start + offset]._plain_forward = originals[start + offset]
            layers[start + offset].forward = functools.partial(_passthrough, originals[start + offset], shape)
    return len(range(0, len(layers), every))


def _hidden(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _with_hidden(hidden: torch.Tensor, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def _run(chunk: list, shape: dict[str, bool], args: tuple, kwargs: dict[str, Any]) -> Any:
    """The chunk's layers one after the other; each output's hidden states feed the next layer."""
    out: Any = None
    for forward in chunk:
        out = forward(*args, **kwargs)
        shape["tuple"] = isinstance(out, tuple)
        args, kwargs = _with_hidden(out[0] if shape["tuple"] else out, args, kwargs)
    return out


def _chunk_forward(chunk: list, shape: dict[str, bool], *args: Any, **kwargs: Any) -> Any:
    if not torch.is_grad_enabled():
        return chunk[0](*args, **kwargs)
    return checkpoint(
        lambda hidden: _run(chunk, shape, *_with_hidden(hidden, args, kwargs)),
        _hidden(args, kwargs),
        use_reentrant=False,
    )


def _passthrough(plain: Any, shape: dict[str, bool], *args: Any, **kwargs: Any) -> Any:
    """A layer inside a chunk: its work was done by the chunk's first layer (with gradients only)."""
    if not torch.is_grad_enabled():
        return plain(*args, **kwargs)
    hidden = _hidden(args, kwargs)
    return (hidden,) if shape["tuple"] else hidden
