"""Mixed precision (S15): which autocast dtype a run uses, and the gradient scaler fp16 needs.

The model's weights, the optimizer state, the value head and every loss reduction stay float32; only the
language model's forward passes run under ``torch.autocast`` (its matmuls in 16 bits). ``"auto"`` picks:

- CUDA: ``bf16`` when the GPU supports it (Ampere and newer: float32's exponent range, so no loss scaling and
  no overflow), else ``fp16`` with a gradient scaler (S15's "FP16 policy").
- CPU: ``bf16`` when the CPU computes it natively (AMX or AVX512-BF16), else ``no``: emulated bf16 matmuls
  are slower than float32 ones, so there is nothing to gain but memory (pass ``"bf16"`` for that).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

PRECISIONS = ("no", "fp16", "bf16", "auto")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bf16 matmul instructions (AMX-BF16 or AVX512-BF16), from ``/proc/cpuinfo``."""
    try:
        with open("/proc/cpuinfo") as info:
            flags = next((line for line in info if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """``"no"``, ``"fp16"`` or ``"bf16"``: what ``precision`` (one of :data:`PRECISIONS`) means on ``device``."""
    if precision not in PRECISIONS:
        raise ValueError(f"mixed_precision must be one of {PRECISIONS}, got {precision!r}")
    device = torch.device(device)
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if device.type == "cpu":
        return "bf16" if cpu_has_native_bf16() else "no"
    return "no"


@contextlib.contextmanager
def autocast(dtype: torch.dtype | None, device: torch.device | str) -> Iterator[None]:
    """``torch.autocast`` to ``dtype`` on ``device``'s type, or nothing when ``dtype`` is None."""
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=torch.device(device).type, dtype=dtype):
        yield


def float32_region(device: torch.device | str) -> contextlib.AbstractContextManager:
    """A region where autocast is off (the value head and the loss reductions stay float32)."""
    return torch.autocast(device_type=torch.device(device).type, enabled=False)
