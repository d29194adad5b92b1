"""INT8 for a causal LM's linear layers: fake-quantised training (QAT), post-training quantisation (PTQ), and
a real INT8 export that loads with one call.

One scheme, the same in training and at inference:

- **weights**: per output channel, symmetric int8: ``scale = max|w_row| / 127``, levels ``-127..127``;
- **activations**: per token (one row of a layer's input), dynamic, symmetric: ``x ≈ step * q`` with
  ``step = max|x_row| / 63.5`` and ``q`` in ``-64..64``. That is what x86's int8 kernel computes (fbgemm's
  ``quantized::linear_dynamic``, the kernel behind ``torch.ao.nn.quantized.dynamic.Linear``): it keeps activations
  to about 7 bits (torch's ``reduce_range``) so that its AVX2 sums of u8 x s8 pairs cannot saturate.

Per-token scales keep every row of a batch independent of the others, so batching requests never changes what a
row computes (a per-tensor activation scale would). fbgemm picks one activation scale per call; the export gets
per-token scales from it by dividing each token by its own ``max|x|`` and adding one anchor row ``[-1, 1, 0, ...]``
that pins the call's range to ``[-1, 1]``, then multiplying each output row back by its token's ``max|x|``.

The fake quantisers are torch's own op, :func:`torch.fake_quantize_per_channel_affine` (the op behind
``torch.ao.quantization.FakeQuantize``, with its straight-through gradient), applied per channel to the weights and
per token to the activations; torch.ao's eager ``prepare_qat``/``convert`` API is deprecated in this torch and has
no per-token activation scheme. The output head (tied to the embeddings in the built-in models) and the embeddings
stay float32.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from algorithms.common.model.lora import is_peft_model

#: the int8 weight levels are -WEIGHT_QMAX..WEIGHT_QMAX
WEIGHT_QMAX = 127
#: activation levels are -ACT_QMAX..ACT_QMAX with a step of max|x| / ACT_STEPS (fbgemm's reduce_range on x86)
ACT_QMAX, ACT_STEPS = 64, 63.5
#: the file and metadata of an INT8 export folder (next to ``config.json`` and the tokenizer's files)
WEIGHTS_FILE, METADATA_FILE = "model_int8.safetensors", "quantization.json"
FORMAT = "grpo-gym-int8"
_TINY = 1e-12


# ---------------------------------------------------------------------------------------------- the two quantisers
def weight_scales(weight: torch.Tensor) -> torch.Tensor:
    """``(out,)`` per-channel symmetric scales of a ``(out, in)`` weight: ``max|w_row| / 127``."""
    return weight.detach().abs().amax(dim=1).float().clamp(min=_TINY) / WEIGHT_QMAX


def fake_quantize_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` rounded to its int8 grid (per channel, symmetric); the gradient passes straight through."""
    scales = weight_scales(weight)
    zeros = torch.zeros_like(scales, dtype=torch.int32)
    return torch.fake_quantize_per_channel_affine(weight.float(), scales, zeros, 0, -WEIGHT_QMAX, WEIGHT_QMAX).to(
        weight.dtype
    )


def fake_quantize_tokens(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``(..., in)`` rounded per token to ``step * q``, ``step = max|x_token| / 63.5``, ``|q| <= 64``: each token
    divided by its ``max|x|`` (not differentiated), rounded on the fixed grid of ``[-1, 1]``, scaled back, which is
    the arithmetic of :class:`Int8Linear`'s kernels; the gradient passes straight through."""
    flat = x.reshape(-1, x.shape[-1]).float()  # (M, in)
    absmax = flat.detach().abs().amax(dim=1, keepdim=True).clamp(min=_TINY)  # (M, 1)
    unit = torch.fake_quantize_per_tensor_affine(flat / absmax, 1 / ACT_STEPS, 0, -ACT_QMAX, ACT_QMAX)
    return (unit * absmax).view(x.shape).to(x.dtype)


class FakeQuantLinear(nn.Linear):
    """A linear layer that trains through INT8 rounding (QAT): ``F.linear(fq_tokens(x), fq_weight(W), b)``.

    It shares its ``weight`` and ``bias`` parameters with the layer it wraps (:meth:`wrap`), so an optimizer built
    before or after the swap trains the same tensors, and the state dict keys stay those of ``nn.Linear``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(fake_quantize_tokens(x), fake_quantize_weight(self.weight), self.bias)

    @classmethod
    def wrap(cls, linear: nn.Linear) -> FakeQuantLinear:
        """A fake-quantised view of ``linear`` (same parameter objects)."""
        return _share_parameters(cls, linear)


def _share_parameters(cls: type[nn.Linear], linear: nn.Linear) -> nn.Linear:
    new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
    new.weight = linear.weight
    new.bias = linear.bias
    return new


# ---------------------------------------------------------------------------------------------- the INT8 layer
@functools.cache
def _fbgemm_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(torch.ops.quantized, "linear_dynamic")


class Int8Linear(nn.Module):
    """A linear layer with int8 weights (per-channel scales) and per-token dynamic int8 activations.

    ``kernel="fbgemm"`` (x86 CPUs) runs torch's int8 GEMM (``quantized::linear_dynamic``, u8 x s8 -> s32);
    ``"reference"`` (other devices) computes the same integer products in float32 (exact while
    ``in_features * 64 * 127 < 2**24``). Both give the rounding :func:`fake_quantize_tokens` and
    :func:`fake_quantize_weight` train with. The state dict holds ``weight_int8`` (int8), ``weight_scale`` and
    ``bias`` (float32).

    :param in_features: input width (at least 2: the fbgemm kernel's anchor row needs two columns)
    :param out_features: output width
    :param bias: whether the layer has a bias
    :param kernel: ``"auto"`` (fbgemm on CPU when torch has it, else reference), ``"fbgemm"`` or ``"reference"``
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, kernel: str = "auto") -> None:
        super().__init__()
        if kernel not in ("auto", "fbgemm", "reference"):
            raise ValueError(f"kernel must be 'auto', 'fbgemm' or 'reference', got {kernel!r}")
        if in_features < 2:
            raise ValueError(f"Int8Linear needs in_features >= 2, got {in_features}")
        self.in_features, self.out_features, self.kernel = in_features, out_features, kernel
        self.register_buffer("weight_int8", torch.zeros((out_features, in_features), dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(out_features))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        anchor = torch.zeros((1, in_features))
        anchor[0, :2] = torch.tensor([-1.0, 1.0])
        self.register_buffer("anchor", anchor, persistent=False)  # the row that pins fbgemm's range to [-1, 1]
        self._packed: Any = None  # fbgemm's packed weights, made at the first forward after a change

    @classmethod
    def from_float(cls, linear: nn.Linear, kernel: str = "auto") -> Int8Linear:
        """Quantise a float ``nn.Linear`` (or :class:`FakeQuantLinear`): round its weight to the int8 grid."""
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, kernel=kernel)
        weight = linear.weight.detach().float().cpu()
        scales = weight_scales(weight)
        q = torch.round(weight / scales[:, None]).clamp_(-WEIGHT_QMAX, WEIGHT_QMAX)
        layer.weight_int8.copy_(q.to(torch.int8))
        layer.weight_scale.copy_(scales)
        if linear.bias is not None:
            layer.bias.copy_(linear.bias.detach().float())
        return layer.to(linear.weight.device)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._packed = None

    def _apply(self, fn: Any, recurse: bool = True) -> Int8Linear:  # .to(), .cpu(): repack from the moved buffers
        self._packed = None
        return super()._apply(fn, recurse)

    def uses_fbgemm(self, device: torch.device) -> bool:
        """Whether a forward on ``device`` runs fbgemm's int8 GEMM."""
        if self.kernel == "reference":
            return False
        usable = device.type == "cpu" and _fbgemm_available()
        if self.kernel == "fbgemm" and not usable:
            raise RuntimeError("kernel='fbgemm' needs a CPU tensor and a torch build with fbgemm; use 'reference'")
        return usable

    def _pack(self) -> Any:
        with warnings.catch_warnings():  # torch warns that quantized tensor types will go; the kernel needs one
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
            zeros = torch.zeros(self.out_features, dtype=torch.long)
            weight = torch._make_per_channel_quantized_tensor(self.weight_int8, self.weight_scale.double(), zeros, 0)
            return torch.ops.quantized.linear_prepack(weight, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float()  # (M, in)
        absmax = torch.linalg.vector_norm(flat, ord=math.inf, dim=1, keepdim=True).clamp_(min=_TINY)  # (M, 1)
        if self.uses_fbgemm(flat.device):
            if self._packed is None:
                self._packed = self._pack()
            unit = torch.cat([flat / absmax, self.anchor])  # (M + 1, in): every token within [-1, 1], and the anchor
            out = torch.ops.quantized.linear_dynamic(unit, self._packed, True)[:-1]  # (M, out)
        else:
            q = torch.round(flat / absmax * ACT_STEPS).clamp_(-ACT_QMAX, ACT_QMAX)  # (M, in) integers
            out = F.linear(q, self.weight_int8.float()) * (self.weight_scale / ACT_STEPS)  # (M, out)
        out = torch.addcmul(self.bias, out, absmax) if self.bias is not None else out * absmax
        return out.view(*x.shape[:-1], self.out_features).to(x.dtype)


# ---------------------------------------------------------------------------------------------- whole models
def quantizable_linears(model: nn.Module) -> list[str]:
    """Names of the linear layers INT8 applies to: every ``nn.Linear`` but the output head (and its tied
    embeddings), which stays float."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, (nn.Linear, Int8Linear)) and module is not head and module.in_features >= 2
    ]


def _swap(model: nn.Module, names: list[str], make: Any) -> nn.Module:
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, make(getattr(parent, child)))
    return model


def prepare_qat(model: nn.Module) -> nn.Module:
    """Make ``model`` train through INT8 rounding, in place: its linear layers become :class:`FakeQuantLinear`
    views of the same parameters (the optimizer, the state dict and ``save()`` are unchanged)."""
    names = [n for n in quantizable_linears(model) if type(model.get_submodule(n)) is nn.Linear]
    return _swap(model, names, FakeQuantLinear.wrap)


def strip_qat(model: nn.Module) -> nn.Module:
    """Undo :func:`prepare_qat` in place: plain ``nn.Linear`` layers over the same (trained) parameters."""
    names = [n for n, m in model.named_modules() if isinstance(m, FakeQuantLinear)]
    return _swap(model, names, lambda layer: _share_parameters(nn.Linear, layer))


def quantize_int8(model: nn.Module, kernel: str = "auto") -> nn.Module:
    """An INT8 copy of ``model`` (``model`` itself is unchanged): every quantisable linear layer becomes an
    :class:`Int8Linear` rounded from its float (or QAT-trained) weights. Applied to a model trained without fake
    quantisation, this is post-training quantisation (PTQ). A peft model's LoRA adapters are merged into its
    weights first (the copy's), so the export is a plain model."""
    quantized = copy.deepcopy(model).cpu().eval()
    if is_peft_model(quantized):
        quantized = quantized.merge_and_unload()
    names = quantizable_linears(quantized)
    return _swap(quantized, names, lambda layer: Int8Linear.from_float(layer, kernel=kernel))


def int8_layers(model: nn.Module) -> list[str]:
    """Names of the :class:`Int8Linear` layers of ``model``."""
    return [name for name, module in model.named_modules() if isinstance(module, Int8Linear)]


# ---------------------------------------------------------------------------------------------- files
def save_int8(model: nn.Module, directory: str | os.PathLike, tokenizer: Any = None) -> Path:
    """Write an INT8 model (from :func:`quantize_int8`) to a folder that :func:`load_int8` reads back: the
    Hugging Face ``config.json``, the int8 weights and float scales in ``model_int8.safetensors``, the scheme in
    ``quantization.json``, and the tokenizer's files when given."""
    from safetensors.torch import save_model

    names = int8_layers(model)
    if not names:
        raise ValueError("the model has no INT8 layers: quantise it first with quantize_int8(model)")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(folder)
    save_model(model, str(folder / WEIGHTS_FILE))
    metadata = {
        "format": FORMAT,
        "version": 1,
        "weights": "int8, per output channel, symmetric (scale = max|w| / 127)",
        "activations": "per token, dynamic, symmetric (step = max|x| / 63.5, |q| <= 64)",
        "layers": names,
    }
    (folder / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def is_int8_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder written by :func:`save_int8`."""
    return (Path(path) / METADATA_FILE).is_file()


def load_int8(directory: str | os.PathLike, kernel: str = "auto", trust_remote_code: bool = False) -> nn.Module:
    """Load an INT8 model written by :func:`save_int8`, ready to generate (eval mode, CPU). The folder is checked like
    any Hugging Face folder first (:func:`grpo_gym.hub.check_hf_source`), and the loaded scales after: every
    weight scale finite and positive, every bias finite (else a ``ValueError`` naming the layer).

    :param directory: the folder
    :param kernel: the :class:`Int8Linear` kernel (``"auto"``: fbgemm where torch has it)
    :param trust_remote_code: run the folder's own model code (``"auto_map"``); refused by default
    """
    from safetensors.torch import load_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpo_gym.hub import check_hf_source, check_loaded_weights, read_config_file

    folder = Path(directory)
    if not is_int8_folder(folder):
        raise ValueError(f"{os.fspath(directory)!r} is not an INT8 export (no {METADATA_FILE}): use save_int8")
    safety = check_hf_source(folder, trust_remote_code=trust_remote_code, what="INT8 export folder")
    metadata = read_config_file(folder / METADATA_FILE)
    layers = metadata.get("layers") if isinstance(metadata, dict) else None
    if not isinstance(layers, list) or metadata.get("format") != FORMAT:
        raise ValueError(f"{folder / METADATA_FILE} is not a {FORMAT} file")
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder, **safety), **safety)
    names = [str(name) for name in layers]
    unknown = sorted(set(names) - set(quantizable_linears(model)))
    if unknown:
        raise ValueError(f"{folder / METADATA_FILE} names layers the model has no linear layer for: {unknown[:5]}")

    def empty(layer: nn.Linear) -> Int8Linear:
        return Int8Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, kernel=kernel)

    _swap(model, names, empty)
    weights, again = folder / WEIGHTS_FILE, "the export is corrupt: write it again with save_int8 (grpo-gym quantize)"
    try:  # not strict: a tensor the file lacks is named below, not in torch's "Error(s) in loading state_dict"
        missing, unexpected = load_model(model, str(weights), strict=False)
    except (RuntimeError, OSError, ValueError) as error:  # a tensor of another shape; a file safetensors cannot read
        detail = " ".join(str(error).split())[:300]
        raise ValueError(
            f"{weights}: its weights do not fit the model its config.json describes ({detail}); {again}"
        ) from None
    if unexpected:  # a tensor the model has no place for: another model's file
        shown = ", ".join(repr(key) for key in sorted(unexpected)[:3])
        raise ValueError(
            f"{weights} holds tensors the model its config.json describes has no place for ({shown}); {again}"
        )
    check_loaded_weights({"missing_keys": missing}, model, f"INT8 export {os.fspath(weights)!r}", again)
    check_int8_scales(model, weights)
    return model.eval()


def check_int8_scales(model: nn.Module, where: str | os.PathLike = "the model") -> None:
    """Raise a ``ValueError`` naming the layer (and ``where``) when an :class:`Int8Linear` has a weight scale that is
    not finite and positive, or a bias that is not finite: such a layer makes every output NaN."""
    for name, layer in model.named_modules():
        if not isinstance(layer, Int8Linear):
            continue
        scale = layer.weight_scale
        if not bool((torch.isfinite(scale) & (scale > 0)).all()):
            raise ValueError(
                f"{os.fspath(where)}: layer {name!r} has weight scales that are not finite positive numbers; the "
                "export is corrupt: write it again with save_int8 (grpo-gym quantize)"
            )
        if layer.bias is not None and not bool(torch.isfinite(layer.bias).all()):
            raise ValueError(f"{os.fspath(where)}: layer {name!r} has a NaN or infinite bias; write the export again")
