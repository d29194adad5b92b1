"""KV-cache decoders: the forward passes the sampler runs, one per architecture family.

A decoder holds the KV cache of a batch of rows and answers two calls: :meth:`forward` runs new tokens
(the prompts, then one token per step) and returns the logits of each row's last token; :meth:`select` keeps
(or repeats) rows of the cache, which is how the sampler shares one prompt's prefill among its G completions
and drops finished rows. Two implementations:

- :class:`LlamaDecoder`: Llama-family models (Llama, Qwen2, Mistral without a sliding window), run by this
  module with the model's own weights and modules: a preallocated cache written in place, one
  ``scaled_dot_product_attention`` per layer, no per-step mask or cache objects. About 1.7x fewer
  milliseconds per step than the model's ``forward`` at the built-in tiny size, where overheads dominate.
- :class:`HFDecoder`: any other causal LM, through its own ``forward`` and ``DynamicCache``.

:func:`make_decoder` picks the first that applies. Both give the same logits up to float rounding. A peft
``PeftModel`` runs as the model inside it, whose LoRA layers are injected in place: :class:`LlamaDecoder` then
uses each projection's effective weights ``W + scaling * B @ A`` (of the active adapters; the base's alone while
they are disabled, see :func:`~algorithms.common.model.lora.effective_linear`), computed once per decoder, i.e. once
per :func:`~algorithms.common.generation.sampler.sample` call, so a decoding step costs what it costs without adapters.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from algorithms.common.model.lora import base_network, effective_linear, plain_lora

#: ``config.model_type`` values :class:`LlamaDecoder` runs (same layer layout, RoPE, RMSNorm, gated MLP)
LLAMA_FAMILY = ("llama", "qwen2", "mistral")
#: models with at most this many parameters get fused q/k/v and gate/up projections in :class:`LlamaDecoder`:
#: small matmuls are dominated by per-call overhead, and the fused copy of the weights stays small
FUSE_BELOW = 200_000_000


def forward_parameters(model: nn.Module) -> set[str]:
    """The names of ``model.forward``'s parameters (empty when they cannot be read)."""
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


class HFDecoder:
    """Any Hugging Face causal LM, stepped through its own ``forward`` with a dynamic KV cache."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model = base_network(model)
        parameters = forward_parameters(model)
        self._keep = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
        self._cache_name = "cache" if "cache" in parameters else "past_key_values"  # renamed in transformers 5.2x
        self._cache: Any = None

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """Run ``ids`` ``(b, s)`` at ``positions`` ``(b, s)``; ``attention`` ``(b, cached + s)`` masks the keys.

        :return: ``(b, V)`` logits of each row's last token
        """
        past = {} if self._cache is None else {self._cache_name: self._cache}
        out = self.model(
            input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True, **past, **self._keep
        )
        self._cache = out["cache"] if "cache" in out else out["past_key_values"]
        return out.logits[:, -1]

    def select(self, index: torch.Tensor) -> None:
        """Keep the cache rows at ``index`` ``(b',)``, in that order (an index may repeat)."""
        self._cache.batch_select_indices(index)


def autocast_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype ``torch.autocast`` runs the model's matmuls in here (the sampling stage's precision), or None when
    autocast is off for the model's device type."""
    kind = next(model.parameters()).device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None


class LlamaDecoder:
    """Llama-family decoding with the model's weights and a preallocated KV cache (see the module doc).

    The cache holds ``capacity`` positions per row; tokens are written at the columns they occupy in the
    left-padded batch, so every row writes the same column at each step.

    Under ``torch.autocast`` (a 16-bit sampling stage, :mod:`~algorithms.common.runtime.precision`) the projections'
    weights are cast once, when the decoder is made, instead of at every call as autocast would (a decoding step
    would otherwise read each float32 weight and write its 16-bit copy: more memory traffic than the matmul's own);
    the KV cache and the attention are in that dtype too, the residual stream and the norms in float32, as under
    autocast.

    :param model: a ``LlamaForCausalLM``-like model (see :func:`supports_llama_decoder`)
    :param capacity: prompt columns + new tokens, the most cache columns used
    """

    def __init__(self, model: nn.Module, capacity: int) -> None:
        model = base_network(model)
        config = model.config
        self.model, self.inner, self.capacity = model, model.model, capacity
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.dtype = autocast_dtype(model)  # None: the weights' own dtype, no cast
        fuse = sum(p.numel() for p in model.parameters()) <= FUSE_BELOW
        self._layers = [_LayerWeights.of(layer, fuse, self.dtype) for layer in self.inner.layers]
        head = model.lm_head  # cast once too, when it is a plain linear layer
        self._head = _cast((head.weight, head.bias), self.dtype) if self.dtype is not None and _plain(head) else None
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self._length = 0  # columns written so far

    def _allocate(self, like: torch.Tensor, rows: int) -> None:
        shape = (rows, self.kv_heads, self.capacity, self.head_dim)
        layers = len(self.inner.layers)
        self._keys = [like.new_empty(shape) for _ in range(layers)]
        self._values = [like.new_empty(shape) for _ in range(layers)]

    def _norm(self, weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """HF's ``LlamaRMSNorm``: normalise in float32, back to the input dtype, times the weight."""
        return weight * F.rms_norm(hidden.float(), (hidden.shape[-1],), eps=self.eps).to(hidden.dtype)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """Run ``ids`` ``(b, s)`` at ``positions`` ``(b, s)``; ``attention`` ``(b, cached + s)`` masks the keys.

        :return: ``(b, V)`` logits of each row's last token
        """
        if self.dtype is None:
            return self._forward(ids, positions, attention)
        with torch.autocast(ids.device.type, enabled=False):  # the weights are cast already
            return self._forward(ids, positions, attention)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        rows, new = ids.shape
        start, end = self._length, self._length + new
        hidden = self.inner.embed_tokens(ids)  # (b, s, H)
        cos, sin = self.inner.rotary_emb(hidden, positions)  # (b, s, D)
        hidden = hidden.view(rows * new, -1)  # (b s, H): 2-D, so each projection is one matmul, no reshapes
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (b, 1, s, D)
        visible = attention[:, None, None, :end].bool()  # (b, 1, 1, end): keys that are not padding
        if new > 1:  # causal within the new tokens; each query also sees itself (a padding query must see something)
            causal = torch.ones((new, end), dtype=torch.bool, device=ids.device).tril(start)  # (s, end)
            itself = torch.zeros_like(causal)
            itself[:, start:] = torch.eye(new, dtype=torch.bool, device=ids.device)
            visible = (visible & causal) | itself
        bias = None  # the additive mask SDPA would make of ``visible`` in every layer (0 seen, -inf not), made once
        heads, rotated = self.heads, self.heads + self.kv_heads  # queries, then keys: the rows RoPE turns
        dtype = self.dtype or hidden.dtype  # the matmuls' and the cache's
        for i, weights in enumerate(self._layers):
            qkv = weights.qkv(self._norm(weights.input_norm, hidden).to(dtype))  # (b, s, (h + 2 kv) D)
            qkv = qkv.view(rows, new, -1, self.head_dim).transpose(1, 2)  # (b, h + 2 kv, s, D)
            qk, v = qkv[:, :rotated], qkv[:, rotated:]
            qk = (qk * cos + _rotate_half(qk) * sin).to(dtype)  # queries and keys in one pass
            q, k = qk[:, :heads], qk[:, heads:]
            if bias is None:
                bias = torch.zeros(visible.shape, dtype=dtype, device=q.device).masked_fill_(~visible, -torch.inf)
            if not self._keys:
                self._allocate(k, rows)
            self._keys[i].narrow(2, start, new).copy_(k)
            self._values[i].narrow(2, start, new).copy_(v)
            keys, values = self._keys[i].narrow(2, 0, end), self._values[i].narrow(2, 0, end)
            out = _attention(q, keys, values, bias, weights.scaling)  # (b, h, s, D)
            hidden = hidden + F.linear(out.transpose(1, 2).reshape(rows * new, -1), *weights.out)
            hidden = hidden + weights.mlp(self._norm(weights.post_norm, hidden).to(dtype))
        self._length = end
        last = self._norm(self.inner.norm.weight, hidden.view(rows, new, -1)[:, -1])  # (b, H)
        if self._head is not None:
            return F.linear(last.to(dtype), *self._head)
        if self.dtype is not None:  # a head that is not a plain linear layer: autocast, as the model's forward
            with torch.autocast(last.device.type, dtype=self.dtype):
                return self.model.lm_head(last)
        return self.model.lm_head(last)

    def select(self, index: torch.Tensor) -> None:
        """Keep the cache rows at ``index`` ``(b',)``, in that order (an index may repeat)."""
        for cache in (self._keys, self._values):
            for i, layer in enumerate(cache):
                kept = layer.new_empty((len(index), *layer.shape[1:]))
                kept[:, :, : self._length] = layer[index, :, : self._length]
                cache[i] = kept

    # ---------------------------------------------------------------- kept across turns (generation.continuation)
    @property
    def length(self) -> int:
        """The cache columns written so far."""
        return self._length

    def snapshot(self, index: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of the keys and values of the cache rows at ``index``, columns ``[0, length)``: one
        ``(b, kv, length, D)`` tensor per layer each."""
        keys = [layer[index, :, : self._length].clone() for layer in self._keys]
        return keys, [layer[index, :, : self._length].clone() for layer in self._values]

    def adopt(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Hold ``keys`` and ``values`` (one ``(b, kv, columns, D)`` tensor per layer) as the cache, every column
        written; the capacity grows to fit them."""
        self._keys, self._values = list(keys), list(values)
        self._length = keys[0].shape[2]
        self.capacity = max(self.capacity, self._length)

    def fork(self, index: torch.Tensor, capacity: int) -> LlamaDecoder:
        """A new decoder (the same weights) holding copies of the cache rows at ``index`` ``(b,)``, in that order,
        with room for ``capacity`` columns; this one is unchanged (its rows may be forked again)."""
        other = copy.copy(self)
        other.capacity = max(capacity, self._length)
        other._keys, other._values = [], []
        for mine, theirs in ((self._keys, other._keys), (self._values, other._values)):
            for layer in mine:
                grown = layer.new_empty((len(index), layer.shape[1], other.capacity, layer.shape[3]))
                grown[:, :, : self._length] = layer[index, :, : self._length]
                theirs.append(grown)
        return other


@dataclass
class _LayerWeights:
    """One decoder layer's weights as :class:`LlamaDecoder` uses them: ``(weight, bias)`` pairs for
    ``F.linear`` (no module-call overhead), the q/k/v and gate/up projections fused into one matmul each when
    ``fuse`` (a concatenated copy, made once per :func:`~algorithms.common.generation.sampler.sample` call). A LoRA
    projection contributes its effective weights (:func:`~algorithms.common.model.lora.effective_linear`)."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    projections: list[tuple[torch.Tensor, torch.Tensor | None]]  # q, k, v, or the fused qkv
    out: tuple[torch.Tensor, torch.Tensor | None]
    gate_up: list[tuple[torch.Tensor, torch.Tensor | None]]  # gate, up, or the fused gate_up
    down: tuple[torch.Tensor, torch.Tensor | None]
    act: Any
    scaling: float

    @classmethod
    def of(cls, layer: nn.Module, fuse: bool, dtype: torch.dtype | None = None) -> _LayerWeights:
        """The weights of ``layer``, fused when ``fuse``, cast to ``dtype`` when given (else as they are)."""
        attn, mlp = layer.self_attn, layer.mlp
        qkv = [effective_linear(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
        gate_up = [effective_linear(m) for m in (mlp.gate_proj, mlp.up_proj)]
        if fuse:
            qkv, gate_up = [_concatenated(qkv)], [_concatenated(gate_up)]
        return cls(
            input_norm=layer.input_layernorm.weight,
            post_norm=layer.post_attention_layernorm.weight,
            projections=[_cast(pair, dtype) for pair in qkv],
            out=_cast(effective_linear(attn.o_proj), dtype),
            gate_up=[_cast(pair, dtype) for pair in gate_up],
            down=_cast(effective_linear(mlp.down_proj), dtype),
            act=mlp.act_fn,
            scaling=attn.scaling,
        )

    def qkv(self, x: torch.Tensor) -> torch.Tensor:
        """``(b, s, (h + 2 kv) D)``: the query, key and value projections side by side."""
        outs = [F.linear(x, weight, bias) for weight, bias in self.projections]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """Llama's MLP: ``down(act(gate(x)) * up(x))``."""
        outs = [F.linear(x, weight, bias) for weight, bias in self.gate_up]
        gate, up = outs if len(outs) == 2 else outs[0].chunk(2, dim=-1)
        return F.linear(self.act(gate) * up, *self.down)


def _cast(
    pair: tuple[torch.Tensor, torch.Tensor | None], dtype: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A ``(weight, bias)`` pair in ``dtype`` (unchanged when None)."""
    if dtype is None:
        return pair
    weight, bias = pair
    return weight.to(dtype), None if bias is None else bias.to(dtype)


def _attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scaling: float
) -> torch.Tensor:
    """Attention of ``q`` ``(b, h, s, D)`` over the cache's ``keys`` and ``values`` ``(b, kv, T, D)`` with the additive
    mask ``bias`` ``(b, 1, s, T)``; query head ``i`` reads key head ``i // (h / kv)``, as ``enable_gqa`` does.

    One query per row (a decoding step): two batched matmuls, each key head's queries side by side, and the softmax in
    float32. ``scaled_dot_product_attention``'s CPU kernel is made for many queries: for one it took 1.2x as long in
    float32 and 6x as long in bf16 (135M-parameter Llama, 32 rows). Several queries (a prefill): that kernel.
    """
    rows, heads, new, width = q.shape
    groups = keys.shape[1]
    if new > 1:
        return F.scaled_dot_product_attention(
            q, keys, values, attn_mask=bias, scale=scaling, enable_gqa=groups != heads
        )
    grouped = q.reshape(rows, groups, heads // groups, width)  # (b, kv, h / kv, D)
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).float() * scaling + bias  # (b, kv, h / kv, T)
    weights = torch.softmax(scores, dim=-1).to(values.dtype)
    return torch.matmul(weights, values).reshape(rows, heads, 1, width)


def _concatenated(pairs: list[tuple[torch.Tensor, torch.Tensor | None]]) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight = torch.cat([w for w, _ in pairs])
    biases = [b for _, b in pairs]
    if all(b is None for b in biases):
        return weight, None
    return weight, torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in pairs])


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def supports_llama_decoder(model: nn.Module) -> bool:
    """Whether :class:`LlamaDecoder` runs ``model``: a Llama-family type with the standard module layout (inside a
    PeftModel too, with plain LoRA projections)."""
    model = base_network(model)
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in LLAMA_FAMILY:
        return False
    if getattr(config, "use_sliding_window", False) or getattr(config, "sliding_window", None):
        return False
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if inner is None or layers is None or not hasattr(model, "lm_head") or not hasattr(inner, "rotary_emb"):
        return False
    layer = layers[0]
    attention = getattr(layer, "self_attn", None)
    mlp = getattr(layer, "mlp", None)
    projections = ("q_proj", "k_proj", "v_proj", "o_proj")
    return (
        all(hasattr(attention, name) for name in (*projections, "scaling"))
        and all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn"))
        and all(
            hasattr(getattr(layer, name, None), "weight") for name in ("input_layernorm", "post_attention_layernorm")
        )
        and all(_is_plain_linear(each) for each in layers)
    )


def _is_plain_linear(layer: nn.Module) -> bool:
    """Whether every projection of a decoder layer computes ``F.linear(x, weight, bias)`` with the weights
    :func:`~algorithms.common.model.lora.effective_linear` gives (a plain ``nn.Linear``, or a vanilla LoRA layer over
    one), which the decoder calls directly; other modules (fake-quantised, INT8, other adapters) run through the
    model's own forward."""
    attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    modules = [getattr(attention, name, None) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
    modules += [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    return all(_plain(m.base_layer) and plain_lora(m) if hasattr(m, "lora_A") else _plain(m) for m in modules)


def _plain(module: nn.Module | None) -> bool:
    return isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward


def make_decoder(model: nn.Module, capacity: int, kind: str = "auto") -> HFDecoder | LlamaDecoder:
    """The decoder for ``model``: ``"auto"`` (:class:`LlamaDecoder` when it applies), ``"llama"`` or ``"hf"``.

    :param capacity: prompt columns + new tokens
    """
    if kind not in ("auto", "llama", "hf"):
        raise ValueError(f"decoder must be 'auto', 'llama' or 'hf', got {kind!r}")
    if kind == "llama" and not supports_llama_decoder(model):
        raise ValueError(f"decoder='llama' needs a Llama-family model {LLAMA_FAMILY}; use 'auto' or 'hf'")
    if kind == "llama" or (kind == "auto" and supports_llama_decoder(model)):
        return LlamaDecoder(model, capacity)
    return HFDecoder(model)
