"""The engine seam: what every rollout engine takes and gives, and the helpers the engines share.

An engine samples completions of prompts given as token ids and returns the sampled ids with the log-prob of each
sampled token; :meth:`RolloutEngine.update_weights` gives it the trainer's new weights. Token ids in, token ids out:
no engine re-tokenises, so multi-turn and tool episodes keep their exact tokens.

Every engine follows the sampler's single definition of a token's log-prob
(:mod:`~algorithms.common.generation.sampler`): the log-prob under the **full** softmax of the temperature-scaled
logits over the ids ``< vocab_size``; top-k and top-p only decide which token is drawn. So a fresh rollout's
importance ratio against the update's forward pass is 1, up to the engine's float rounding.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from algorithms.common.generation.sampler import MIN_TEMPERATURE, Completions
from algorithms.common.model.lora import base_network, effective_linear, is_lora_linear

#: prompts: a left-padded ``(B, T)`` id tensor (with its attention mask), or one list of ids per prompt
Prompts = torch.Tensor | Sequence[Sequence[int]]
#: new weights: a model (its state dict is read), a state dict, or an iterable of ``(name, tensor)`` pairs, with the
#: names of the Hugging Face checkpoint (``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``)
Weights = nn.Module | Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]


class EngineError(RuntimeError):
    """An engine could not start, sample or take new weights; the message says why and what to do."""


@dataclass(frozen=True)
class SamplingSettings:
    """How an engine samples; fixed for its life (the policy's settings).

    :param eos_token_id: id (or ids) that end a completion; the EOS itself is kept
    :param pad_token_id: id written after the EOS, never drawn unless it is also an EOS id
    :param temperature: logits are divided by it before sampling and in the log-probs
    :param top_p: nucleus sampling mass; 1 disables it
    :param top_k: keep only the ``top_k`` most likely ids before top-p; 0 disables it
    :param vocab_size: ids ``>= vocab_size`` are never sampled and excluded from the softmax (None: all ids)
    """

    eos_token_id: int | tuple[int, ...]
    pad_token_id: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= MIN_TEMPERATURE:
            raise ValueError(f"temperature must be >= {MIN_TEMPERATURE}, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """The EOS ids as a tuple."""
        return (self.eos_token_id,) if isinstance(self.eos_token_id, int) else tuple(self.eos_token_id)

    @property
    def blocks_pad(self) -> bool:
        """Whether the pad id is never drawn (it is not an EOS id)."""
        return self.pad_token_id not in self.eos_ids

    @classmethod
    def of_policy(cls, policy: Any) -> SamplingSettings:
        """The settings of a :class:`~algorithms.common.policies.TransformerPolicy`."""
        eos = policy.eos_token_id
        return cls(
            eos_token_id=eos if isinstance(eos, int) else tuple(eos),
            pad_token_id=policy.pad_token_id,
            temperature=policy.temperature,
            top_p=policy.top_p,
            top_k=policy.top_k,
            vocab_size=policy.vocab_size,
        )


@dataclass(frozen=True)
class Draw:
    """How one :meth:`RolloutEngine.generate` call draws (its keyword arguments, documented there)."""

    max_new_tokens: int
    generator: torch.Generator | None = None
    greedy: bool = False
    noise_offset: int = 0
    noise_rows: int | None = None

    def seeds(self, batch: int) -> list[int]:
        """One seed per row of a ``batch``-row call (:func:`row_seeds`)."""
        return row_seeds(self.generator, batch, self.noise_offset, self.noise_rows)


class RolloutEngine(ABC):
    """Samples completions of token-id prompts and takes new weights; see the module doc. A subclass implements
    :meth:`_generate` and :meth:`_load_weights` (the public methods, their arguments and timing, are written here once).

    :param settings: how it samples (:class:`SamplingSettings`)
    """

    #: the engine's name, as ``rollout_engine=`` spells it
    name: ClassVar[str] = ""

    def __init__(self, settings: SamplingSettings) -> None:
        self.settings = settings
        #: seconds the last :meth:`update_weights` took
        self.last_sync_seconds = 0.0

    def generate(
        self,
        prompts: Prompts,
        attention_mask: torch.Tensor | None = None,
        *,
        max_new_tokens: int,
        generator: torch.Generator | None = None,
        greedy: bool = False,
        noise_offset: int = 0,
        noise_rows: int | None = None,
    ) -> Completions:
        """Sample one completion per prompt.

        :param prompts: a left-padded ``(B, T)`` id tensor with ``attention_mask``, or ``B`` lists of ids
        :param attention_mask: ``(B, T)`` 1 for prompt tokens, 0 for padding (tensor prompts only)
        :param max_new_tokens: the most tokens generated per prompt, the columns of the result
        :param generator: the random stream the samples are drawn from (None: the engine's own)
        :param greedy: take the most likely token instead of sampling
        :param noise_offset: this batch's first row within the job's batch (several processes, each a slice)
        :param noise_rows: the rows of the job's batch (None: this batch's), so a row's draw does not depend on how
            the job's batch is split among processes
        :return: :class:`~algorithms.common.generation.sampler.Completions` ``(B, max_new_tokens)``, on the prompts'
            device for tensor prompts, else on the CPU
        """
        draw = Draw(max_new_tokens, generator, greedy, noise_offset, noise_rows)
        return self._generate(prompts, attention_mask, draw)

    @abstractmethod
    def _generate(self, prompts: Prompts, attention_mask: torch.Tensor | None, draw: Draw) -> Completions:
        """:meth:`generate`, its drawing arguments gathered in ``draw``."""

    def update_weights(self, weights: Weights) -> float:
        """Take new weights (after each optimizer update); the seconds it took (also :attr:`last_sync_seconds`).

        :param weights: a model, a state dict or ``(name, tensor)`` pairs, with Hugging Face checkpoint names
        """
        start = time.perf_counter()
        self._load_weights(weights)
        self.last_sync_seconds = time.perf_counter() - start
        return self.last_sync_seconds

    @abstractmethod
    def _load_weights(self, weights: Weights) -> None:
        """Put ``weights`` in the engine."""

    def close(self) -> None:  # noqa: B027 (engines without resources need nothing here)
        """Release what the engine holds (processes, memory, connections); it cannot sample afterwards."""

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------------- prompts
def prompt_lists(prompts: Prompts, attention_mask: torch.Tensor | None) -> list[list[int]]:
    """One list of ids per prompt, padding dropped."""
    if isinstance(prompts, torch.Tensor):
        if attention_mask is None:
            raise ValueError("tensor prompts need their attention_mask (1 for tokens, 0 for padding)")
        ids, mask = prompts.cpu(), attention_mask.bool().cpu()
        return [row[keep].tolist() for row, keep in zip(ids, mask, strict=True)]
    return [[int(i) for i in prompt] for prompt in prompts]


def padded_prompts(prompts: Prompts, attention_mask: torch.Tensor | None, pad_id: int) -> tuple[torch.Tensor, ...]:
    """A left-padded ``(B, T)`` id tensor and its mask."""
    if isinstance(prompts, torch.Tensor):
        if attention_mask is None:
            raise ValueError("tensor prompts need their attention_mask (1 for tokens, 0 for padding)")
        return prompts, attention_mask
    rows = [list(p) for p in prompts]
    width = max([1, *(len(r) for r in rows)])
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, -len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, -len(row) :] = 1
    return ids, mask


def completions_from_lists(
    tokens: Sequence[Sequence[int]], log_probs: Sequence[Sequence[float]], max_new_tokens: int, pad_id: int
) -> Completions:
    """:class:`Completions` ``(B, max_new_tokens)`` from one list of sampled ids (and their log-probs) per row."""
    batch = len(tokens)
    ids = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long)
    logp = torch.zeros((batch, max_new_tokens), dtype=torch.float32)
    mask = torch.zeros((batch, max_new_tokens), dtype=torch.bool)
    for i, (row, row_logp) in enumerate(zip(tokens, log_probs, strict=True)):
        n = min(len(row), max_new_tokens)
        if n:
            ids[i, :n] = torch.tensor(row[:n], dtype=torch.long)
            logp[i, :n] = torch.tensor(row_logp[:n], dtype=torch.float32)
            mask[i, :n] = True
    return Completions(ids, logp, mask, mask.sum(-1))


def check_fits(rows: Sequence[Sequence[int]], max_new_tokens: int, max_model_len: int | None) -> None:
    """An :class:`EngineError` when a prompt and its completion exceed the engine's ``max_model_len`` (vLLM would
    cut the completion short) or a prompt is empty (vLLM samples nothing from it)."""
    if any(not row for row in rows):
        raise ValueError("every prompt needs at least one token (vLLM samples nothing from an empty prompt)")
    longest = max(len(row) for row in rows)
    if max_model_len is not None and longest + max_new_tokens > max_model_len:
        raise EngineError(
            f"a prompt of {longest} tokens and {max_new_tokens} new ones exceed the engine's max_model_len "
            f"({max_model_len}): raise max_model_len (vLLM's), or keep fewer prompt tokens"
        )


def row_seeds(generator: torch.Generator | None, batch: int, noise_offset: int, noise_rows: int | None) -> list[int]:
    """One seed per row from ``generator`` (the global stream when None): ``noise_rows`` seeds are drawn and rows
    ``noise_offset`` onwards used, so a row's seed does not depend on the split of the job's batch."""
    device = generator.device if generator is not None else None  # a CUDA generator draws on its device
    drawn = torch.randint(0, 2**31 - 1, ((noise_rows or batch),), generator=generator, device=device).cpu()
    return [int(s) for s in drawn[noise_offset : noise_offset + batch]]


# ---------------------------------------------------------------------------------------------------- weights
def named_weights(weights: Weights) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs with Hugging Face checkpoint names; a LoRA model's adapters merged into the weights
    (:func:`merged_weights`)."""
    if isinstance(weights, nn.Module):
        yield from merged_weights(weights)
    elif isinstance(weights, Mapping):
        yield from weights.items()
    else:
        yield from weights


def merged_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights of ``model`` under its base checkpoint names, detached: a peft model's LoRA projections as their
    effective weights ``W + scaling * B @ A`` (:func:`~algorithms.common.model.lora.effective_linear`), the adapter
    tensors left out; a plain model's state dict as it is."""
    network = base_network(model)
    lora_modules = {name: module for name, module in network.named_modules() if is_lora_linear(module)}
    with torch.no_grad():
        for name, module in lora_modules.items():
            weight, bias = effective_linear(module)
            yield f"{name}.weight", weight.detach()
            if bias is not None:
                yield f"{name}.bias", bias.detach()
        for name, tensor in network.state_dict().items():
            owner = name.rsplit(".", 1)[0]
            if ".lora_" in name or owner.endswith(".base_layer") or owner in lora_modules:
                continue
            yield name, tensor.detach()
