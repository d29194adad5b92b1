"""Training stops the moment the weights or the optimizer's state stop being finite, and nothing is written from
such a state.

A NaN or an infinity in a parameter or in an Adam moment (from a learning rate too large, an overflow, a damaged
file) spreads to every weight within a step or two; a model in that state samples garbage, and every save would keep
it. :func:`find_nonfinite` names the first such tensor; :class:`NonFiniteStateError` is what the learning loop raises
after an update (naming the iteration) and what ``save`` raises instead of writing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch as th
from torch import nn

INF = float("inf")


class NonFiniteStateError(FloatingPointError):
    """The policy's weights or its optimizer's state hold a NaN or an infinity: training stopped, nothing saved."""


def _local(tensor: th.Tensor) -> th.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor  # FSDP2: the shard this process holds


def _named_state(module: nn.Module, optimizer: th.optim.Optimizer | None) -> Iterator[tuple[str, th.Tensor]]:
    """Every floating-point tensor of the module and its optimizer's state, with a name a reader can find."""
    names = {id(parameter): name for name, parameter in module.named_parameters()}
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        yield f"parameter {name!r}", tensor
    if optimizer is None:
        return
    for parameter, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, th.Tensor):
                yield f"the optimizer's {key!r} of {names.get(id(parameter), 'a parameter')!r}", value


def first_nonfinite(named: Iterable[tuple[str, th.Tensor]]) -> tuple[str, int, int] | None:
    """The first floating-point tensor of ``named`` holding a NaN or an infinity, as ``(name, count of bad values,
    size)``; None when all are finite. One pass of max-abs per tensor, one synchronisation. A tensor on the meta
    device (offloaded by a ``device_map``) holds no values to check."""
    tensors = [(name, _local(t).detach()) for name, t in named]
    tensors = [(name, t) for name, t in tensors if t.is_floating_point() and t.numel() > 0 and not t.is_meta]
    if not tensors:
        return None
    peaks = th.stack([th.linalg.vector_norm(t, ord=INF).float().cpu() for _, t in tensors])
    if bool(th.isfinite(peaks).all()):
        return None
    name, tensor = next((name, t) for (name, t), peak in zip(tensors, peaks, strict=True) if not th.isfinite(peak))
    return name, int((~th.isfinite(tensor)).sum()), tensor.numel()


def find_nonfinite(module: nn.Module, optimizer: th.optim.Optimizer | None = None) -> str | None:
    """The first tensor of ``module`` or ``optimizer``'s state holding a NaN or an infinity, as ``"<name> (<count>
    of <size> values)"``; None when all are finite."""
    found = first_nonfinite(_named_state(module, optimizer))
    return None if found is None else f"{found[0]} ({found[1]} of {found[2]} values NaN or infinite)"
