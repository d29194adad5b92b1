"""Mixed precision (S15): the precision of each stage, autocast forward passes, float32 weights/value head/loss,
skipped non-finite steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from algorithms.common.generation.sampler import completion_log_probs, sample
from algorithms.common.model.loading import load_model
from algorithms.common.runtime import precision, precision_probe
from algorithms.common.runtime.precision import STAGES, choose_precision, resolve_precision
from tests import test_controls
from tests.sizes import TINY, TINY_KWARGS
from tests.test_grpo import make_model, parameters


def fake_bf16_cpu(monkeypatch, folder: Path, bf16_over_float32: dict[str, float]) -> list[object]:
    """A CPU with native bf16 whose probe measures ``bf16 / float32`` time ratios per stage, with empty caches
    (the file in ``folder``); returns the list of the probe's calls."""
    calls: list[object] = []

    def measure(policy, shape, repeats=precision_probe.REPEATS):
        calls.append(shape)
        return {stage: {"no": 0.1, "bf16": 0.1 * bf16_over_float32[stage]} for stage in STAGES}

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(precision_probe, "measure", measure)
    monkeypatch.setattr(precision_probe, "_MEMORY", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    return calls


def test_resolve_precision(monkeypatch):
    assert [resolve_precision(p, "cpu") for p in ("no", "bf16", "fp16")] == ["no", "bf16", "fp16"]
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert resolve_precision("auto", "cpu") == "probe"
    assert resolve_precision("no", "cpu") == "no"
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert resolve_precision("auto", "cpu") == "no"
    with pytest.raises(ValueError, match="mixed_precision must be one of"):
        resolve_precision("fp8", "cpu")
    with pytest.raises(ValueError, match="mixed_precision must be one of"):
        make_model(mixed_precision="fp8")


def test_auto_on_a_cpu_without_native_bf16_is_float32_without_a_probe(monkeypatch, tmp_path: Path):
    calls = fake_bf16_cpu(monkeypatch, tmp_path, dict.fromkeys(STAGES, 0.5))
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    model = make_model()
    assert model.precision.stages == dict.fromkeys(STAGES, "no") and not model.precision.figures
    assert model.policy.autocast_dtypes == dict.fromkeys(STAGES) and model._scaler is None
    assert calls == []


def test_auto_is_float32_where_the_probe_does_not_show_bf16_faster(monkeypatch, tmp_path: Path):
    """bf16 5% faster (under the 10% margin), 20% slower, as fast: float32 for every stage, no scaler."""
    fake_bf16_cpu(monkeypatch, tmp_path, {"sampling": 0.95, "update": 1.2, "sft": 1.0})
    model = make_model()
    assert model.precision.stages == dict.fromkeys(STAGES, "no")
    assert model.policy.autocast_dtypes == dict.fromkeys(STAGES) and model._scaler is None
    with model.policy.autocast("update"):
        assert not torch.is_autocast_enabled("cpu")


def test_auto_picks_bf16_for_the_stages_where_the_probe_shows_it_faster(monkeypatch, tmp_path: Path):
    fake_bf16_cpu(monkeypatch, tmp_path, {"sampling": 1.3, "update": 0.95, "sft": 0.6})
    model = make_model()
    assert model.precision.stages == {"sampling": "no", "update": "no", "sft": "bf16"}
    assert model.policy.autocast_dtypes == {"sampling": None, "update": None, "sft": torch.bfloat16}
    assert model._scaler is None  # no stage in fp16
    with model.policy.autocast("sft"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with model.policy.autocast("sampling"):
        assert not torch.is_autocast_enabled("cpu")
    assert model.precision.figures["sft"] == {"no": 0.1, "bf16": pytest.approx(0.06)}


def test_the_probe_runs_once_per_model_shape(monkeypatch, tmp_path: Path):
    calls = fake_bf16_cpu(monkeypatch, tmp_path, dict.fromkeys(STAGES, 0.5))
    first, second = make_model(), make_model(seed=1)  # same shape: the second reads the cache
    assert len(calls) == 1
    assert not first.precision.cached and second.precision.cached
    assert second.precision.stages == dict.fromkeys(STAGES, "bf16")
    make_model(policy_kwargs={**TINY, "model_kwargs": {**TINY_KWARGS, "num_hidden_layers": 2}})  # another shape
    assert len(calls) == 2
    monkeypatch.setattr(precision_probe, "_MEMORY", {})  # a new process: the file has them
    assert make_model().precision.cached and len(calls) == 2


@pytest.mark.parametrize("forced", ["no", "bf16", "fp16"])
def test_explicit_precisions_are_unchanged(monkeypatch, tmp_path: Path, forced):
    calls = fake_bf16_cpu(monkeypatch, tmp_path, {"sampling": 0.5, "update": 2.0, "sft": 0.5})
    model = make_model(mixed_precision=forced)
    assert model.precision.stages == dict.fromkeys(STAGES, forced) and calls == []
    assert model.policy.autocast_dtypes == dict.fromkeys(STAGES, precision.DTYPES.get(forced))
    assert (model._scaler is not None) == (forced == "fp16")


def test_auto_on_a_gpu_keeps_bf16_or_fp16_without_a_probe(monkeypatch, tmp_path: Path):
    calls = fake_bf16_cpu(monkeypatch, tmp_path, dict.fromkeys(STAGES, 2.0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert choose_precision("auto", "cuda").stages == dict.fromkeys(STAGES, "bf16")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    choice = choose_precision("auto", "cuda")
    assert choice.stages == dict.fromkeys(STAGES, "fp16") and choice.needs_scaler and calls == []


def test_the_choice_is_printed_and_in_tensorboard(monkeypatch, capsys, tmp_path: Path):
    fake_bf16_cpu(monkeypatch, tmp_path, {"sampling": 1.3, "update": 0.5, "sft": 0.95})
    model = make_model(verbose=1, tensorboard_log=str(tmp_path))
    printed = capsys.readouterr().out
    assert "sampling float32, update bf16, sft float32" in printed and "130.0 ms (1.30x)" in printed
    assert "sampler correction: tis" in printed  # the stages differ: "auto" corrects the sampler
    model.learn(8)
    events = EventAccumulator(str(tmp_path / "GRPO_1"), size_guidance={"tensors": 0}).Reload()
    tag = next(tag for tag in events.Tags()["tensors"] if tag.startswith("precision/choice"))
    text = events.Tensors(tag)[0].tensor_proto.string_val[0].decode()
    assert (
        text in printed
        and "update bf16" in text
        and text.endswith("sampler correction: tis (see algorithms.common.sampler_correction)")
    )


def test_numerics_tests_pin_float32_on_a_cpu_where_auto_picks_bf16(monkeypatch, tmp_path: Path):
    """On a CPU with native bf16 where the probe shows bf16 faster, ``auto`` picks it; a test that compares
    float32 numerics pins ``mixed_precision="no"`` and still passes there."""
    fake_bf16_cpu(monkeypatch, tmp_path, dict.fromkeys(STAGES, 0.5))
    assert make_model().precision.stages == dict.fromkeys(STAGES, "bf16")
    test_controls.test_diagnostics_give_the_joint_gradient(tmp_path, "no")


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
    assert model.policy.autocast_dtypes == dict.fromkeys(STAGES, precision.DTYPES[mixed_precision])
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
