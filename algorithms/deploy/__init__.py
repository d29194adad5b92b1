"""Deployment: distil a trained policy into a smaller student, INT8 (QAT, PTQ, export), and serve it.

``from algorithms.deploy import distill``; the server (``algorithms.deploy.server``) needs the ``serve`` extra
(FastAPI, uvicorn) and is not imported here.
"""

from algorithms.deploy.distill import distill, distillation_kl, kl_terms
from algorithms.deploy.loading import load_policy, policy_for_model
from algorithms.deploy.quantize import (
    FakeQuantLinear,
    Int8Linear,
    load_int8,
    prepare_qat,
    quantize_int8,
    save_int8,
    strip_qat,
)

__all__ = [
    "FakeQuantLinear",
    "Int8Linear",
    "distill",
    "distillation_kl",
    "kl_terms",
    "load_int8",
    "load_policy",
    "policy_for_model",
    "prepare_qat",
    "quantize_int8",
    "save_int8",
    "strip_qat",
]
