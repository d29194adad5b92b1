"""Loading a saved model for deployment: a GRPO zip, a save_pretrained folder, an INT8 export; tokenizer checks."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest
import torch

import grpo_gym  # noqa: F401
from algorithms import GRPO
from algorithms.common.model.tokenizer_check import has_tokenizer
from algorithms.deploy.loading import check_tokenizer, load_policy, policy_for_model
from algorithms.deploy.quantize import Int8Linear, int8_layers, quantize_int8, save_int8
from grpo_gym.tokenizer import BUILTIN_VOCAB_SIZE, build_char_tokenizer
from tests.sizes import ENV_KWARGS, TINY


def small_tokenizer():
    """A 12-token word-level tokenizer (not the built-in one)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(["<pad>", "<eos>", "<unk>", *"abcdefghi"])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same tiny model as a GRPO zip, a save_pretrained folder and an INT8 export."""
    folder = tmp_path_factory.mktemp("saved")
    model = GRPO("TransformerPolicy", gym.make("R1Zero-v0", **ENV_KWARGS), policy_kwargs=TINY, seed=0)
    model.save(folder / "run.zip")
    model.save_pretrained(str(folder / "hf"))
    save_int8(quantize_int8(model.policy.model), folder / "int8", build_char_tokenizer())
    return {"zip": folder / "run.zip", "hf": folder / "hf", "int8": folder / "int8"}


@pytest.mark.parametrize("form", ["zip", "hf", "int8"])
def test_every_form_loads_in_one_call_and_generates(saved: dict[str, Path], form: str) -> None:
    policy, tokenizer = load_policy(saved[form])
    assert len(tokenizer) == policy.vocab_size == BUILTIN_VOCAB_SIZE
    assert (policy.eos_token_id, policy.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 0)
    assert bool(int8_layers(policy.model)) == (form == "int8")
    ids = torch.tensor([tokenizer("User: What is 1+2?\nAssistant: ")["input_ids"]])
    out = policy.generate(ids, torch.ones_like(ids), greedy=True, max_new_tokens=5)
    assert out.tokens.shape == (1, 5) and out.mask[0, 0]


def test_forms_agree_on_greedy_tokens(saved: dict[str, Path]) -> None:
    ids = torch.randint(3, 103, (3, 9), generator=torch.Generator().manual_seed(0))
    tokens = {}
    for form in ("zip", "hf"):
        policy, _ = load_policy(saved[form])
        tokens[form] = policy.generate(ids, torch.ones_like(ids), greedy=True, max_new_tokens=6).tokens
    assert torch.equal(tokens["zip"], tokens["hf"])


def test_folders_bring_their_tokenizer(saved: dict[str, Path], tmp_path: Path) -> None:
    assert has_tokenizer(saved["hf"]) and has_tokenizer(saved["int8"]) and not has_tokenizer(saved["zip"])
    model = load_policy(saved["hf"])[0].model
    model.save_pretrained(tmp_path / "bare")  # no tokenizer files: the built-in one is used
    policy, tokenizer = load_policy(tmp_path / "bare")
    assert len(tokenizer) == policy.vocab_size == BUILTIN_VOCAB_SIZE


def test_a_zip_with_the_wrong_tokenizer_is_a_clear_error(saved: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="--tokenizer"):
        load_policy(saved["zip"], tokenizer=small_tokenizer())


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_policy(tmp_path / "nothing.zip")


def test_policy_for_model_takes_its_spaces_from_the_tokenizer(saved: dict[str, Path]) -> None:
    from algorithms.deploy.quantize import load_int8

    model = load_int8(saved["int8"])
    policy = policy_for_model(model, build_char_tokenizer(), max_new_tokens=7)
    assert policy.vocab_size == BUILTIN_VOCAB_SIZE and policy.max_new_tokens == 7
    assert isinstance(policy.model.get_submodule("model.layers.0.mlp.down_proj"), Int8Linear)
    check_tokenizer(policy, build_char_tokenizer())
    with pytest.raises(ValueError, match="12 tokens"):
        check_tokenizer(policy, small_tokenizer())


def test_a_zip_brings_the_tokenizer_its_env_record_names(tmp_path: Path) -> None:
    """A run with its own tokenizer folder: serving its zip reads that folder, with no --tokenizer."""
    small_tokenizer().save_pretrained(tmp_path / "tokenizer")
    env = gym.make("R1Zero-v0", **ENV_KWARGS, tokenizer=str(tmp_path / "tokenizer"))
    GRPO("TransformerPolicy", env, policy_kwargs=TINY, seed=0).save(tmp_path / "run.zip")
    policy, tokenizer = load_policy(tmp_path / "run.zip")
    assert len(tokenizer) == policy.vocab_size == 12
    with pytest.raises(ValueError, match="12 tokens"):
        load_policy(tmp_path / "run.zip", tokenizer="builtin")
