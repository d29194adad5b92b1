"""The built-in character tokenizer, load_tokenizer, TokenCodec, prompt templates and the context window."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from grpo_gym.context import ContextWindow
from grpo_gym.templates import PromptFormatter
from grpo_gym.tokenizer import TEMPLATE_TAGS, TokenCodec, build_char_tokenizer, load_tokenizer

TEXT = "<think>37+48*2: 48*2=96, 37+96=133\n</think> <answer>133</answer>"


def test_builtin_is_a_real_hf_tokenizer_with_single_token_tags() -> None:
    tok = build_char_tokenizer()
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert (tok.pad_token_id, tok.eos_token_id, len(tok)) == (0, 1, 103)
    for tag in TEMPLATE_TAGS:
        assert len(tok.encode(tag, add_special_tokens=False)) == 1
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert tok.decode(ids) == TEXT
    assert len(ids) == len(TEXT) - sum(len(t) - 1 for t in TEMPLATE_TAGS)


def test_save_and_load_round_trip(tmp_path) -> None:
    tok = build_char_tokenizer()
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.encode(TEXT, add_special_tokens=False) == tok.encode(TEXT, add_special_tokens=False)
    assert loaded.pad_token_id == 0 and loaded.eos_token_id == 1
    again = load_tokenizer(tmp_path)
    assert TokenCodec(again).decode(TokenCodec(again).encode(TEXT)) == TEXT


def test_unknown_characters_map_to_unk() -> None:
    tok = build_char_tokenizer()
    assert tok.encode("é€", add_special_tokens=False) == [tok.unk_token_id] * 2


def test_load_tokenizer_errors_and_pad_default(tmp_path) -> None:
    with pytest.raises(ValueError, match="save_pretrained"):
        load_tokenizer(tmp_path / "missing")
    tok = build_char_tokenizer()
    tok.pad_token = None
    assert load_tokenizer(tok).pad_token_id == tok.eos_token_id


def test_codec_fast_path_matches_generic_decode() -> None:
    tok = build_char_tokenizer()
    codec = TokenCodec(tok)
    ids = np.concatenate([codec.encode(TEXT), [codec.eos_id, codec.pad_id, 2]])
    assert codec.decode(ids) == tok.decode(ids.tolist(), skip_special_tokens=True) == TEXT
    assert codec.vocab_size == 103


def test_chat_template_formatter() -> None:
    tok = build_char_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}<end>\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    formatter = PromptFormatter("r1zero", tok)
    prompt = formatter.prompt("What is 1+1?")
    assert prompt.startswith("<system>A conversation")
    assert prompt.endswith("<user>What is 1+1?<end>\n<assistant>")
    assert formatter.feedback("Wrong.") == "<end>\n<user>Wrong.<end>\n<assistant>"
    plain = PromptFormatter("compact", tok, use_chat_template=False)
    assert plain.prompt("Q?") == "User: Q?\nAssistant: "
    with pytest.raises(ValueError, match="chat template"):
        PromptFormatter("compact", build_char_tokenizer(), use_chat_template=True)


def test_context_window_rules() -> None:
    window = ContextWindow(8, pad_id=0)
    assert window.reset(np.arange(1, 4)) is False
    obs = window.observation()
    assert obs["input_ids"].tolist() == [0, 0, 0, 0, 0, 1, 2, 3]
    assert obs["attention_mask"].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    assert window.append(np.array([4, 5])) and window.free == 3
    assert window.append(np.array([6, 7, 8, 9])) is False  # only 6, 7, 8 fit
    assert window.tokens().tolist() == [1, 2, 3, 4, 5, 6, 7, 8] and window.free == 0
    assert window.reset(np.arange(1, 12)) is True  # cut from the left
    assert window.tokens().tolist() == list(range(4, 12))
    with pytest.raises(ValueError, match="context_length"):
        ContextWindow(0, pad_id=0)
