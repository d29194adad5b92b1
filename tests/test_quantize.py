"""INT8: the fake quantisers, the INT8 layer's kernels, QAT/PTQ on a model, and the export's round trip."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn

from algorithms.common.generation.decoders import supports_llama_decoder
from algorithms.common.generation.sampler import sample
from algorithms.common.model.loading import load_model
from algorithms.deploy.quantize import (
    METADATA_FILE,
    WEIGHTS_FILE,
    FakeQuantLinear,
    Int8Linear,
    fake_quantize_tokens,
    fake_quantize_weight,
    int8_layers,
    is_int8_folder,
    load_int8,
    prepare_qat,
    quantizable_linears,
    quantize_int8,
    save_int8,
    strip_qat,
    weight_scales,
)
from tests.sizes import TINY_KWARGS

FBGEMM = "fbgemm" in torch.backends.quantized.supported_engines
needs_fbgemm = pytest.mark.skipif(not FBGEMM, reason="this torch build has no fbgemm int8 kernel")


@pytest.fixture
def model() -> nn.Module:
    return load_model("tiny", seed=0, **TINY_KWARGS).eval()


def test_weights_round_to_a_per_channel_int8_grid() -> None:
    weight = torch.randn(6, 10) * torch.arange(1, 7)[:, None]  # rows of different ranges
    scales = weight_scales(weight)
    torch.testing.assert_close(scales, weight.abs().amax(1) / 127)
    levels = fake_quantize_weight(weight) / scales[:, None]
    torch.testing.assert_close(levels, levels.round(), atol=1e-4, rtol=0)
    assert levels.abs().max() <= 127 + 1e-4
    assert (fake_quantize_weight(weight) - weight).abs().le(scales[:, None] / 2 + 1e-6).all()


def test_activations_round_per_token_and_rows_stay_independent() -> None:
    x = torch.randn(5, 12) * torch.tensor([0.01, 1.0, 10.0, 100.0, 3.0])[:, None]
    rounded = fake_quantize_tokens(x)
    steps = x.abs().amax(1, keepdim=True) / 63.5
    levels = rounded / steps
    torch.testing.assert_close(levels, levels.round(), atol=1e-3, rtol=0)
    assert levels.abs().max() <= 64 + 1e-3
    for i in range(len(x)):  # a token's rounding does not depend on the other tokens of the batch
        assert torch.equal(fake_quantize_tokens(x[i : i + 1]), rounded[i : i + 1])


def test_fake_quantisers_pass_gradients_straight_through() -> None:
    weight = torch.randn(4, 8, requires_grad=True)
    x = torch.randn(3, 8, requires_grad=True)
    (fake_quantize_weight(weight).sum() + fake_quantize_tokens(x).sum() * 2).backward()
    assert torch.equal(weight.grad, torch.ones_like(weight))
    assert torch.equal(x.grad, torch.full_like(x, 2.0))


@needs_fbgemm
def test_int8_kernels_agree_with_each_other_and_with_the_fake_quantised_layer() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(48, 80)
    x = torch.randn(2, 7, 48) * 3
    fbgemm, reference = Int8Linear.from_float(linear, "fbgemm"), Int8Linear.from_float(linear, "reference")
    fake = FakeQuantLinear.wrap(linear)
    with torch.no_grad():
        out = fbgemm(x)
        torch.testing.assert_close(out, reference(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out, fake(x), atol=1e-4, rtol=1e-4)
        assert out.shape == (2, 7, 80)
        alone = torch.cat([fbgemm(x[:, i : i + 1]) for i in range(7)], dim=1)
    assert torch.equal(alone, out)  # per-token scales: batching does not change a row's result


def test_int8_layer_state_holds_int8_weights() -> None:
    layer = Int8Linear.from_float(nn.Linear(16, 8))
    state = layer.state_dict()
    assert state["weight_int8"].dtype == torch.int8 and state["weight_int8"].shape == (8, 16)
    assert state["weight_scale"].dtype == torch.float32 and state["bias"].shape == (8,)
    again = Int8Linear(16, 8)
    again.load_state_dict(state)
    x = torch.randn(3, 16)
    assert torch.equal(again(x), layer(x))
    with pytest.raises(ValueError, match="kernel"):
        Int8Linear(16, 8, kernel="gpu")


def test_qat_wraps_the_same_parameters_and_strips_back(model: nn.Module) -> None:
    before = {name: p for name, p in model.named_parameters()}
    keys = set(model.state_dict())
    prepare_qat(model)
    names = quantizable_linears(model)
    assert names and all(isinstance(model.get_submodule(n), FakeQuantLinear) for n in names)
    assert "lm_head" not in names  # the output head (tied to the embeddings) stays float
    assert all(p is before[name] for name, p in model.named_parameters())
    assert set(model.state_dict()) == keys
    assert not supports_llama_decoder(model)  # fake-quantised layers run through the model's own forward
    ids = torch.randint(3, 103, (2, 6))
    out = sample(model, ids, torch.ones_like(ids), max_new_tokens=4, eos_token_id=1, pad_token_id=0, greedy=True)
    assert out.tokens.shape == (2, 4)
    strip_qat(model)
    assert all(type(model.get_submodule(n)) is nn.Linear for n in names)
    assert all(p is before[name] for name, p in model.named_parameters())
    assert supports_llama_decoder(model)


def test_qat_trained_model_exports_what_it_trained_with(model: nn.Module) -> None:
    prepare_qat(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(3, 103, (4, 10))
    for _ in range(3):
        loss = nn.functional.cross_entropy(model(ids).logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    exported = quantize_int8(model)
    assert int8_layers(exported) == quantizable_linears(model)
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, model(ids).logits, atol=2e-3, rtol=0)


def test_ptq_leaves_the_float_model_alone(model: nn.Module) -> None:
    original = copy.deepcopy(model.state_dict())
    quantized = quantize_int8(model)
    assert int8_layers(quantized) and not int8_layers(model)
    assert all(torch.equal(original[k], v) for k, v in model.state_dict().items())
    ids = torch.randint(3, 103, (2, 8))
    with torch.no_grad():
        error = (quantized(ids).logits - model(ids).logits).abs().max()
    assert 0 < error < 0.5  # rounded, close to the float model


def test_export_round_trips_in_one_call_and_generates(model: nn.Module, tmp_path: Path, tokenizer) -> None:
    quantized = quantize_int8(model)
    folder = save_int8(quantized, tmp_path / "int8", tokenizer=tokenizer)
    assert is_int8_folder(folder) and not is_int8_folder(tmp_path)
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    metadata = json.loads((folder / METADATA_FILE).read_text())
    assert metadata["layers"] == int8_layers(quantized)
    with safe_open(str(folder / WEIGHTS_FILE), "pt") as weights:
        dtypes = {name: weights.get_tensor(name).dtype for name in weights.keys()}
    assert {dtypes[f"{name}.weight_int8"] for name in metadata["layers"]} == {torch.int8}
    loaded = load_int8(folder)
    ids = torch.randint(3, 103, (3, 7))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, quantized(ids).logits)
    kwargs = {"max_new_tokens": 6, "eos_token_id": 1, "pad_token_id": 0, "greedy": True}
    mask = torch.ones_like(ids)
    assert torch.equal(sample(loaded, ids, mask, **kwargs).tokens, sample(quantized, ids, mask, **kwargs).tokens)


def test_export_errors_name_the_fix(model: nn.Module, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="quantize_int8"):
        save_int8(model, tmp_path / "float")
    with pytest.raises(ValueError, match="not an INT8 export"):
        load_int8(tmp_path)


@pytest.fixture
def tokenizer():
    from grpo_gym.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


def test_a_lora_model_is_merged_then_exported(model: nn.Module, tmp_path: Path) -> None:
    from algorithms.common.model.lora import apply_lora

    lora = apply_lora(copy.deepcopy(model), {"r": 4, "target_modules": ["q_proj", "v_proj"]}, seed=0)
    for name, parameter in lora.named_parameters():
        if "lora_B" in name:  # B starts at 0: make the adapters change the output
            nn.init.normal_(parameter, std=0.5)
    merged = copy.deepcopy(lora).merge_and_unload().eval()
    quantized = quantize_int8(lora)
    assert int8_layers(quantized) == int8_layers(quantize_int8(merged))  # the plain model's names, no wrappers
    loaded = load_int8(save_int8(quantized, tmp_path / "int8"))
    ids = torch.randint(3, 103, (2, 8))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, quantized(ids).logits)
        assert (quantized(ids).logits - merged(ids).logits).abs().max() < 0.5  # the adapters' effect kept
