"""Bit-identical updates on CPU: torch's deterministic algorithms for the backward passes.

Found while checking that a resumed run equals an uninterrupted one: with the 359-token built-in vocabulary,
two runs with the same seed drew identical rollouts and computed identical losses, yet their gradients differed
in the last bits after a few updates, because some CPU backward kernels sum rows with repeated indices in an
order that depends on the threads. ``torch.use_deterministic_algorithms`` makes them deterministic, at no cost we
could measure on the update of the built-in tiny and small models.

Only the update and the cold start run under it, and only on CPU: on CUDA, cuBLAS would need
``CUBLAS_WORKSPACE_CONFIG`` set before the process starts. Sampling stays outside, and uninitialised memory is
not filled (the KV cache is allocated empty and written before it is read).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.utils.deterministic


@contextlib.contextmanager
def deterministic_on_cpu(device: torch.device | str) -> Iterator[None]:
    """Run the block with torch's deterministic algorithms when ``device`` is a CPU (settings restored after)."""
    if torch.device(device).type != "cpu" or torch.are_deterministic_algorithms_enabled():
        yield
        return
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = fill
