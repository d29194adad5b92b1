"""Mixed precision: which autocast dtype each stage of a run uses, and the gradient scaler fp16 needs.

The model's weights, the optimizer state, the value head and every loss reduction stay float32; only the
language model's forward passes run under ``torch.autocast`` (its matmuls in 16 bits). A run has three
stages (:data:`STAGES`): ``"sampling"`` (the rollouts' decoding), ``"update"`` (the log-probs and values the loss
is built from, the reference's log-probs) and ``"sft"`` (the cold start). ``mixed_precision`` is one of:

- ``"no"``, ``"bf16"`` or ``"fp16"``: that precision for every stage (``"fp16"`` with a gradient scaler);
- a dict ``{stage: precision}`` for stages in their own precisions (a stage left out is float32), e.g.
  ``{"sft": "bf16"}``; sampling in another precision than the update makes a fresh rollout slightly off-policy,
  which ``sampler_correction="auto"`` then corrects (:mod:`~algorithms.common.sampler_correction`);
- ``"auto"`` (the default), by device:

  - **CPU: float32 for every stage**, whatever the CPU. On a CPU with native bf16 (AMX, AVX512-BF16) bf16 can be
    faster, but it cost learning: on issue 30's pretrained start (a 1M-parameter Llama tuned on 3-digit addition,
    GRPO at lr 1e-4) sampling in float32 and updating in bf16 collapsed one seed in three from 72% to 4.5% held-out
    success where float32 kept it, and the speed it bought at these sizes was within 5% (benchmarks/RESULTS.md,
    "Learning that holds"). Ask for bf16 (``"bf16"`` or a dict) to trade that for memory or speed.
  - **CUDA: bf16 for every stage** where the GPU supports it (Ampere and newer: float32's exponent range, so no
    loss scaling and no overflow; its tensor cores run bf16 several times faster than float32 and halve the
    activations' memory), else ``fp16`` with a gradient scaler. Sampling and the update run in the same precision,
    so a fresh rollout's ratio stays 1 and no correction is needed.
  - any other device: float32.

:class:`PrecisionChoice` holds the outcome; the algorithm prints it (``verbose >= 1``) and writes it to
TensorBoard as the text ``precision/choice``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from grpo_gym.validation import check_choice

#: the stages of a run that may each run in their own precision
STAGES = ("sampling", "update", "sft")
PRECISIONS = ("no", "fp16", "bf16", "auto")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
NAMES = {"no": "float32", "bf16": "bf16", "fp16": "fp16"}

__all__ = ["DTYPES", "PRECISIONS", "STAGES", "PrecisionChoice", "check_precision", "choose_precision"]


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bf16 matmul instructions (AMX-BF16 or AVX512-BF16), from ``/proc/cpuinfo`` (False
    where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as info:
            flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def check_precision(name: str, value: Any) -> str | dict[str, str]:
    """``value`` if it is a valid ``mixed_precision`` (one of :data:`PRECISIONS`, or a dict of :data:`STAGES` to
    ``"no"``/``"bf16"``/``"fp16"``), else a ``ValueError`` naming ``name`` and what it takes."""
    if isinstance(value, str):
        return check_choice(name, value, PRECISIONS)  # a near miss ('BF16') gets its suggestion
    if isinstance(value, Mapping):
        unknown = [stage for stage in value if stage not in STAGES]
        wrong = {stage: p for stage, p in value.items() if stage in STAGES and p not in PRECISIONS[:3]}
        if not unknown and not wrong:
            return {str(stage): str(p) for stage, p in value.items()}
        problem = f"unknown stages {unknown} (stages: {list(STAGES)})" if unknown else f"precisions {wrong}"
        raise ValueError(
            f"{name} as a dict maps stages {list(STAGES)} to 'no', 'bf16' or 'fp16'; got {problem}, e.g. "
            f"{name}={{'sft': 'bf16'}}"
        )
    raise ValueError(
        f"{name} must be one of {list(PRECISIONS)} or a dict of stages to precisions (e.g. {{'sft': 'bf16'}}), "
        f"got {value!r}"
    )


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision of each stage of a run, and why.

    :param requested: the ``mixed_precision`` argument
    :param stages: ``{stage: "no" | "bf16" | "fp16"}`` for every stage of :data:`STAGES`
    :param reason: one sentence: how the choice was made
    """

    requested: str | dict[str, str]
    stages: dict[str, str]
    reason: str

    @property
    def dtypes(self) -> dict[str, torch.dtype | None]:
        """``{stage: autocast dtype}``, None for float32 (what :class:`TransformerPolicy` takes)."""
        return {stage: DTYPES.get(precision) for stage, precision in self.stages.items()}

    @property
    def mixes_sampling_and_update(self) -> bool:
        """Whether the rollouts are sampled in another precision than the update trains in (a fresh rollout is then
        slightly off-policy: see :mod:`~algorithms.common.sampler_correction`)."""
        return self.stages["sampling"] != self.stages["update"]

    @property
    def needs_scaler(self) -> bool:
        """Whether some stage runs in fp16 (the update then needs a gradient scaler)."""
        return "fp16" in self.stages.values()

    def describe(self) -> str:
        """A short text: each stage's precision and the reason."""
        stages = ", ".join(f"{stage} {NAMES[precision]}" for stage, precision in self.stages.items())
        return f"mixed_precision={self.requested!r}: {stages}. {self.reason}."


def choose_precision(precision: str | dict[str, str], device: torch.device | str) -> PrecisionChoice:
    """The precision of each stage for ``mixed_precision=precision`` on ``device`` (see the module doc)."""
    precision = check_precision("mixed_precision", precision)
    if isinstance(precision, dict):
        return PrecisionChoice(precision, {s: precision.get(s, "no") for s in STAGES}, "chosen per stage")
    if precision != "auto":
        return PrecisionChoice(precision, dict.fromkeys(STAGES, precision), "forced for every stage")
    kind = torch.device(device).type
    if kind == "cuda":
        bf16 = torch.cuda.is_bf16_supported()
        reason = "GPU with bf16" if bf16 else "GPU without bf16: fp16 with a gradient scaler"
        return PrecisionChoice(precision, dict.fromkeys(STAGES, "bf16" if bf16 else "fp16"), reason)
    if kind == "cpu":
        native = "with" if cpu_has_native_bf16() else "without"
        reason = f"CPU ({native} native bf16): float32, which learns safest; pass 'bf16' to use bf16"
        return PrecisionChoice(precision, dict.fromkeys(STAGES, "no"), reason)
    return PrecisionChoice(precision, dict.fromkeys(STAGES, "no"), f"float32 on {kind}")


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
