"""The frozen reference a KL term (or a protected rollout) compares with: a frozen copy of the policy's network
(:func:`frozen_copy`), or with LoRA adapters the policy's own network with its adapters disabled, i.e. the base
model, with no copy (:mod:`algorithms.common.model.lora`); :func:`reference_network` gives whichever it is. In the
data flow: made at setup (and again after the cold start, by copying the weights), read by the update and by the
protected rollouts' sampler."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

from torch import nn


def frozen_copy(policy: Any) -> nn.Module | None:
    """A frozen copy of the policy's network, in eval mode; None with LoRA, whose reference is the base model."""
    if policy.lora is not None:
        return None
    reference = copy.deepcopy(policy.model).eval()
    reference.requires_grad_(False)
    return reference


@contextlib.contextmanager
def reference_network(policy: Any, ref_model: nn.Module | None) -> Iterator[nn.Module | None]:
    """The frozen reference network for the duration of the block: ``ref_model``, or with LoRA the policy's own
    network with its adapters disabled (the base model, no copy)."""
    if policy.lora is None or ref_model is not None:
        yield ref_model
        return
    with policy.model.disable_adapter():
        yield policy.model
