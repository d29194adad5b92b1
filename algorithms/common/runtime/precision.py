"""Mixed precision (S15): which autocast dtype each stage of a run uses, and the gradient scaler fp16 needs.

The model's weights, the optimizer state, the value head and every loss reduction stay float32; only the
language model's forward passes run under ``torch.autocast`` (its matmuls in 16 bits). A run has three
stages that may each run in their own precision (:data:`STAGES`): ``"sampling"`` (the rollouts' decoding),
``"update"`` (the log-probs and values the loss is built from, the reference's log-probs) and ``"sft"`` (the
cold start). ``"bf16"``, ``"fp16"`` and ``"no"`` (float32) force one precision for every stage; ``"auto"``
picks, never slower than float32:

- CUDA: ``bf16`` when the GPU supports it (Ampere and newer: float32's exponent range, so no loss scaling and
  no overflow), else ``fp16`` with a gradient scaler (S15's "FP16 policy"); no probe.
- CPU without native bf16 (no AMX-BF16 nor AVX512-BF16): float32 for every stage, no probe: emulated bf16
  matmuls are always slower (measured: a 99M-parameter update 3.4x slower on an AVX-512 Xeon, a 1024^3 matmul
  about 45x slower on an AVX2-only EPYC); pass ``"bf16"`` to trade that time for memory.
- CPU with native bf16: per stage, float32 unless a short probe of *this* model on *this* machine shows bf16
  at least :data:`BF16_MARGIN` (10%) faster: at small sizes the casts and fixed costs can outweigh the faster
  matmuls. The probe (:mod:`~algorithms.common.runtime.precision_probe`) runs once per model shape and machine: its
  figures are cached in memory and in a file under the user's cache folder.
- Any other device: float32.

:class:`PrecisionChoice` holds the outcome; the algorithm prints it (``verbose >= 1``) and writes it to
TensorBoard as the text ``precision/choice``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from algorithms.common.runtime import precision_probe
from algorithms.common.runtime.precision_probe import STAGES, ProbeShape

PRECISIONS = ("no", "fp16", "bf16", "auto")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
#: a stage runs in bf16 under ``"auto"`` on a CPU only when the probe's bf16 median is this much below float32's
BF16_MARGIN = 0.10
NAMES = {"no": "float32", "bf16": "bf16", "fp16": "fp16"}

__all__ = ["BF16_MARGIN", "DTYPES", "PRECISIONS", "STAGES", "PrecisionChoice", "ProbeShape", "choose_precision"]


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bf16 matmul instructions (AMX-BF16 or AVX512-BF16), from ``/proc/cpuinfo``."""
    flags = precision_probe.cpu_info()[1]
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """What ``precision`` (one of :data:`PRECISIONS`) means on ``device`` before any probe: ``"no"``, ``"fp16"``,
    ``"bf16"``, or ``"probe"`` (``"auto"`` on a CPU with native bf16: chosen per stage by :func:`choose_precision`).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"mixed_precision must be one of {PRECISIONS}, got {precision!r}")
    device = torch.device(device)
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if device.type == "cpu":
        return "probe" if cpu_has_native_bf16() else "no"
    return "no"


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision of each stage of a run, why, and the probe's figures behind it.

    :param requested: the ``mixed_precision`` argument
    :param stages: ``{stage: "no" | "bf16" | "fp16"}`` for every stage of :data:`STAGES`
    :param reason: one sentence: how the choice was made
    :param figures: the probe's median seconds ``{stage: {"no": s, "bf16": s}}`` (empty without a probe)
    :param cached: whether the figures came from the cache rather than a probe run now
    """

    requested: str
    stages: dict[str, str]
    reason: str
    figures: dict[str, dict[str, float]] = field(default_factory=dict)
    cached: bool = False

    @property
    def dtypes(self) -> dict[str, torch.dtype | None]:
        """``{stage: autocast dtype}``, None for float32 (what :class:`TransformerPolicy` takes)."""
        return {stage: DTYPES.get(precision) for stage, precision in self.stages.items()}

    @property
    def mixes_sampling_and_update(self) -> bool:
        """Whether the rollouts are sampled in another precision than the update trains in (a fresh rollout is then
        slightly off-policy: see :mod:`~algorithms.common.sampler_correction`)."""
        return self.stages["sampling"] != self.stages["update"]

    def without_mixed_sampling(self) -> PrecisionChoice:
        """This choice, with sampling and update both in float32 when they differed (what ``"auto"`` runs when the
        sampler correction is off); unchanged otherwise."""
        if not self.mixes_sampling_and_update:
            return self
        stages = {**self.stages, "sampling": "no", "update": "no"}
        reason = f"{self.reason}; sampling and update both float32, as the sampler correction is off"
        return replace(self, stages=stages, reason=reason)

    @property
    def needs_scaler(self) -> bool:
        """Whether some stage runs in fp16 (the update then needs a gradient scaler)."""
        return "fp16" in self.stages.values()

    def describe(self) -> str:
        """A short text: each stage's precision, the reason, and the probe's figures when there was a probe."""
        stages = ", ".join(f"{stage} {NAMES[precision]}" for stage, precision in self.stages.items())
        lines = [f"mixed_precision={self.requested!r}: {stages}. {self.reason}."]
        if self.figures:
            source = "cached probe" if self.cached else "probe"
            timings = "; ".join(
                f"{stage} {f['no'] * 1e3:.1f} / {f['bf16'] * 1e3:.1f} ms ({f['bf16'] / f['no']:.2f}x)"
                for stage, f in self.figures.items()
            )
            lines.append(f"{source} ({precision_probe.cpu_info()[0]}), median float32 / bf16: {timings}.")
        return "\n".join(lines)


def choose_precision(
    precision: str, device: torch.device | str, policy: Any = None, shape: ProbeShape | None = None
) -> PrecisionChoice:
    """The precision of each stage for ``precision`` on ``device`` (see the module doc).

    :param precision: one of :data:`PRECISIONS`
    :param device: the device the run trains on
    :param policy: the :class:`~algorithms.common.policies.TransformerPolicy` to probe (needed only for
        ``"auto"`` on a CPU with native bf16)
    :param shape: the batches to probe with (:meth:`ProbeShape.of`)
    """
    resolved = resolve_precision(precision, device)
    kind = torch.device(device).type
    if resolved != "probe":
        if precision != "auto":
            reason = "forced for every stage"
        elif kind == "cuda":
            reason = "GPU " + ("with bf16" if resolved == "bf16" else "without bf16: fp16 with a gradient scaler")
        elif kind == "cpu":
            reason = "CPU without native bf16 (emulated bf16 is slower): float32, no probe"
        else:
            reason = f"float32 on {kind}"
        return PrecisionChoice(precision, dict.fromkeys(STAGES, resolved), reason)
    if policy is None or shape is None:
        raise ValueError("mixed_precision='auto' on a CPU with native bf16 probes the model: pass policy and shape")
    figures, cached = precision_probe.cached_figures(policy, shape)
    stages = {s: "bf16" if figures[s]["bf16"] <= (1 - BF16_MARGIN) * figures[s]["no"] else "no" for s in STAGES}
    reason = f"CPU with native bf16: bf16 for a stage only where the probe shows it >= {BF16_MARGIN:.0%} faster"
    return PrecisionChoice(precision, stages, reason, {s: dict(figures[s]) for s in STAGES}, cached)


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
