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

On a GPU with ``sleep_mode``, :meth:`VLLMColocateEngine.sleep` (the algorithm calls it after each rollout) offloads
the weights to the CPU and drops the KV cache (vLLM's sleep level 1) while the trainer runs; the next push or rollout
wakes it. (A GPU code path: vLLM's sleep mode needs CUDA, so the CPU tests do not run it.)

On the CPU build: float32, ``enforce_eager``, a fixed KV-cache size (``kv_cache_memory_bytes``); set
``OMP_NUM_THREADS=1`` before the process starts when training and sampling share 1-2 cores (else vLLM's OpenMP
threads and torch's contend: about 6x slower). vLLM replaces ``torch.set_num_threads`` with a no-op once its worker
binds its threads (until :meth:`close` puts it back): set the thread count before building the engine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from algorithms.common.generation.engines.base import EngineError, SamplingSettings, Weights
from algorithms.common.generation.engines.vllm_engine import VLLMEngine, import_vllm
from algorithms.common.generation.engines.vllm_folder import check_vllm_can_run, export_folder, lora_rank

#: the tokens vLLM may prefill in one step (its CPU default cuts a rollout's prompts across steps)
PREFILL_TOKENS = 32768


class VLLMColocateEngine(VLLMEngine):
    """Samples with ``vllm.LLM`` in this process; see the module doc.

    :param model: the trainer's model (a Hugging Face causal LM, or a peft model with LoRA adapters)
    :param settings: how it samples
    :param folder: where to write the model folder vLLM loads (None: a temporary folder, removed by :meth:`close`)
    :param kv_cache_memory_bytes: the KV cache's size (vLLM's ``kv_cache_memory_bytes``; None: vLLM sizes it from
        ``gpu_memory_utilization``, a GPU's way)
    :param max_model_len: the most tokens of a prompt and its completion (None: the model's position limit)
    :param lora: a peft model's weights as ``"merged"`` weights (``W + scaling * B @ A``) or as ``"adapters"``
        (LoRA requests over the base weights)
    :param seed: vLLM's own seed (each request also gets one from the caller's generator)
    :param dtype: the weights' dtype in vLLM (float32 on the CPU)
    :param llm_kwargs: more ``vllm.LLM`` arguments
    :param sleep_mode: sleep between rollouts (:meth:`sleep`; needs ``enable_sleep_mode=True`` in ``llm_kwargs`` and
        a GPU)
    """

    def __init__(
        self,
        model: nn.Module,
        settings: SamplingSettings,
        folder: str | os.PathLike | None = None,
        kv_cache_memory_bytes: int | None = 256 << 20,
        max_model_len: int | None = None,
        lora: str = "merged",
        seed: int = 0,
        dtype: str = "float32",
        llm_kwargs: dict[str, Any] | None = None,
        sleep_mode: bool = False,
    ) -> None:
        import_vllm()
        check_vllm_can_run(model)
        super().__init__(model, settings, lora, folder, prefix="grpo-gym-vllm-")
        self.sleep_mode, self._asleep = sleep_mode, False
        self.format = export_folder(model, settings, self.folder / "model", adapters=self.adapters)[1]
        self._lora_request: Any = None
        options = {"enable_lora": True, "max_lora_rank": max(8, lora_rank(model)), "max_loras": 1}
        self.llm = self._start(kv_cache_memory_bytes, max_model_len, seed, dtype, {
            **(options if self.adapters else {}), **(llm_kwargs or {})})  # fmt: skip
        self.max_model_len = self.llm.model_config.max_model_len
        if self.adapters:
            self._push_adapters(model)

    def _start(self, kv_bytes: int | None, max_model_len: int | None, seed: int, dtype: str, extra: dict) -> Any:
        """``vllm.LLM`` on the written folder, or an :class:`EngineError` naming the fix."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in process: weights pass as tensors
        from vllm import LLM

        self._set_num_threads = torch.set_num_threads  # vLLM's CPU worker makes it a no-op; close() puts it back
        if kv_bytes is not None:
            extra = {"kv_cache_memory_bytes": int(kv_bytes), **extra}
        # a rollout's prompts prefilled in one step: vLLM's CPU worker cannot rewind the seeded generator of a request
        # whose prefill was cut across steps ("CPU Generator does not use offset"; 64 prompts of 110 tokens did it)
        extra = {"max_num_batched_tokens": max(PREFILL_TOKENS, max_model_len or 0), **extra}
        try:
            return LLM(
                model=str(self.folder / "model"),
                dtype=dtype,
                enforce_eager=True,
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

    def _sample_rows(
        self, rows: list[list[int]], seeds: list[int], fields: dict[str, Any]
    ) -> tuple[list[list[int]], list[list[float]]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [SamplingParams(seed=seed, detokenize=False, **fields) for seed in seeds]
        requests = [TokensPrompt(prompt_token_ids=row) for row in rows]
        self.wake_up()
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
        return tokens, log_probs

    def _push_full(self, weights: Weights) -> None:
        """Through the worker's ``reload_weights``, then the prefix cache reset."""
        converted = self.format.convert(weights)
        self.wake_up()
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

    def _use_adapters(self, name: str, folder: Path) -> None:
        """A new ``LoRARequest`` (id: the version) for the next requests; vLLM drops the previous (``max_loras=1``)."""
        from vllm.lora.request import LoRARequest

        self._lora_request = LoRARequest(name, self._version, str(folder))
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Offload the weights and drop the KV cache until the next push or rollout (``sleep_mode`` only; vLLM's
        sleep level 1, so the weights come back as they were). Not run by the CPU tests: it needs CUDA."""
        if self.sleep_mode and not self._asleep and self.llm is not None:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        """Undo :meth:`sleep` (nothing when awake)."""
        if self._asleep and self.llm is not None:
            self.llm.wake_up()
            self._asleep = False

    def close(self) -> None:
        """Shut vLLM down and remove the temporary folder."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            self.llm = None
            _shutdown(llm)
            torch.set_num_threads = self._set_num_threads
        super().close()


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
