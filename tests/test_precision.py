"""Mixed precision: the precision of each stage, autocast forward passes, float32 weights/value head/loss,
skipped non-finite steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from algorithms.common.generation.completion_pass import completion_log_probs
from algorithms.common.generation.sampler import sample
from algorithms.common.model.loading import load_model
from algorithms.common.runtime import precision
from algorithms.common.runtime.precision import STAGES, choose_precision
from tests.sizes import TINY, TINY_KWARGS
from tests.test_grpo import make_model, parameters

MIXED = {"sampling": "no", "update": "bf16", "sft": "no"}


def test_auto_on_any_cpu_is_float32_for_every_stage(monkeypatch):
    """Even where the CPU computes bf16 natively (forced here: this test runs on any CPU), ``auto`` runs every
    stage in float32: bf16 there cost learning (see the module doc) and is used only when asked for."""
    for native in (True, False):
        monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda native=native: native)
        model = make_model()
        assert model.precision.stages == dict.fromkeys(STAGES, "no")
        assert model.policy.autocast_dtypes == dict.fromkeys(STAGES) and model._scaler is None
        assert model._sampler_correction is None  # nothing to correct: sampling and update agree
        assert ("with native bf16" if native else "without native bf16") in model.precision.describe()
        with model.policy.autocast("update"):
            assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("forced", ["no", "bf16", "fp16"])
def test_explicit_precisions_are_unchanged(forced):
    model = make_model(mixed_precision=forced)
    assert model.precision.stages == dict.fromkeys(STAGES, forced)
    assert model.policy.autocast_dtypes == dict.fromkeys(STAGES, precision.DTYPES.get(forced))
    assert (model._scaler is not None) == (forced == "fp16")


def test_a_dict_sets_the_stages_apart_and_the_rest_is_float32():
    model = make_model(mixed_precision={"sft": "bf16"})
    assert model.precision.stages == {"sampling": "no", "update": "no", "sft": "bf16"}
    assert model.policy.autocast_dtypes == {"sampling": None, "update": None, "sft": torch.bfloat16}
    with model.policy.autocast("sft"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with model.policy.autocast("sampling"):
        assert not torch.is_autocast_enabled("cpu")
    assert model._sampler_correction is None  # sampling and update agree
    assert make_model(mixed_precision=MIXED)._sampler_correction == "tis"  # they differ: auto corrects


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("fp8", "mixed_precision must be one of"),
        ("BF16", "did you mean 'bf16'"),
        ({"decode": "bf16"}, r"unknown stages \['decode'\]"),
        ({"update": "auto"}, "maps stages"),
        (16, "mixed_precision must be one of"),
    ],
)
def test_a_bad_precision_names_what_it_takes(value, message):
    with pytest.raises(ValueError, match=message):
        make_model(mixed_precision=value)


def test_auto_on_a_gpu_is_bf16_or_fp16_for_every_stage(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert choose_precision("auto", "cuda").stages == dict.fromkeys(STAGES, "bf16")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    choice = choose_precision("auto", "cuda")
    assert choice.stages == dict.fromkeys(STAGES, "fp16") and choice.needs_scaler


def test_the_choice_is_printed_and_in_tensorboard(capsys, tmp_path: Path):
    model = make_model(mixed_precision=MIXED, verbose=1, tensorboard_log=str(tmp_path))
    printed = capsys.readouterr().out
    assert "sampling float32, update bf16, sft float32" in printed
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


def test_a_dict_precision_survives_save_and_load(tmp_path: Path):
    from algorithms import GRPO

    model = make_model(mixed_precision={"sft": "bf16"})
    model.save(tmp_path / "model")
    loaded = GRPO.load(tmp_path / "model", env=model.env)
    assert loaded.precision.stages == model.precision.stages


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
