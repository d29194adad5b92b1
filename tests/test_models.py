"""Tests of algorithms.common.model.loading: built-in configs, load_model, save/load round trip, errors."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from algorithms.common.model.loading import (
    BUILTIN_EOS_ID,
    BUILTIN_MODELS,
    BUILTIN_PAD_ID,
    BUILTIN_VOCAB_SIZE,
    count_parameters,
    is_builtin_model,
    load_model,
)
from grpo_gym.tokenizer import build_char_tokenizer

EXPECTED_PARAMETERS = {"tiny": (5e5, 1e6), "small": (3e6, 8e6), "medium": (1e7, 6e7), "base": (8e7, 1.3e8)}


def test_builtin_vocabulary_matches_the_builtin_tokenizer():
    tokenizer = build_char_tokenizer()
    assert BUILTIN_VOCAB_SIZE == len(tokenizer)
    assert (BUILTIN_PAD_ID, BUILTIN_EOS_ID) == (tokenizer.pad_token_id, tokenizer.eos_token_id)
    for config in BUILTIN_MODELS.values():
        assert config["vocab_size"] == len(tokenizer)
        assert config["pad_token_id"] == tokenizer.pad_token_id
        assert config["eos_token_id"] == tokenizer.eos_token_id
        assert config["max_position_embeddings"] == 2048  # the policy's 2048 tokens of memory
        assert config["tie_word_embeddings"]


@pytest.mark.parametrize("name", list(BUILTIN_MODELS))
def test_builtin_sizes(name):
    with torch.device("meta"):  # count without allocating ~400 MB for "base"
        model = LlamaForCausalLM(LlamaConfig(**BUILTIN_MODELS[name]))
    low, high = EXPECTED_PARAMETERS[name]
    assert low <= count_parameters(model) <= high
    assert is_builtin_model(name)


def test_is_builtin_model():
    assert not is_builtin_model("gpt2")
    assert not is_builtin_model(None)


def test_load_builtin_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    first = load_model("tiny", seed=7)
    assert torch.equal(torch.rand(3), expected)  # the global RNG did not move
    second = load_model("tiny", seed=7)
    other = load_model("tiny", seed=8)
    for a, b in zip(first.parameters(), second.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first.model.embed_tokens.weight, other.model.embed_tokens.weight)
    assert first.lm_head.weight.data_ptr() == first.model.embed_tokens.weight.data_ptr()  # tied


def test_load_builtin_overrides_vocab_and_dtype():
    model = load_model("tiny", seed=0, num_hidden_layers=2, vocab_size=120, dtype=torch.bfloat16)
    assert model.config.num_hidden_layers == 2
    assert model.get_input_embeddings().num_embeddings == 120
    assert next(model.parameters()).dtype == torch.bfloat16
    assert load_model("tiny", dtype="bfloat16").dtype == torch.bfloat16


def test_instance_returned_as_is():
    model = load_model("tiny", seed=0, num_hidden_layers=1)
    assert load_model(model) is model


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_builtin_save_load_round_trip(tmp_path):
    model = load_model("tiny", seed=3, num_hidden_layers=2).eval()
    model.save_pretrained(tmp_path)
    loaded = load_model(tmp_path).eval()
    ids = torch.randint(0, BUILTIN_VOCAB_SIZE, (2, 9), generator=torch.Generator().manual_seed(0))
    assert torch.equal(_logits(model, ids), _logits(loaded, ids))
    assert load_model(str(tmp_path), dtype=torch.bfloat16).dtype == torch.bfloat16


def test_qwen2_checkpoint_loads_through_load_model(tmp_path):
    config = Qwen2Config(
        vocab_size=384, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    model.save_pretrained(tmp_path)
    loaded = load_model(tmp_path, vocab_size=BUILTIN_VOCAB_SIZE).eval()  # a larger table is fine
    assert isinstance(loaded, Qwen2ForCausalLM)
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    assert torch.equal(_logits(model, ids), _logits(loaded, ids))
    with pytest.raises(ValueError, match="resize_token_embeddings"):
        load_model(tmp_path, vocab_size=500)


def test_load_model_errors(tmp_path):
    with pytest.raises(ValueError, match=r"'tiny'.*config\.json"):
        load_model("no-such-model")
    with pytest.raises(ValueError, match="does not exist"):
        load_model(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"no config\.json"):
        load_model(tmp_path)
    with pytest.raises(TypeError):
        load_model(3)
