"""How the job's processes share the training (several processes): whole replicas (DDP) or shards (FSDP2).

The algorithm (:class:`~algorithms.common.base_class.LMBaseAlgorithm`) owns one of two objects with the same methods
and calls them at fixed points: once the policy and the reference are built (:meth:`~Sharded.prepare`), before the
first update (:meth:`~Sharded.start`), after each backward (:meth:`~Sharded.reduce`) and around sampling
(:meth:`~Sharded.gathered`).

- :class:`Replicated` (``sharding=None``, and any run on one process): every process holds the whole policy, its
  gradients, AdamW's state and the reference. Rank 0's weights are copied to the others once, after the cold start,
  and after each backward the gradients are summed by a DDP reducer (:class:`GradientSync`, with its compression).
- :class:`Sharded` (``sharding="fsdp"`` on several processes): the policy's network, its value head and the frozen
  reference are ``fully_shard``-ed at setup (:func:`~algorithms.common.runtime.sharding.shard_model`, which copies
  rank 0's weights to every rank), and the optimizer is made again over the shards. The backward sums the gradients
  itself (a reduce-scatter per layer), so each rank keeps weighting its loss by its share of the job's batch, as
  under DDP. The gathered weights compute in the update's precision (``MixedPrecisionPolicy``: bf16 compute, float32
  master weights, optimizer state and reduction; float32 otherwise); fp16 is refused (its gradient scaler would
  decide to skip a step from this rank's shards alone). A rollout samples from the whole weights, gathered once
  for it (:meth:`Sharded.gathered`: the memory of the full weights in the compute dtype for the rollout's duration;
  ``benchmarks/sharding.py`` measures it). Saving gathers whole tensors to rank 0 (:meth:`Sharded.whole_parameters`,
  a collective) or writes a sharded checkpoint (:meth:`Sharded.save_checkpoint`), which
  :func:`~algorithms.common.saving.sharded.load_policy` reads back on any number of processes.

With sharding, whatever needs the weights is a collective: every rank trains, saves, predicts and enters
``gathered``; one rank may then sample alone inside the block (e.g. rank 0 evaluating).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from algorithms.common.model.gradient_checkpointing import DEFAULT_EVERY
from algorithms.common.runtime.distributed import Distributed, GradientSync
from algorithms.common.runtime.sharding import (
    device_mesh,
    full_optimizer_state_dict,
    full_state_dict,
    gathered_weights,
    regather,
    shard_model,
)
from algorithms.common.saving.sharded import save_policy

#: the ``sharding`` argument's values
SHARDINGS = (None, "fsdp")

__all__ = ["SHARDINGS", "Replicated", "Sharded", "parallelism"]


def parallelism(sharding: str | None, dist: Distributed, device: torch.device, compression: str | None):
    """The object for ``sharding`` on this job: :class:`Sharded` for ``"fsdp"`` on several processes, else
    :class:`Replicated` (one process has nothing to shard over: it trains, saves and loads unsharded)."""
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding must be one of {SHARDINGS}, got {sharding!r}")
    if sharding == "fsdp" and compression is not None:
        raise ValueError(
            f"distributed_kwargs gradient_compression={compression!r} compresses DDP's all-reduce; with "
            "sharding='fsdp' the gradients are reduce-scattered by FSDP2: leave it at None (or sharding at None)"
        )
    return Sharded(dist, device) if sharding == "fsdp" and dist.enabled else Replicated(dist, compression)


class Replicated:
    """Whole replicas on every process (DDP, or one process): see the module docstring."""

    sharded = False

    def __init__(self, dist: Distributed, compression: str | None = None) -> None:
        self.dist, self.compression = dist, compression
        #: the DDP reducer, made by :meth:`start` (None on one process)
        self.sync: GradientSync | None = None

    @property
    def sft_loss_weight(self) -> float:
        """The weight of each rank's cold-start loss: every rank runs the whole SFT batch on its own replica."""
        return 1.0

    def prepare(self, policy: Any, reference: nn.Module | None, precision: Any) -> None:
        """Nothing: the replicas are made equal by :meth:`start`."""

    def start(self, policy: nn.Module, reference: nn.Module | None) -> None:
        """Once, after the cold start: rank 0's weights everywhere, and the reducer that sums the gradients."""
        if not self.dist.enabled or self.sync is not None:
            return
        self.dist.broadcast_module(policy)
        if reference is not None:
            self.dist.broadcast_module(reference)
        trainable = [p for p in policy.parameters() if p.requires_grad]
        self.sync = GradientSync(trainable, self.dist.world_size, self.compression)

    def reduce(self) -> None:
        """After a backward: each gradient becomes the sum of every rank's (share-weighted) gradient."""
        if self.sync is not None:
            self.sync.sync()

    @contextlib.contextmanager
    def gathered(self, *models: nn.Module | None) -> Iterator[None]:
        """Nothing to gather: the weights are whole."""
        yield

    def save_checkpoint(self, directory: str | os.PathLike, policy: nn.Module, reference: nn.Module | None,
                        write_extra: Callable[[Path], None]) -> Path:  # fmt: skip
        """:meth:`Sharded.save_checkpoint` of whole replicas (rank 0 writes the tensors every rank holds)."""
        return save_policy(directory, policy, reference, write_extra)


class Sharded:
    """FSDP2 over the job's processes: see the module docstring.

    :param dist: the job's processes
    :param device: this rank's device (the mesh is made for its type)
    """

    sharded = True

    def __init__(self, dist: Distributed, device: torch.device) -> None:
        self.dist, self.device = dist, torch.device(device)
        self._open: list[nn.Module] = []  # the models of the open gathered blocks, kept gathered across a save

    @property
    def sft_loss_weight(self) -> float:
        """Every rank runs the same cold-start batch and the backward sums the ranks' gradients: 1 / processes."""
        return 1.0 / self.dist.world_size

    def prepare(self, policy: Any, reference: nn.Module | None, precision: Any) -> None:
        """Shard the reference (a copy made before, as a sharded module cannot be copied), the policy's network
        (decoder layers in groups of its gradient-checkpointing chunk) and value head, and make the optimizer again
        over the shards."""
        if precision.needs_scaler:
            raise ValueError(
                f"sharding='fsdp' computes in bf16 or float32, but mixed_precision={precision.requested!r} chose fp16 "
                "(its gradient scaler would skip steps from one rank's shards alone): pass mixed_precision='bf16' "
                "or 'no'"
            )
        every = policy.gradient_checkpointing
        layers = 1 if not every else DEFAULT_EVERY if every is True else int(every)
        mesh = device_mesh(self.device)
        compute = precision.dtypes["update"]
        for network in (reference, policy.model):
            if network is not None:
                shard_model(network, mesh, compute, layers_per_group=layers)
        if policy.value_net is not None:
            shard_model(policy.value_net, mesh)  # float32, as the value head always computes
        policy.make_optimizer(policy.optimizer.param_groups[0]["lr"])

    def start(self, policy: nn.Module, reference: nn.Module | None) -> None:
        """Nothing: :meth:`prepare` copied rank 0's weights, and the backward sums the gradients."""

    def reduce(self) -> None:
        """Nothing: the backward reduce-scattered the summed gradients already."""

    @contextlib.contextmanager
    def gathered(self, *models: nn.Module | None) -> Iterator[None]:
        """The whole weights of ``models`` (the ones not gathered already) on every rank for the block; a save
        inside it keeps them gathered. Collective."""
        new = [m for m in models if m is not None and not any(m is other for other in self._open)]
        with contextlib.ExitStack() as stack:
            for model in new:
                stack.enter_context(gathered_weights(model))
            self._open.extend(new)
            try:
                yield
            finally:
                del self._open[len(self._open) - len(new) :]

    def whole_parameters(self, policy: nn.Module, reference: nn.Module | None) -> dict[str, dict[str, Any]]:
        """SB3's ``get_parameters`` with whole tensors on the CPU, gathered to rank 0 (the others get empty dicts).
        Collective."""
        parameters = {
            "policy": full_state_dict(policy),
            "policy.optimizer": full_optimizer_state_dict(policy, policy.optimizer),
        }
        if reference is not None:
            parameters["ref_model"] = full_state_dict(reference)
        self._regather()
        return parameters

    def whole_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """``module``'s whole state dict on rank 0 (``{}`` elsewhere). Collective."""
        state = full_state_dict(module)
        self._regather()
        return state

    def save_checkpoint(
        self,
        directory: str | os.PathLike,
        policy: nn.Module,
        reference: nn.Module | None,
        write_extra: Callable[[Path], None],
    ) -> Path:
        """A sharded checkpoint folder of the policy, its optimizer and the reference (each rank its shards),
        with ``write_extra``'s files from rank 0, atomically
        (:func:`~algorithms.common.saving.sharded.save_policy`). Collective."""
        saved = save_policy(directory, policy, reference, write_extra)
        self._regather()
        return saved

    def _regather(self) -> None:
        """Gather the open blocks' models again: reading a sharded module's state dict reshards it."""
        for model in self._open:
            regather(model)
