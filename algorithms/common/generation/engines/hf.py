"""The ``"hf"`` engine: Hugging Face ``model.generate``, with the log-probs taken from its raw logits.

``generate`` runs with a generation config of its own (the model's ``generation_config.json`` defaults, such as a
repetition penalty, are not applied: they would change the distribution the log-probs describe). A logits processor
keeps the pad id (unless it is an EOS id) and the ids ``>= vocab_size`` from being drawn, as the built-in sampler
does. The returned log-probs are those of the full temperature-scaled softmax of ``generate``'s unprocessed logits
(``output_logits=True``), the sampler's definition. ``generate`` draws from the global random stream; with a
``generator`` the engine seeds a forked copy of it from one draw of that generator, so a seeded run repeats (a row's
draw then depends on the whole batch, unlike the built-in sampler's).
"""

from __future__ import annotations

import torch
from torch import nn

from algorithms.common.generation.engines.base import (
    Draw,
    Prompts,
    RolloutEngine,
    SamplingSettings,
    Weights,
    named_weights,
    padded_prompts,
    row_seeds,
)
from algorithms.common.generation.sampler import Completions, log_probs_of, scaled_logits


class _Blocked:
    """A ``LogitsProcessor``: ``-inf`` at the pad id (when it is not an EOS id) and at the ids ``>= vocab_size``."""

    def __init__(self, settings: SamplingSettings) -> None:
        self.pad = settings.pad_token_id if settings.blocks_pad else None
        self.vocab_size = settings.vocab_size

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        if self.pad is not None:
            scores[:, self.pad] = -torch.inf
        if self.vocab_size is not None:
            scores[:, self.vocab_size :] = -torch.inf
        return scores


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


class HFGenerateEngine(RolloutEngine):
    """Samples with the model's own ``generate`` (``noise_offset`` and ``noise_rows`` are not used: see the module
    doc), on the model object in this process: the prompts left-padded on its device, new weights copied in (free
    when they are that model's own: it always samples with the live weights).

    :param model: a Hugging Face causal LM (or a peft model), usually the policy's own, in eval mode
    :param settings: how it samples
    """

    name = "hf"

    def __init__(self, model: nn.Module, settings: SamplingSettings) -> None:
        super().__init__(settings)
        self.model = model

    def _generate(self, prompts: Prompts, attention_mask: torch.Tensor | None, draw: Draw) -> Completions:
        device = next(self.model.parameters()).device
        ids, mask = padded_prompts(prompts, attention_mask, self.settings.pad_token_id)
        return self._sample(ids.to(device), mask.to(device), draw)

    def _load_weights(self, weights: Weights) -> None:
        load_into(self.model, weights)

    def _config(self, max_new_tokens: int, greedy: bool):
        from transformers import GenerationConfig

        s = self.settings
        sampling = {} if greedy else {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k or None}
        return GenerationConfig(
            do_sample=not greedy,
            max_new_tokens=max_new_tokens,
            min_new_tokens=0,
            eos_token_id=list(s.eos_ids) or None,
            pad_token_id=s.pad_token_id,
            repetition_penalty=1.0,
            output_logits=True,
            return_dict_in_generate=True,
            use_cache=True,
            **sampling,
        )

    def _sample(self, ids: torch.Tensor, mask: torch.Tensor, draw: Draw) -> Completions:
        """Completions of the left-padded prompts ``ids`` ``(B, T)`` (``mask``: 1 for tokens), on their device."""
        from transformers import LogitsProcessorList

        s, max_new_tokens, device = self.settings, draw.max_new_tokens, ids.device
        batch = ids.shape[0]
        if max_new_tokens == 0:
            empty = torch.zeros((batch, 0), dtype=torch.long, device=device)
            return Completions(empty, empty.float(), empty.bool(), torch.zeros(batch, dtype=torch.long, device=device))
        seed = row_seeds(draw.generator, 1, 0, None)[0] if draw.generator is not None else None
        forked = [device] if device.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=forked, enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                generation_config=self._config(max_new_tokens, draw.greedy),
                logits_processor=LogitsProcessorList([_Blocked(s)]),
            )
        new = out.sequences[:, ids.shape[1] :]  # (B, n), n <= max_new_tokens
        logits = torch.stack(out.logits, dim=1)  # (B, n, V)
        is_eos = torch.isin(new, torch.tensor(s.eos_ids, device=device))
        ended_before = (is_eos.long().cumsum(-1) - is_eos.long()) > 0  # an EOS earlier in the row
        valid = ~ended_before  # (B, n): up to and including the first EOS
        tokens = torch.full((batch, max_new_tokens), s.pad_token_id, dtype=torch.long, device=device)
        log_probs = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
        completion_mask = torch.zeros((batch, max_new_tokens), dtype=torch.bool, device=device)
        n = new.shape[1]
        tokens[:, :n] = torch.where(valid, new, s.pad_token_id)
        scaled = scaled_logits(logits, s.temperature, s.vocab_size)  # (B, n, V), the sampler's definition
        log_probs[:, :n] = torch.where(valid, log_probs_of(scaled, new), 0.0)
        completion_mask[:, :n] = valid
        return Completions(tokens, log_probs, completion_mask, completion_mask.sum(-1))
