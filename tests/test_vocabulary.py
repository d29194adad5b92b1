"""The tokenizer guard (algorithms/common/model/tokenizer_check.py): every way the env's tokenizer and the model
disagree."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch as th
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import grpo_gym
from algorithms import GRPO
from algorithms.common.model.tokenizer_check import PADDING_MULTIPLE, check_model_tokenizer
from grpo_gym.tokenizer import build_char_tokenizer
from tests.sizes import ENV_KWARGS


def llama(vocab_size: int, eos: int = 1, pad: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=512, eos_token_id=eos, pad_token_id=pad,
    )  # fmt: skip
    th.manual_seed(0)
    return LlamaForCausalLM(config)


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer trained here (its ids differ from the built-in character ones)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<eos>", "<unk>"])
    backend.train_from_iterator(["What is 12+7? <think>12+7=19</think><answer>19</answer>"] * 50, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def saved(folder: Path, model, tokenizer=None) -> Path:
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def make(env_tokenizer=None, **policy_kwargs) -> GRPO:
    env = DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**ENV_KWARGS, tokenizer=env_tokenizer))])
    return GRPO("TransformerPolicy", env, cold_start=False, n_groups=2, group_size=4, policy_kwargs=policy_kwargs)


def test_a_model_with_many_more_rows_than_the_env_tokenizer_is_refused() -> None:
    env_size = len(build_char_tokenizer())
    with pytest.raises(ValueError, match=rf"404 token embeddings but the env's tokenizer only {env_size}.*tokenizer="):
        make(model=llama(404))


def test_padding_rows_are_allowed() -> None:
    env_size = len(build_char_tokenizer())
    padded = -(-env_size // PADDING_MULTIPLE) * PADDING_MULTIPLE
    assert make(model=llama(padded)).policy.vocab_size == env_size


def test_a_model_smaller_than_the_env_tokenizer_is_refused() -> None:
    with pytest.raises(ValueError, match="smaller than the env tokenizer"):
        make(model=llama(50))


@pytest.mark.parametrize("rows", [300, 400])  # fewer and more rows than the env's 359 ids: the same message
def test_a_folder_whose_own_tokenizer_differs_is_refused(tmp_path: Path, rows: int) -> None:
    folder = saved(tmp_path / "m", llama(rows), bpe_tokenizer())
    with pytest.raises(ValueError, match=rf"differs from the one saved with model '{folder}'.*tokenizer='{folder}'"):
        make(model=str(folder))  # the env uses the built-in character tokenizer


def test_special_token_ids_must_match(tmp_path: Path) -> None:
    own = build_char_tokenizer()
    other = build_char_tokenizer()
    other.eos_token = "<unk>"  # the same vocabulary, another EOS
    with pytest.raises(ValueError, match="eos_token_id"):
        check_model_tokenizer(other, saved(tmp_path / "m", llama(len(own)), own))


def test_the_models_own_tokenizer_in_the_env_passes(tmp_path: Path) -> None:
    tokenizer = bpe_tokenizer()
    folder = saved(tmp_path / "m", llama(300), tokenizer)  # more rows than tokens: its own tokenizer says so
    model = make(env_tokenizer=str(folder), model=str(folder))
    assert model.policy.vocab_size == len(tokenizer) < 300
    model.learn(8)


def test_an_env_made_by_id_takes_the_models_tokenizer(tmp_path: Path) -> None:
    folder = saved(tmp_path / "m", llama(300), bpe_tokenizer())
    model = GRPO("TransformerPolicy", "R1Zero-v0", cold_start=False, policy_kwargs={"model": str(folder)})
    assert model.env.get_attr("codec")[0].vocab_size == len(bpe_tokenizer())
