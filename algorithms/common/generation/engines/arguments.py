"""The rollout engine's constructor arguments, declared once: ``rollout_engine`` and the settings of
``rollout_engine_kwargs`` (vLLM's: its mode, server, memory and weight pushes), each as ``(default, rule, doc,
annotation)``, the fields of an :class:`~algorithms.common.arguments.Argument`;
:data:`~algorithms.common.lm_arguments.LM_ARGUMENTS` (GRPO's and LMPPO's table) holds them, and
:class:`~.setup.EngineSpec` reads them back from the algorithm. They say how a run samples, not what it learns, so
``--resume`` may change them (a server that came back on another port). A rule takes the name and the value and
returns the value in its canonical type or raises :class:`~grpo_gym.validation.ArgumentError` naming the fix."""

from __future__ import annotations

from typing import Any

from algorithms.common.generation.engines.setup import ENGINES, LORA_SYNCS, VLLM_MODES
from grpo_gym.validation import ArgumentError, check_bool, check_choice, check_float, check_int, check_path


def server_url(name: str, value: Any) -> str | None:
    """None, or an ``http://`` / ``https://`` URL (its trailing ``/`` dropped)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise ArgumentError(f"{name} must be a URL such as 'http://127.0.0.1:8000' (or None), got {value!r}")
    return value.rstrip("/")


def text(name: str, value: Any) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise ArgumentError(f"{name} must be a non-empty string, got {value!r}")
    return value


def keyword_dict(name: str, value: Any) -> dict[str, Any]:
    """None (an empty dict) or a dict with string keys (another library's keyword arguments, passed on)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise ArgumentError(f"{name} must be a dict of keyword arguments (string keys), got {value!r}")
    return dict(value)


def _choice(*values: Any):
    return lambda name, value: check_choice(name, value, values)


def _positive(name: str, value: Any) -> float:
    return check_float(name, value, low=0.0, low_open=True)


def _folder(name: str, value: Any) -> str | None:
    return None if value is None else check_path(name, value)


_ROLLOUT_ENGINE = (
    'what samples the rollouts (:mod:`~algorithms.common.generation.engines`): ``"builtin"`` (this project\'s '
    'KV-cache sampler), ``"hf"`` (Hugging Face ``generate``) or ``"vllm"`` (``pip install "grpo-gym[vllm]"``; on '
    "a CPU ``bash .ci/install_vllm.sh``); token ids in, token ids and log-probs out; the policy's weights are "
    "pushed to it after every update (``time/weight_sync_seconds``)"
)
_VLLM_MODE = (
    '``"colocate"`` (``vllm.LLM`` in the training process; under torchrun one per process) or ``"server"`` (a vLLM '
    "server's client, e.g. of ``grpo-gym vllm-serve``, at ``server_base_url`` or ``server_host``:``server_port``)"
)
_VLLM_KV = (
    "a colocated vLLM's KV cache in bytes (``None``: on a CPU the rollout's rows at full length, 16 MiB to "
    "1 GiB; on a GPU from ``gpu_memory_utilization``)"
)
_VLLM_LORA = (
    'a LoRA policy\'s pushes to vLLM: ``"merged"`` (the adapters merged into the weights, every push the whole '
    'model) or ``"adapters"`` (the base weights once, then only the adapters, as a new LoRA request per push)'
)
_VLLM_SYNC_FOLDER = (
    "served vLLM: where the new weights are written for the server to read (``None``: a temporary folder); the "
    "server must see it at the same path (the same machine, or a shared mount)"
)

#: ``rollout_engine``'s ``(default, rule, doc, annotation)``
ROLLOUT_ENGINE: tuple[Any, Any, str, str] = ("builtin", _choice(*ENGINES), _ROLLOUT_ENGINE, "str")

#: the settings of ``rollout_engine_kwargs`` (vLLM's; TRL's ``vllm_<name>``): key -> ``(default, rule, doc,
#: annotation)``; the algorithm holds each as the attribute ``vllm_<key>`` (``llm_kwargs`` as ``vllm_kwargs``)
ENGINE_SETTINGS: dict[str, tuple[Any, Any, str, str]] = {
    "mode": ("colocate", _choice(*VLLM_MODES), _VLLM_MODE, "str"),
    "server_base_url": (
        None, server_url,
        "the vLLM server's URL, e.g. ``'http://127.0.0.1:8000'`` (``None``: from ``server_host`` and ``server_port``)",
        "str | None",
    ),
    "server_host": ("127.0.0.1", text, "the vLLM server's host (without a base URL)", "str"),
    "server_port": (
        8000, lambda name, value: check_int(name, value, low=1, high=65535),
        "the vLLM server's port (without a base URL)", "int",
    ),
    "server_timeout": (
        240.0, _positive, "seconds to wait at setup for the vLLM server to answer (TRL's 240)", "float"
    ),
    "request_timeout": (
        300.0, _positive, "seconds one vLLM request (a completion, a weight push) may take", "float"
    ),
    "gpu_memory_utilization": (
        0.3, lambda name, value: check_float(name, value, low=0.0, high=1.0, low_open=True),
        "the GPU memory share a colocated vLLM takes (TRL's 0.3)", "float",
    ),
    "kv_cache_memory_bytes": (
        None, lambda name, value: check_int(name, value, low=1 << 20, allow_none=True), _VLLM_KV, "int | None"
    ),
    "lora_sync": ("merged", _choice(*LORA_SYNCS), _VLLM_LORA, "str"),
    "enable_sleep_mode": (
        False, lambda name, value: check_bool(name, value),
        "a colocated vLLM on a GPU frees its memory while the trainer runs (vLLM's sleep mode)", "bool",
    ),
    "sync_folder": (None, _folder, _VLLM_SYNC_FOLDER, "str | None"),
    "llm_kwargs": (
        None, keyword_dict, "more ``vllm.LLM`` arguments for a colocated vLLM (``tensor_parallel_size``, ...)",
        "dict[str, Any] | None",
    ),
}  # fmt: skip

#: the attribute the algorithm holds each engine setting in (TRL's name: ``vllm_<key>``; ``llm_kwargs`` as
#: ``vllm_kwargs``)
ENGINE_ATTRIBUTES = {key: "vllm_kwargs" if key == "llm_kwargs" else f"vllm_{key}" for key in ENGINE_SETTINGS}
