"""The ``"builtin"`` engine: this project's KV-cache sampler (:func:`~algorithms.common.generation.sampler.sample`).

It runs the trainer's own model object, so it always samples with the live weights: :meth:`update_weights` with that
model is free, and another model's weights are copied in. Its samples and their random stream are exactly those of
:func:`~algorithms.common.generation.sampler.sample` (the engine calls it), which is what ``TransformerPolicy.generate``
runs without an engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from algorithms.common.generation.continuation import TurnCache
from algorithms.common.generation.engines.base import (
    Prompts,
    RolloutEngine,
    SamplingSettings,
    Weights,
    named_weights,
    padded_prompts,
)
from algorithms.common.generation.sampler import Completions, sample


def load_into(model: nn.Module, weights: Weights) -> None:
    """Copy ``weights`` into ``model`` (nothing to do when they are ``model`` itself); every tensor must exist there."""
    if weights is model:
        return
    own = dict(model.state_dict())
    with torch.no_grad():
        for name, tensor in named_weights(weights):
            if name not in own:
                raise KeyError(f"update_weights: the engine's model has no weight {name!r}")
            own[name].copy_(tensor)


class BuiltinEngine(RolloutEngine):
    """Samples with :func:`~algorithms.common.generation.sampler.sample` on ``model``.

    :param model: the Hugging Face causal LM to sample from (in eval mode), usually the policy's own
    :param settings: how it samples
    :param decoder: the sampler's forward pass: ``"auto"``, ``"llama"`` or ``"hf"``
        (:func:`~algorithms.common.generation.decoders.make_decoder`)
    """

    name = "builtin"
    keeps_turn_cache = True

    def __init__(self, model: nn.Module, settings: SamplingSettings, decoder: str = "auto") -> None:
        super().__init__(settings)
        self.model = model
        self.decoder = decoder

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
        keep_cache: bool = False,
        cache: TurnCache | None = None,
        cache_rows: torch.Tensor | Sequence[int] | None = None,
    ) -> Completions:
        """See :meth:`RolloutEngine.generate`; the arguments go to the sampler unchanged, the KV cache kept across
        turns included (``keep_cache``, ``cache``, ``cache_rows``:
        :func:`~algorithms.common.generation.sampler.sample`)."""
        ids, mask = padded_prompts(prompts, attention_mask, self.settings.pad_token_id)
        device = next(self.model.parameters()).device
        s = self.settings
        return sample(
            self.model,
            ids.to(device),
            mask.to(device),
            max_new_tokens=max_new_tokens,
            eos_token_id=s.eos_token_id,
            pad_token_id=s.pad_token_id,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            vocab_size=s.vocab_size,
            generator=generator,
            greedy=greedy,
            decoder=self.decoder,
            noise_offset=noise_offset,
            noise_rows=noise_rows,
            keep_cache=keep_cache,
            cache=cache,
            cache_rows=cache_rows,
        )

    def _load_weights(self, weights: Weights) -> None:
        load_into(self.model, weights)
