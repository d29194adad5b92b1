"""Mixed precision (S15): autocast forward passes, float32 weights/value head/loss, skipped non-finite steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from algorithms.common import precision
from algorithms.common.generation import completion_log_probs, sample
from algorithms.common.models import load_model
from algorithms.common.precision import resolve_precision
from tests.sizes import TINY, TINY_KWARGS
from tests.test_grpo import make_model, parameters


def test_resolve_precision(monkeypatch):
    assert [resolve_precision(p, "cpu") for p in ("no", "bf16", "fp16")] == ["no", "bf16", "fp16"]
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert resolve_precision("auto", "cpu") == "bf16"
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert resolve_precision("auto", "cpu") == "no"
    with pytest.raises(ValueError, match="mixed_precision must be one of"):
        resolve_precision("fp8", "cpu")
    with pytest.raises(ValueError, match="mixed_precision must be one of"):
        make_model(mixed_precision="fp8")


def test_bf16_log_probs_are_finite_and_close_to_float32():
    model = load_model("tiny", seed=0).eval()
    ids, mask = torch.randint(3, 100, (8, 6)), torch.ones(8, 6, dtype=torch.long)
    out = sample(model, ids, mask, max_new_tokens=16, eos_token_id=1, pad_token_id=0, vocab_size=103,
                 generator=torch.Generator().manual_seed(0))  # fmt: skip
    exact, _ = completion_log_probs(model, ids, mask, out.tokens, out.mask, vocab_size=103)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, entropy = completion_log_probs(model, ids, mask, out.tokens, out.mask, vocab_size=103, with_entropy=True)
    assert low.dtype == entropy.dtype == torch.float32  # the softmax and what follows run in float32
    assert torch.isfinite(low).all() and torch.isfinite(entropy).all()
    assert (low - exact).abs().max() < 0.1 and (low - exact)[out.mask].abs().mean() < 0.02


@pytest.mark.parametrize("mixed_precision", ["bf16", "fp16"])
def test_learn_under_autocast(tmp_path: Path, mixed_precision):
    policy_kwargs = {**TINY, "model_kwargs": {**TINY_KWARGS, "num_hidden_layers": 2}, "value_head": True}
    model = make_model(mixed_precision=mixed_precision, tensorboard_log=str(tmp_path), policy_kwargs=policy_kwargs)
    assert model.policy.autocast_dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[mixed_precision]
    assert (model._scaler is not None) == (mixed_precision == "fp16")
    before = parameters(model)
    model.learn(48)  # 6 updates: fp16's scaler may skip the first ones while it lowers its scale
    assert model._n_updates > 0 and model._n_updates + model._skipped_steps == 6
    assert all(p.dtype == torch.float32 for p in model.policy.parameters())  # float32 master weights
    assert model.policy.value_net.weight.dtype == torch.float32
    assert any(not torch.equal(a, b) for a, b in zip(before, parameters(model), strict=True))
    events = EventAccumulator(str(tmp_path / "GRPO_1")).Reload()
    for tag in ("train/loss", "train/value_loss", "train/grad_norm"):
        assert all(torch.isfinite(torch.tensor(e.value)) for e in events.Scalars(tag)), tag
    assert events.Scalars("train/skipped_steps")[-1].value == model._skipped_steps


def test_a_step_with_non_finite_gradients_is_skipped_and_counted():
    model = make_model()
    before = parameters(model)
    weights = next(model.policy.parameters())
    grad_norm = model._optimizer_step(weights.sum() * float("nan"))
    assert not torch.isfinite(grad_norm)
    assert model._skipped_steps == 1 and model._n_updates == 0
    assert all(torch.equal(a, b) for a, b in zip(before, parameters(model), strict=True))
    assert all(p.grad is None for p in model.policy.parameters())
    model._optimizer_step(weights.sum())  # a finite one goes through
    assert model._skipped_steps == 1 and model._n_updates == 1
