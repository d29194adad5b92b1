"""FSDP2 sharding (``torch.distributed.fsdp.fully_shard``): each of the job's N processes holds 1/N of every weight.

With DDP every process holds a whole replica: the weights, their gradients and AdamW's two moments (16 bytes per
parameter in float32), and the frozen reference. Sharded, each process keeps a ``DTensor`` shard (1/N along dim 0)
of each of them, and a decoder layer's full weights exist only while that layer runs (gathered for its forward,
freed after it, gathered again for its backward). What an algorithm calls:

- :func:`device_mesh`: the 1-D mesh over the job's processes, made for the run's device type (a CPU run on gloo
  never lands on a GPU).
- :func:`shard_model`: rank 0's weights copied to every rank, then each decoder layer and then the whole model
  ``fully_shard``-ed. A LoRA ``PeftModel`` is sharded by the Hugging Face model inside it, after the adapters were
  injected, so adapters and frozen base weights are all sharded ``DTensor``\\ s and a forward never mixes plain
  tensors with ``DTensor``\\ s (peft#2344). Parameters are replaced by new objects: make the optimizer afterwards.
  A sharded module cannot be ``deepcopy``-ed (FSDP forbids it): copy a frozen reference before sharding, shard it
  the same way, and refresh it later with :func:`copy_weights`.
- Precision: ``compute_dtype`` (bf16 or fp16) is ``MixedPrecisionPolicy``'s ``param_dtype``: forward and backward
  run on 16-bit copies of the gathered weights, while the sharded weights ("master" weights), the optimizer state
  and the gradient reduction (``reduce_dtype``) stay float32.
- Gradient reduction: the processes' gradients are **summed** (``ReduceOp.SUM``, divide factor 1), as
  :class:`~algorithms.common.runtime.distributed.GradientSync` does: each rank weights its loss by its share of the
  global batch. FSDP2's default, ``ReduceOp.AVG``, is never used: gloo's AVG reduce-scatter has summed without dividing
  (pytorch#162338, open; torch 2.13 averaged correctly in our check, but nothing guards it), and a divide factor
  of 1 without forcing SUM becomes ``PREMUL_SUM``, which gloo refuses.
- :func:`gathered_weights`: every layer's full weights as plain tensors on every rank for a block, so the
  KV-cache decoders (:mod:`~algorithms.common.generation.decoders`), which read a model's weights directly, sample
  from a sharded model. It costs one all-gather per rollout and, for the block's duration, the memory of the full
  weights in ``compute_dtype`` (``benchmarks/sharding.py`` measures it).
- :func:`clip_grad_norm`, :func:`copy_weights` (a sharded frozen reference refreshed from the policy, shard by
  shard), :func:`full_state_dict` / :func:`full_optimizer_state_dict` (gathered to rank 0 on the CPU, in the
  layout of an unsharded model: the model zip and ``save_pretrained`` write ordinary files) and
  :func:`load_full_state` (such a file into a sharded model).

Sharded checkpoints (each rank writes its own shard): :mod:`~algorithms.common.saving.sharded`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from algorithms.common.model.gradient_checkpointing import decoder_layers
from algorithms.common.model.lora import base_network

#: the name of the mesh's one dimension (peft reads it to tell FSDP sharding from tensor parallelism)
MESH_DIM = "fsdp"
#: gathered to rank 0 and moved to the CPU: what an ordinary file of the whole model holds
GATHERED = StateDictOptions(full_state_dict=True, cpu_offload=True)

__all__ = [
    "clip_grad_norm",
    "copy_weights",
    "device_mesh",
    "full_optimizer_state_dict",
    "full_state_dict",
    "gathered_weights",
    "is_sharded",
    "load_full_state",
    "regather",
    "shard_model",
]


def device_mesh(device: torch.device | str) -> DeviceMesh:
    """The 1-D mesh over every process of the job, for ``device``'s type (``"cpu"`` or ``"cuda"``)."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "sharding needs a process group: launch with torchrun, e.g. "
            "torchrun --nproc_per_node 2 -m algorithms.cli train ... (one process trains unsharded)"
        )
    kind = torch.device(device).type
    backend = str(dist.get_backend())
    if kind == "cpu" and "gloo" not in backend:
        raise ValueError(f"sharding on the CPU needs the gloo backend; the process group uses {backend!r}")
    return init_device_mesh(kind, (dist.get_world_size(),), mesh_dim_names=(MESH_DIM,))


def fsdp_modules(module: nn.Module) -> list[FSDPModule]:
    """The ``fully_shard``-ed modules inside ``module`` (itself included), outermost first."""
    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def is_sharded(module: nn.Module) -> bool:
    """Whether some part of ``module`` is ``fully_shard``-ed."""
    return bool(fsdp_modules(module))


def shard_model(
    model: nn.Module, mesh: DeviceMesh, compute_dtype: torch.dtype | None = None, layers_per_group: int = 1
) -> nn.Module:
    """Shard ``model`` in place over ``mesh`` (see the module doc) and return it.

    :param model: a Hugging Face causal LM, a peft ``PeftModel`` around one, or any module (sharded whole), on the
        mesh's device type, identical on every rank or not (rank 0's weights are copied to the others first)
    :param mesh: the 1-D mesh of :func:`device_mesh`
    :param compute_dtype: the dtype forward and backward compute in (``torch.bfloat16``, ``torch.float16``), or None
        for the weights' own (float32); the weights, optimizer state and gradient reduction stay float32
    :param layers_per_group: consecutive decoder layers gathered together (one all-gather, their weights whole at
        once). Gradient checkpointing in chunks of N layers
        (:func:`~algorithms.common.model.gradient_checkpointing.checkpoint_every`) needs N here: a chunk runs its
        layers' computations from its first layer's forward
    """
    if layers_per_group < 1:
        raise ValueError(f"layers_per_group must be >= 1, got {layers_per_group}")
    network = base_network(model)
    if is_sharded(network):
        raise ValueError("the model is sharded already; shard_model takes an unsharded model")
    _broadcast_from_first(network, mesh)
    policy = MixedPrecisionPolicy(
        param_dtype=compute_dtype, reduce_dtype=torch.float32 if compute_dtype is not None else None
    )
    layers = list(decoder_layers(network, required=False))  # gradient checkpointing's chunks are groups of these
    for start in range(0, len(layers), layers_per_group):
        group = layers[start : start + layers_per_group]
        fully_shard(group if len(group) > 1 else group[0], mesh=mesh, mp_policy=policy, reshard_after_forward=True)
    # the root's weights (embeddings, final norm, head) stay gathered from the forward to the backward
    fully_shard(network, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    for module in fsdp_modules(network):
        module.set_force_sum_reduction_for_comms(True)  # SUM, never AVG (pytorch#162338)
        module.set_gradient_divide_factor(1.0)  # the sum itself: each rank's loss carries its share of the batch
    # FSDP2 initialises a root at its first forward, and reads then which parameters train to fix each group's
    # gradient dtype; peft's disable_adapter() freezes the adapters while it runs, so a first forward under it (the
    # LoRA reference's) would leave bf16 gradients for float32 master weights: initialise now (private API)
    network._get_fsdp_state()._lazy_init()
    return model


def _broadcast_from_first(module: nn.Module, mesh: DeviceMesh) -> None:
    """Rank 0's (of the mesh) parameters and buffers into ``module`` on every rank."""
    group = mesh.get_group()
    source = dist.get_global_rank(group, 0)
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=source, group=group)


def _roots(modules: list[FSDPModule]) -> list[FSDPModule]:
    """The modules of ``modules`` that no other one contains (reshard_after_forward False, see shard_model)."""
    inner = {id(sub) for m in modules for sub in m.modules() if sub is not m}
    return [m for m in modules if id(m) not in inner]


@contextlib.contextmanager
def gathered_weights(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` with every sharded module's full weights gathered (plain tensors, in the compute dtype) on every
    rank for the block, then sharded again; an unsharded model as it is. Forward calls inside the block keep the
    weights gathered (no all-gather per call). Collective: every rank enters it."""
    modules = fsdp_modules(model)
    if not modules:
        yield model
        return
    roots = {id(m) for m in _roots(modules)}
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
    _unshard(modules)
    try:
        yield model
    finally:
        for module in modules:
            module.reshard()
            module.set_reshard_after_forward(id(module) not in roots, recurse=False)


def regather(model: nn.Module) -> None:
    """Gather ``model``'s weights again inside a :func:`gathered_weights` block, after something sharded them (a
    ``state_dict()`` call reshards a sharded module: saving inside the block does). Collective."""
    _unshard(fsdp_modules(model))


def _unshard(modules: list[FSDPModule]) -> None:
    for handle in [module.unshard(async_op=True) for module in modules]:
        handle.wait()


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a ``DTensor``; a plain tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """``clip_grad_norm_`` over sharded or plain parameters: the norm of the whole gradient (every rank's shards),
    as a plain 0-d tensor, the same on every rank."""
    norm = nn.utils.clip_grad_norm_(list(parameters), max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def copy_weights(source: nn.Module, target: nn.Module) -> None:
    """Copy ``source``'s parameters and buffers into ``target``'s, shard by shard, with no communication: both
    modules plain, or both sharded alike (the same architecture through :func:`shard_model` on the same mesh)."""
    targets = dict(target.named_parameters()) | dict(target.named_buffers())
    sources = dict(source.named_parameters()) | dict(source.named_buffers())
    if targets.keys() != sources.keys():
        raise ValueError("copy_weights: the two modules have different parameters; pass two copies of one model")
    with torch.no_grad():
        for name, value in sources.items():
            mine, theirs = _local(targets[name]), _local(value)
            if mine.shape != theirs.shape:
                raise ValueError(f"copy_weights: {name} is {tuple(theirs.shape)} here, {tuple(mine.shape)} there")
            mine.copy_(theirs)


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s state dict with every tensor whole, on the CPU, keyed as the unsharded module's: on rank 0 for
    a sharded module (the other ranks get ``{}``; collective), on every rank for an unsharded one."""
    if not is_sharded(module):
        return {key: value.detach().to("cpu", copy=True) for key, value in module.state_dict().items()}
    return _unshared(get_model_state_dict(module, options=GATHERED), module.state_dict().values())


def full_optimizer_state_dict(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` as the unsharded model's optimizer would give it (parameters numbered in the
    optimizer's order, whole tensors, on the CPU): on rank 0 for a sharded ``module`` (``{}`` on the others;
    collective), on every rank for an unsharded one. An optimizer that has not stepped yet has no state, and none
    is created: torch's gathering would create it with a zero step, which changes AdamW's next steps."""
    if not optimizer.state or not is_sharded(module):
        return _to_cpu(optimizer.state_dict())
    named = get_optimizer_state_dict(module, optimizer, options=GATHERED)
    if not named:
        return {}
    live = [value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)]
    named["state"] = {fqn: _unshared(values, live) for fqn, values in named["state"].items()}
    number: dict[str, int] = {}
    groups = []
    for group in named["param_groups"]:
        groups.append({**group, "params": [number.setdefault(fqn, len(number)) for fqn in group["params"]]})
    return {"state": {number[fqn]: value for fqn, value in named["state"].items()}, "param_groups": groups}


def _unshared(state: dict[str, Any], live: Iterable[torch.Tensor]) -> dict[str, Any]:
    """``state`` with a copy of each tensor that shares memory with a ``live`` one (torch's gathering returns plain
    CPU tensors, e.g. AdamW's ``step`` or the buffers, as they are: the next step would change the result)."""
    pointers = {_local(tensor).data_ptr() for tensor in live} - {0}
    return {
        key: value.clone() if torch.is_tensor(value) and value.data_ptr() in pointers else value
        for key, value in state.items()
    }


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_cpu(item) for item in value]
    return value


def load_full_state(
    module: nn.Module,
    model_state: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> None:
    """Load whole-model state dicts (:func:`full_state_dict`'s and :func:`full_optimizer_state_dict`'s layout, e.g.
    read from a model zip by every rank) into a sharded or plain ``module`` and its ``optimizer``; each rank keeps
    its shards. An optimizer state without per-parameter entries (saved before the first step) leaves the
    optimizer as it is: fresh."""
    if not is_sharded(module):
        module.load_state_dict(model_state)
        if optimizer is not None and optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
        return
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(module, model_state, options=options)
    if optimizer is None or not (optimizer_state or {}).get("state"):
        return
    names = {id(p): fqn for fqn, p in module.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    groups = [{**group, "params": [order[i] for i in group["params"]]} for group in optimizer_state["param_groups"]]
    named = {"state": {order[i]: value for i, value in optimizer_state["state"].items()}, "param_groups": groups}
    set_optimizer_state_dict(module, optimizer, named, options=options)
