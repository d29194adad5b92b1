"""The ``"builtin"`` engine: this project's KV-cache sampler (:func:`~algorithms.common.generation.sampler.sample`),
and :class:`ModelEngine`, what it shares with the ``"hf"`` engine: both run the trainer's own model object.

Such an engine always samples with the live weights: :meth:`~.base.RolloutEngine.update_weights` with that model is
free, and another model's weights are copied in. The builtin engine's samples and their random stream are exactly
those of :func:`~algorithms.common.generation.sampler.sample` (the engine calls it), which is what
``TransformerPolicy.generate`` runs without an engine.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import torch
from torch import nn

from algorithms.common.generation.continuation import TurnCache
from algorithms.common.generation.engines.base import (
    Draw,
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


class ModelEngine(RolloutEngine):
    """An engine on a model object in this process: the prompts left-padded on its device, new weights copied in.

    :param model: the Hugging Face causal LM to sample from (in eval mode; a peft model too), usually the policy's own
    :param settings: how it samples
    """

    def __init__(self, model: nn.Module, settings: SamplingSettings) -> None:
        super().__init__(settings)
        self.model = model

    def _generate(self, prompts: Prompts, attention_mask: torch.Tensor | None, draw: Draw) -> Completions:
        device = next(self.model.parameters()).device
        ids, mask = padded_prompts(prompts, attention_mask, self.settings.pad_token_id)
        return self._sample(ids.to(device), mask.to(device), draw)

    @abstractmethod
    def _sample(self, ids: torch.Tensor, mask: torch.Tensor, draw: Draw) -> Completions:
        """Completions of the left-padded prompts ``ids`` ``(B, T)`` (``mask``: 1 for tokens), on their device."""

    def _load_weights(self, weights: Weights) -> None:
        load_into(self.model, weights)


class BuiltinEngine(ModelEngine):
    """Samples with :func:`~algorithms.common.generation.sampler.sample` on ``model``.

    :param model: the Hugging Face causal LM to sample from (in eval mode), usually the policy's own
    :param settings: how it samples
    :param decoder: the sampler's forward pass: ``"auto"``, ``"llama"`` or ``"hf"``
        (:func:`~algorithms.common.generation.decoders.make_decoder`)
    """

    name = "builtin"
    keeps_turn_cache = True

    def __init__(self, model: nn.Module, settings: SamplingSettings, decoder: str = "auto") -> None:
        super().__init__(model, settings)
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
        """See :meth:`RolloutEngine.generate`; also the KV cache kept across turns (``keep_cache``, ``cache``,
        ``cache_rows``: :func:`~algorithms.common.generation.sampler.sample`)."""
        draw = Draw(max_new_tokens, generator, greedy, noise_offset, noise_rows)
        device = next(self.model.parameters()).device
        ids, mask = padded_prompts(prompts, attention_mask, self.settings.pad_token_id)
        turns = {"keep_cache": keep_cache, "cache": cache, "cache_rows": cache_rows}
        return self._sample(ids.to(device), mask.to(device), draw, **turns)

    def _sample(self, ids: torch.Tensor, mask: torch.Tensor, draw: Draw, **turns: object) -> Completions:
        # the settings' fields, the draw's and the turn cache's are the sampler's keyword arguments, unchanged
        return sample(self.model, ids, mask, decoder=self.decoder, **vars(self.settings), **vars(draw), **turns)
