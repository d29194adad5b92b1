"""Group parallelism on ``torch.distributed``: the K groups of a rollout spread over processes.

Launch like any PyTorch job — ``torchrun --nproc_per_node=N -m algorithms.cli train ...`` (or
``grpo-gym train --nproc N``, which runs exactly that) on one machine, ``torchrun --nnodes ... --rdzv-endpoint
...`` across machines. :class:`Distributed` reads torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``) and joins the process group (``nccl`` on GPUs, ``gloo`` on CPU) with a timeout: a rank that
dies ends the others' next collective with an error at once (its sockets close), and a rank that hangs ends
them after ``timeout`` seconds; torchrun then stops every rank and reports which one failed. No silent hang.

Gradients are combined by a DDP reducer used for communication only (:class:`GradientSync`): after each
rank's backward, the local gradients go through ``DistributedDataParallel`` with PyTorch's communication
hooks, so the usual compressions apply unchanged: ``fp16`` / ``bf16`` (``default_hooks``) and ``powersgd``
(``powerSGD_hook``, rank 1, after 2 plain steps).
"""

from __future__ import annotations

import datetime
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

COMPRESSIONS = (None, "fp16", "bf16", "powersgd")


class Distributed:
    """This process's place in the job: ``rank``, ``world_size``, ``is_main``; one process when not launched
    by torchrun (``WORLD_SIZE`` unset or 1) and no process group was set up by the caller.

    :param timeout: seconds a collective waits for the other ranks before failing (hangs end the job)
    :param backend: ``"auto"`` (``nccl`` with CUDA, else ``gloo``), ``"nccl"`` or ``"gloo"``
    """

    def __init__(self, timeout: float = 300.0, backend: str = "auto") -> None:
        if not dist.is_available():
            self.rank, self.world_size = 0, 1
            return
        if not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            if backend == "auto":
                backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
        initialized = dist.is_initialized()
        self.rank = dist.get_rank() if initialized else 0
        self.world_size = dist.get_world_size() if initialized else 1

    @property
    def enabled(self) -> bool:
        """Whether there is more than one process."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that logs, prints and saves."""
        return self.rank == 0

    def device(self, requested: str | torch.device) -> str | torch.device:
        """This rank's GPU (``cuda:LOCAL_RANK``) when CUDA is asked for (or ``"auto"`` finds it)."""
        wants_cuda = str(requested).startswith("cuda") or (requested == "auto" and torch.cuda.is_available())
        if self.enabled and wants_cuda:
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return requested

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` concatenated along dim 0, in rank order (the tensor itself on one process)."""
        if not self.enabled:
            return tensor
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        local = tensor.detach().to(device)
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local.contiguous())
        return torch.cat(parts).to(tensor.device)

    def gather_objects(self, value: Any) -> list[Any]:
        """Every rank's picklable ``value``, in rank order."""
        if not self.enabled:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def sum(self, value: float) -> float:
        """The sum of a number over the ranks."""
        if not self.enabled:
            return value
        return float(sum(self.gather_objects(value)))

    def broadcast_module(self, module: nn.Module) -> None:
        """Rank 0's parameters and buffers into ``module`` on every rank."""
        if not self.enabled:
            return
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)


class _Dot(nn.Module):
    """``sum_i <p_i, g_i>``: its gradient with respect to each parameter is the given ``g_i``."""

    def __init__(self, parameters: list[nn.Parameter]) -> None:
        super().__init__()
        self.params = nn.ParameterList(parameters)

    def forward(self, gradients: list[torch.Tensor]) -> torch.Tensor:
        return sum((p * g).sum() for p, g in zip(self.params, gradients, strict=True))


class GradientSync:
    """Average the gradients of ``parameters`` over the ranks through a DDP reducer and its comm hook.

    ``sync()`` takes each parameter's local gradient ``g``, and back-propagates ``sum <p, g * world_size>``
    through a ``DistributedDataParallel`` wrapper around those same parameters: DDP's reducer all-reduces the
    gradients bucket by bucket with the chosen hook and divides by the world size, so each ``p.grad`` ends as
    the sum of the ranks' gradients (the caller weights each rank's loss by its share of the global batch).
    The calls, the time spent and the bytes the hooks all-reduce (after compression) are counted for the
    benchmark.

    :param parameters: the trainable parameters (the same objects the optimizer holds)
    :param compression: ``None``, ``"fp16"``, ``"bf16"`` or ``"powersgd"``
    """

    def __init__(self, parameters: list[nn.Parameter], world_size: int, compression: str | None = None) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"gradient_compression must be one of {COMPRESSIONS}, got {compression!r}")
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        self.parameters, self.world_size = parameters, world_size
        # PowerSGD chains its all-reduces in future callbacks; with several buckets in flight, gloo can see them
        # in different orders on different ranks, so it gets one bucket holding every gradient
        whole = sum(p.numel() * p.element_size() for p in parameters) / 2**20 + 1
        bucket_mb = whole if compression == "powersgd" else None
        self.ddp = nn.parallel.DistributedDataParallel(_Dot(parameters), bucket_cap_mb=bucket_mb)
        self.seconds, self.bytes, self.steps = 0.0, 0, 0
        if compression == "powersgd":
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2)
            hook = powerSGD_hook.powerSGD_hook
        else:
            state = None
            hook = {
                None: default_hooks.allreduce_hook,
                "fp16": default_hooks.fp16_compress_hook,
                "bf16": default_hooks.bf16_compress_hook,
            }[compression]
        self.ddp.register_comm_hook(state, hook)

    def sync(self) -> None:
        """Replace every local ``p.grad`` by the sum over the ranks (missing gradients count as zeros)."""
        start = time.perf_counter()
        local = [(p.grad if p.grad is not None else torch.zeros_like(p)) * self.world_size for p in self.parameters]
        for p in self.parameters:
            p.grad = None
        original = dist.all_reduce

        def counted(tensor, *args, **kwargs):  # the hooks' all-reduces, compressed or not, while DDP runs them
            self.bytes += tensor.numel() * tensor.element_size()
            return original(tensor, *args, **kwargs)

        dist.all_reduce = counted
        try:
            self.ddp(local).backward()
        finally:
            dist.all_reduce = original
        self.seconds += time.perf_counter() - start
        self.steps += 1
