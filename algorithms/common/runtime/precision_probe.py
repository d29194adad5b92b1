"""The timing probe behind ``mixed_precision="auto"`` on a CPU with native bf16, and its cache.

On a CPU that computes bf16 natively (AMX or AVX512-BF16), bf16 autocast is not always faster than float32:
at small sizes the casts and the kernels' fixed costs can outweigh the faster matmuls (measured on a Xeon with
AMX at the built-in tiny size: a GRPO iteration 14% slower in bf16, its cold-start SFT step 12% faster). So
``auto`` times *this* model on *this* machine, once, for each stage of a run:

- ``sampling``: :data:`DECODE_STEPS` new tokens through the project's sampler
  (:func:`~algorithms.common.generation.sampler.sample`: KV cache, shared prefill) for the run's K x G rows;
- ``update``: a forward and backward pass of the completions' log-probs
  (:func:`~algorithms.common.generation.sampler.completion_log_probs`) for rows of prompt + ``max_new_tokens``
  tokens, G rows sharing each prompt as in a rollout;
- ``sft``: the same with a distinct prompt per row, as the cold start's examples.

The forward/backward stages time at most :data:`MAX_ROWS` rows: the ratio of bf16 to float32 time follows
the matmuls' sizes, which that many rows of the run's length already give, and the probe stays a small
fraction of a run (a smaller batch is, if anything, less favourable to bf16: float32 wins ties).

Each in float32 and in bf16, alternating, after one warm-up round; the figure is the median of
:data:`REPEATS` rounds (fewer when a round is slow, see :data:`STAGE_BUDGET_S`). Prompts are
:data:`PROMPT_TOKENS` random tokens (timing does not depend on which tokens). The probe leaves no trace: the
model's gradients are set back to None and it draws its tokens from its own generator, not the global one.

The figures are kept in memory and in ``$XDG_CACHE_HOME/grpo-gym/precision.json`` (``~/.cache/grpo-gym/...``
without it), under a key made of the model's shape (architecture, sizes, vocabulary, parameter count and
dtype, attention kernel, gradient checkpointing), the probe's batch shape, and the machine (CPU model, its
flags, torch version, torch threads): the probe runs once per model shape and machine. The file is written
atomically (:func:`~algorithms.common.saving.atomic.atomic_write`); an unreadable or corrupt file is ignored and the
probe runs again, an unwritable one only means the probe runs again in the next process.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from algorithms.common.generation.sampler import completion_log_probs, sample
from algorithms.common.saving.atomic import atomic_write

#: the stages of a run that may each run in their own precision
STAGES = ("sampling", "update", "sft")
#: the precisions the probe compares
COMPARED = ("no", "bf16")
PROMPT_TOKENS = 64
DECODE_STEPS = 8
MAX_ROWS = 8
REPEATS = 5
#: a stage's timed rounds are cut (to no fewer than 2) so that they take about this many seconds
STAGE_BUDGET_S = 5.0
CACHE_VERSION = 1
#: the model config entries that make its shape (whichever the architecture names)
SHAPE_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "n_embd",
    "n_layer",
    "n_head",
    "n_inner",
)

#: ``stage -> {"no": seconds, "bf16": seconds}``: median seconds of one round of the stage in each precision
Figures = dict[str, dict[str, float]]
_MEMORY: dict[str, Figures] = {}


@dataclass(frozen=True)
class ProbeShape:
    """The batches the probe times: what a run's rollouts, updates and cold start look like.

    :param rows: rollout rows of this process (K x G)
    :param prompts: distinct prompts among them (K; each shared by G rows)
    :param sft_rows: the cold start's batch size
    :param prompt_tokens: tokens per prompt
    :param new_tokens: completion tokens of the update's rows (``max_new_tokens``)
    """

    rows: int
    prompts: int
    sft_rows: int
    prompt_tokens: int
    new_tokens: int

    @classmethod
    def of(cls, policy: Any, rows: int, prompts: int, sft_rows: int) -> ProbeShape:
        """The shape for a :class:`~algorithms.common.policies.TransformerPolicy` and a run's batch sizes."""
        prompt_tokens = max(1, min(PROMPT_TOKENS, policy.context_limit))
        return cls(rows, max(1, min(prompts, rows)), sft_rows, prompt_tokens, policy.max_new_tokens)


# ---------------------------------------------------------------------------------------------- the machine
def cpu_info() -> tuple[str, list[str]]:
    """The CPU's model name and flags, from ``/proc/cpuinfo`` (the platform's name and no flags without it)."""
    name, flags = "", []
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not name:
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = value.split()
    except OSError:
        pass
    return name or platform.processor() or platform.machine(), flags


def machine_key() -> dict[str, Any]:
    """What makes one machine time differently from another: CPU model and flags, torch version, threads."""
    name, flags = cpu_info()
    return {
        "cpu": name,
        "flags": hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def model_key(policy: Any) -> dict[str, Any]:
    """The model's shape: its config's sizes, architecture, parameter count and dtype, attention kernel,
    gradient checkpointing."""
    config = policy.model.config
    shape = {key: getattr(config, key) for key in SHAPE_KEYS if isinstance(getattr(config, key, None), (int, str))}
    parameter = next(policy.model.parameters())
    return {
        **shape,
        "architectures": list(getattr(config, "architectures", None) or [type(policy.model).__name__]),
        "parameters": sum(p.numel() for p in policy.model.parameters()),
        "dtype": str(parameter.dtype),
        "attention": str(getattr(config, "_attn_implementation", None)),
        "gradient_checkpointing": getattr(policy, "gradient_checkpointing", False),
    }


def cache_key(policy: Any, shape: ProbeShape) -> tuple[str, dict[str, Any]]:
    """A short hash of the model's shape, the probe's batches and the machine, and what it hashes."""
    parts = {"model": model_key(policy), "shape": asdict(shape), "machine": machine_key()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24], parts


# ---------------------------------------------------------------------------------------------- the cache
def cache_file() -> Path:
    """``$XDG_CACHE_HOME/grpo-gym/precision.json``, or ``~/.cache/grpo-gym/precision.json``."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "grpo-gym" / "precision.json"


def _valid(figures: Any) -> bool:
    return isinstance(figures, dict) and all(
        isinstance(figures.get(stage), dict)
        and all(isinstance(figures[stage].get(p), (int, float)) and figures[stage][p] > 0 for p in COMPARED)
        for stage in STAGES
    )


def read_cache(path: Path) -> dict[str, Any]:
    """The file's entries, ``{}`` when it is missing, unreadable or not what :func:`write_cache` writes."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(data.get("entries"), dict):
        return {}
    return data["entries"]


def write_cache(path: Path, key: str, entry: dict[str, Any]) -> bool:
    """Add ``entry`` under ``key`` to the file, atomically; False (and nothing changed) when it cannot be written."""
    entries = {**read_cache(path), key: entry}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path, "w") as out:
            json.dump({"version": CACHE_VERSION, "entries": entries}, out, indent=1, sort_keys=True)
    except (OSError, ValueError):  # ValueError: a folder in the file's place
        return False
    return True


def cached_figures(policy: Any, shape: ProbeShape) -> tuple[Figures, bool]:
    """The probe's figures for this model shape and machine, and whether they came from a cache (in memory,
    then the file); :func:`measure` runs (and its figures are stored) only when neither has them."""
    key, parts = cache_key(policy, shape)
    if key in _MEMORY:
        return _MEMORY[key], True
    path = cache_file()
    entry = read_cache(path).get(key)
    if isinstance(entry, dict) and _valid(entry.get("figures")):
        _MEMORY[key] = entry["figures"]
        return entry["figures"], True
    figures = measure(policy, shape)
    _MEMORY[key] = figures
    write_cache(path, key, {**parts, "figures": figures, "date": time.strftime("%Y-%m-%d")})
    return figures, False


# ---------------------------------------------------------------------------------------------- the probe
def measure(policy: Any, shape: ProbeShape, repeats: int = REPEATS) -> Figures:
    """Time each stage in float32 and bf16 (see the module doc) on the policy's CPU: median seconds per round."""
    model, vocab, pad = policy.model, policy.vocab_size, policy.pad_token_id
    generator = torch.Generator(device=policy.device).manual_seed(0)

    def tokens(rows: int, length: int) -> torch.Tensor:
        return torch.randint(vocab, (rows, length), generator=generator, device=policy.device)

    group = -(-shape.rows // shape.prompts)  # rows per prompt, as in a rollout (G)
    rollout = tokens(shape.prompts, shape.prompt_tokens).repeat_interleave(group, 0)[: shape.rows]  # (rows, P)

    def decode() -> None:
        ones = torch.ones_like(rollout)  # no EOS id: every row runs all the steps
        sample(
            model,
            rollout,
            ones,
            max_new_tokens=DECODE_STEPS,
            eos_token_id=[],
            pad_token_id=pad,
            vocab_size=vocab,
            generator=generator,
        )

    def forward_backward(prompts: torch.Tensor) -> Callable[[], None]:
        completions = tokens(len(prompts), shape.new_tokens)  # (rows, C)
        mask = torch.ones_like(completions, dtype=torch.bool)

        def run() -> None:
            log_probs, _ = completion_log_probs(
                model, prompts, torch.ones_like(prompts), completions, mask, vocab_size=vocab, pad_id=pad
            )
            log_probs.sum().backward()

        return run

    try:
        with torch.no_grad():
            figures = {"sampling": _median_seconds(decode, repeats)}
        figures["update"] = _median_seconds(forward_backward(rollout[:MAX_ROWS]), repeats)
        examples = tokens(min(shape.sft_rows, MAX_ROWS), shape.prompt_tokens)  # distinct problems
        figures["sft"] = _median_seconds(forward_backward(examples), repeats)
    finally:
        model.zero_grad(set_to_none=True)
    return figures


def _median_seconds(run: Callable[[], None], repeats: int) -> dict[str, float]:
    """Median wall seconds of ``run`` under float32 and under bf16 autocast, alternating, after a warm-up round
    (not counted) whose length cuts the rounds to about :data:`STAGE_BUDGET_S` seconds (at least 2)."""

    def seconds(precision: str) -> float:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            run()
        return time.perf_counter() - start

    warm_up = sum(seconds(precision) for precision in COMPARED)
    rounds = max(2, min(repeats, int(STAGE_BUDGET_S / max(warm_up, 1e-9))))
    times: dict[str, list[float]] = {precision: [] for precision in COMPARED}
    for _ in range(rounds):
        for precision in COMPARED:
            times[precision].append(seconds(precision))
    return {precision: statistics.median(values) for precision, values in times.items()}
