"""The rollout engine an algorithm runs on, from its arguments: built at setup, new weights after every update,
closed at the end.

:class:`EngineSpec` is the plain record of the ``rollout_engine`` / ``vllm_*`` constructor arguments
(:mod:`algorithms.common.arguments`); :func:`build_engine` makes the engine it names for a
:class:`~algorithms.common.policies.TransformerPolicy`; :class:`EngineLink` is what the algorithm holds: it sets the
policy's ``rollout_engine`` hook, pushes the policy's weights (timed, ``time/weight_sync_seconds``), puts a GPU
engine to sleep while the trainer runs, and closes the engine on :meth:`EngineLink.close`, or at the latest when the
process exits (``atexit``), so no run leaves a vLLM engine behind.

- ``"builtin"``: no engine object (the policy's own sampler, exactly as without the seam);
- ``"hf"``: :class:`~.hf.HFGenerateEngine` on the policy's live model (a push is free: it is the same model);
- ``"vllm"`` with ``rollout_engine_kwargs={"mode": "colocate"}``: :class:`~.vllm_colocate.VLLMColocateEngine` in
  this process (under ``torchrun`` each rank its own, see :func:`colocate_options`);
- ``"vllm"`` with ``rollout_engine_kwargs={"mode": "server"}``: :class:`~.vllm_server.VLLMServerEngine`, a client of
  the vLLM server at ``server_base_url`` (or ``http://<server_host>:<server_port>``), e.g. one ``grpo-gym
  vllm-serve`` started.
"""

from __future__ import annotations

import atexit
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from algorithms.common.generation.engines.base import EngineError, RolloutEngine, SamplingSettings

#: the values of ``rollout_engine``, ``vllm_mode`` and ``vllm_lora_sync``
ENGINES = ("builtin", "hf", "vllm")
VLLM_MODES = ("colocate", "server")
LORA_SYNCS = ("merged", "adapters")
#: the KV cache of a colocated CPU engine, when not given: the rollout's rows at full length, within these bounds
CPU_KV_BYTES = (16 << 20, 1 << 30)
SAMPLING_DTYPES = {"no": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class EngineSpec:
    """The engine an algorithm's arguments ask for (the ``rollout_engine`` / ``vllm_*`` arguments, by field).

    :param engine: ``"builtin"``, ``"hf"`` or ``"vllm"``
    :param vllm_mode: ``"colocate"`` (``vllm.LLM`` in this process) or ``"server"`` (a vLLM server's client)
    :param base_url: the server's URL (None: from ``host`` and ``port``)
    :param host: the server's host
    :param port: the server's port
    :param server_timeout: seconds to wait for the server to answer at setup
    :param request_timeout: seconds one request (a completion, a weight push) may take
    :param gpu_memory_utilization: the GPU memory share a colocated engine takes (weights and KV cache)
    :param kv_cache_memory_bytes: the KV cache's size (None: on a CPU the rollout's rows at full length, capped at
        1 GiB; on a GPU from ``gpu_memory_utilization``)
    :param lora_sync: a LoRA policy's pushes: ``"merged"`` weights or ``"adapters"`` only
    :param sleep_mode: put a GPU engine to sleep while the trainer runs
    :param sync_folder: where a server's new weights are written (None: a temporary folder)
    :param llm_kwargs: more ``vllm.LLM`` arguments for a colocated engine
    """

    engine: str = "builtin"
    vllm_mode: str = "colocate"
    base_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    server_timeout: float = 240.0
    request_timeout: float = 300.0
    gpu_memory_utilization: float = 0.3
    kv_cache_memory_bytes: int | None = None
    lora_sync: str = "merged"
    sleep_mode: bool = False
    sync_folder: str | None = None
    llm_kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, arguments: Any) -> EngineSpec:
        """The spec of an object with the constructor's argument names as attributes (an algorithm)."""
        return cls(
            engine=arguments.rollout_engine,
            vllm_mode=arguments.vllm_mode,
            base_url=arguments.vllm_server_base_url,
            host=arguments.vllm_server_host,
            port=arguments.vllm_server_port,
            server_timeout=arguments.vllm_server_timeout,
            request_timeout=arguments.vllm_request_timeout,
            gpu_memory_utilization=arguments.vllm_gpu_memory_utilization,
            kv_cache_memory_bytes=arguments.vllm_kv_cache_memory_bytes,
            lora_sync=arguments.vllm_lora_sync,
            sleep_mode=arguments.vllm_enable_sleep_mode,
            sync_folder=arguments.vllm_sync_folder,
            llm_kwargs=dict(arguments.vllm_kwargs or {}),
        )

    @property
    def server_url(self) -> str:
        """The vLLM server's base URL."""
        return (self.base_url or f"http://{self.host}:{self.port}").rstrip("/")

    @property
    def describe(self) -> str:
        """One line: the engine (and the server's URL)."""
        if self.engine != "vllm":
            return f"rollout engine: {self.engine}"
        where = self.server_url if self.vllm_mode == "server" else "in this process"
        return f"rollout engine: vllm ({self.vllm_mode}, {where}; LoRA pushes: {self.lora_sync})"


def check_spec(spec: EngineSpec, sharding: str | None, device: torch.device, world_size: int = 1) -> None:
    """Refuse, naming the fix, the combinations no engine runs."""
    if spec.engine == "builtin":
        return
    if spec.engine == "vllm" and spec.vllm_mode == "server" and world_size > 1:
        raise ValueError(
            f"rollout_engine_kwargs={{'mode': 'server'}} with {world_size} processes: every rank would push its "
            "weights to the one server; not supported yet. Use rollout_engine_kwargs={'mode': 'colocate'} (each rank "
            "its own vLLM), or one process"
        )
    if sharding == "fsdp":
        raise ValueError(
            f"rollout_engine={spec.engine!r} samples with whole weights: not with sharding='fsdp' (the weights are "
            "split over the processes); use sharding=None, or rollout_engine='builtin'"
        )
    if spec.engine == "vllm" and spec.sleep_mode and device.type != "cuda":
        raise ValueError(
            "rollout_engine_kwargs['enable_sleep_mode'] frees a GPU's memory while the trainer runs: it needs a CUDA "
            "device; leave it False on a CPU"
        )


def max_model_len(policy: Any) -> int:
    """The most tokens of a prompt and its completion: the env's window and ``max_new_tokens``, at most the policy's
    ``memory_length`` (the policy cuts longer prompts)."""
    window = int(policy.observation_space["input_ids"].shape[0])
    return int(min(policy.memory_length, window + policy.max_new_tokens))


def cpu_kv_bytes(model: Any, rows: int, tokens: int) -> int:
    """KV cache bytes for ``rows`` sequences of ``tokens`` (float32 keys and values), within :data:`CPU_KV_BYTES`
    and never under two sequences of ``tokens``."""
    config = getattr(model, "config", None)
    heads = config.num_attention_heads
    head = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_token = 2 * config.num_hidden_layers * (getattr(config, "num_key_value_heads", None) or heads) * head * 4
    low, high = CPU_KV_BYTES
    return int(max(low, 2 * tokens * per_token, min(high, rows * tokens * per_token)))


def colocate_options(spec: EngineSpec, policy: Any, rows: int, sampling_precision: str, world_size: int) -> dict:
    """The :class:`~.vllm_colocate.VLLMColocateEngine` arguments (but the model, settings and seed): on a CPU float32
    and a fixed KV cache; on a GPU the sampling stage's dtype and ``gpu_memory_utilization`` (sleep mode when asked);
    under ``torchrun`` vLLM's ``external_launcher`` (each rank a data-parallel replica of its own, TRL's colocate
    setup)."""
    from algorithms.common.model.lora import base_network

    length = max_model_len(policy)
    extra = dict(spec.llm_kwargs)
    on_gpu = policy.device.type == "cuda"
    if on_gpu:
        extra.setdefault("gpu_memory_utilization", spec.gpu_memory_utilization)
        extra.setdefault("enable_sleep_mode", spec.sleep_mode)
    if world_size > 1:
        extra.setdefault("distributed_executor_backend", "external_launcher")
    kv_bytes = spec.kv_cache_memory_bytes
    if kv_bytes is None and not on_gpu:
        kv_bytes = cpu_kv_bytes(base_network(policy.model), rows, length)
    return {
        "kv_cache_memory_bytes": kv_bytes,
        "max_model_len": length,
        "lora": spec.lora_sync,
        "dtype": SAMPLING_DTYPES.get(sampling_precision, "float32") if on_gpu else "float32",
        "llm_kwargs": extra,
    }


def build_engine(
    spec: EngineSpec, policy: Any, seed: int, rows: int, sampling_precision: str = "no", world_size: int = 1
) -> RolloutEngine | None:
    """The engine ``spec`` names for ``policy`` (None for ``"builtin"``: the policy's own sampler).

    :param spec: the engine asked for
    :param policy: the :class:`~algorithms.common.policies.TransformerPolicy` whose model and settings it samples with
    :param seed: vLLM's own seed (every request also gets one from the rollout's generator)
    :param rows: the completions of one rollout on this process (K x G / processes), to size a CPU KV cache
    :param sampling_precision: the sampling stage's precision (``"no"``, ``"bf16"``, ``"fp16"``): a GPU engine's dtype
    :param world_size: the job's processes (a colocated engine under ``torchrun``)
    """
    settings = SamplingSettings.of_policy(policy)
    if spec.engine == "builtin":
        return None
    if spec.engine == "hf":
        from algorithms.common.generation.engines.hf import HFGenerateEngine

        return HFGenerateEngine(policy.model, settings)
    if spec.vllm_mode == "colocate":
        from algorithms.common.generation.engines.vllm_colocate import VLLMColocateEngine

        options = colocate_options(spec, policy, rows, sampling_precision, world_size)
        return VLLMColocateEngine(policy.model, settings, seed=seed, sleep_mode=spec.sleep_mode, **options)
    from algorithms.common.generation.engines.vllm_server import VLLMServerEngine

    return VLLMServerEngine(
        spec.server_url,
        policy.model,
        settings,
        sync_folder=spec.sync_folder,
        lora=spec.lora_sync,
        request_timeout=spec.request_timeout,
        connect_timeout=spec.server_timeout,
        max_model_len=max_model_len(policy),
    )


# ---------------------------------------------------------------------------------------------------- the link
_OPEN: weakref.WeakSet[EngineLink] = weakref.WeakSet()


@atexit.register
def _close_open_links() -> None:
    """At exit, close every engine still open (best effort: the process is ending)."""
    for link in list(_OPEN):
        try:
            link.close()
        except Exception:  # nothing to report to at exit
            pass


class EngineLink:
    """An algorithm's rollout engine: built by :meth:`open`, fed by :meth:`push`, ended by :meth:`close`.

    :param spec: the engine asked for
    """

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        #: the engine (None for ``"builtin"``, and before :meth:`open` / after :meth:`close`)
        self.engine: RolloutEngine | None = None
        self._policy: Any = None
        #: seconds of the last push (None before any)
        self.last_sync_seconds: float | None = None

    def open(self, policy: Any, seed: int, rows: int, sampling_precision: str = "no", world_size: int = 1) -> None:
        """Build the engine (see :func:`build_engine`) and set it as ``policy.rollout_engine``."""
        self.close()
        try:
            self.engine = build_engine(self.spec, policy, seed, rows, sampling_precision, world_size)
        except EngineError as error:
            raise EngineError(
                f"{error} [{self.spec.describe}; to sample without it: rollout_engine='builtin', e.g. "
                "GRPO.load(path, rollout_engine='builtin')]"
            ) from error
        self._policy = policy
        policy.rollout_engine = self.engine
        if self.engine is not None:
            _OPEN.add(self)

    @property
    def external(self) -> bool:
        """Whether rollouts run on an engine object (not the policy's own sampler)."""
        return self.engine is not None

    def push(self, logger: Any = None) -> float | None:
        """Give the engine the policy's current weights (after an update, the cold start, a load or a restore); the
        seconds it took, also logged as ``time/weight_sync_seconds``; None without an engine.

        :raises EngineError: the engine refused them (the message names the fix)
        """
        if self.engine is None:
            return None
        seconds = self.engine.update_weights(self._policy.model)
        self.last_sync_seconds = seconds
        if logger is not None:
            logger.record("time/weight_sync_seconds", seconds)
        return seconds

    def sleep(self) -> None:
        """Free the engine's GPU memory while the trainer runs (``vllm_enable_sleep_mode``; it wakes at its next
        use). A GPU code path: vLLM's sleep mode needs CUDA, so it is not exercised by the CPU tests."""
        sleep = getattr(self.engine, "sleep", None)
        if self.spec.sleep_mode and sleep is not None:
            sleep()

    def close(self) -> None:
        """Close the engine (a colocated vLLM shuts down; a server's client removes its scratch folder, the server
        keeps running) and give the policy its own sampler back."""
        engine, self.engine = self.engine, None
        _OPEN.discard(self)
        if self._policy is not None and self._policy.rollout_engine is engine:
            self._policy.rollout_engine = None
        if engine is not None:
            engine.close()
