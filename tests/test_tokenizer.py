"""The built-in character tokenizer, load_tokenizer, TokenCodec, prompt templates and the context window."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from grpo_gym.context import ContextWindow
from grpo_gym.templates import PromptFormatter
from grpo_gym.tokenizer import (
    BUILTIN_VOCAB_SIZE,
    CHARACTERS,
    FIRST_BYTE_ID,
    TEMPLATE_TAGS,
    TokenCodec,
    build_char_tokenizer,
    load_tokenizer,
)

TEXT = "<think>37+48*2: 48*2=96, 37+96=133\n</think> <answer>133</answer>"


def test_builtin_is_a_real_hf_tokenizer_with_single_token_tags() -> None:
    tok = build_char_tokenizer()
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert (tok.pad_token_id, tok.eos_token_id, len(tok)) == (0, 1, 359) and BUILTIN_VOCAB_SIZE == 359
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


def test_ids_0_to_102_are_unchanged_and_bytes_come_after() -> None:
    vocab = build_char_tokenizer().get_vocab()
    assert [vocab[t] for t in ("<pad>", "<eos>", "<unk>")] == [0, 1, 2]
    assert [vocab[c] for c in CHARACTERS] == list(range(3, 99))
    assert [vocab[t] for t in TEMPLATE_TAGS] == [99, 100, 101, 102]
    assert [vocab[f"<0x{b:02X}>"] for b in range(256)] == list(range(103, 359)) and FIRST_BYTE_ID == 103


def test_other_characters_become_utf8_byte_tokens_not_unk() -> None:
    tok = build_char_tokenizer()
    ids = tok.encode("é€", add_special_tokens=False)
    assert ids == [FIRST_BYTE_ID + b for b in "é€".encode()]  # 2 + 3 bytes
    assert tok.unk_token_id not in ids and tok.decode(ids) == "é€"


@pytest.fixture(scope="module")
def reloaded(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerFast:
    folder = tmp_path_factory.mktemp("tok")
    build_char_tokenizer().save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


BUILTIN = build_char_tokenizer()
CODEC = TokenCodec(BUILTIN)


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_any_unicode_text_round_trips(text: str) -> None:
    ids = CODEC.encode(text)
    assert CODEC.decode(ids) == text
    assert BUILTIN.decode(ids.tolist()) == text
    assert BUILTIN.unk_token_id not in ids.tolist()


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_round_trip_survives_save_pretrained(reloaded: PreTrainedTokenizerFast, text: str) -> None:
    ids = reloaded.encode(text, add_special_tokens=False)
    assert ids == CODEC.encode(text).tolist() and reloaded.decode(ids) == text
    assert TokenCodec(reloaded)._pieces is not None  # the reloaded folder still takes the fast decode path


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(0, BUILTIN_VOCAB_SIZE - 1), max_size=40))
def test_fast_decode_equals_the_generic_decode_on_any_ids(ids: list[int]) -> None:
    # any id sequence, including byte runs that are not valid UTF-8 (each such byte reads as U+FFFD)
    array = np.asarray(ids, dtype=np.int64)
    generic = BUILTIN.decode(array[~CODEC._special[array]].tolist(), skip_special_tokens=True)
    assert CODEC.decode(array) == generic


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
    assert codec.vocab_size == 359


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


# ---------------------------------------------------------------- encode_tail: bounded work for long texts


def small_bpe() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 style pre-tokenization), trained here on a few sentences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = ["What is 12+34? The quick brown fox jumps over the lazy dog. <think>48*2=96</think>"] * 20
    backend.train_from_iterator(corpus, trainer)
    return load_tokenizer(PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>"))


CODECS = {"builtin": CODEC, "bpe": TokenCodec(small_bpe())}
PIECES = ["What is 12+34? ", "é日本🙂 ", "<think>", "</answer>", "  ", "\n", "fox", "x" * 7, "0x41 ", "\t"]


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(CODECS)),
    parts=st.lists(st.sampled_from(PIECES), min_size=1, max_size=400),
    keep=st.integers(0, 200),
)
def test_encode_tail_equals_full_encoding_then_newest_tokens(name: str, parts: list[str], keep: int) -> None:
    codec = CODECS[name]
    text = "".join(parts)
    full = codec.encode(text)
    ids, cut = codec.encode_tail(text, keep)
    np.testing.assert_array_equal(ids, full[len(full) - min(keep, len(full)) :])
    assert cut == (len(full) > keep)


@pytest.mark.parametrize("name", sorted(CODECS))
def test_encode_tail_reads_a_bounded_part_of_a_huge_text(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    codec = CODECS[name]
    text = "Where is the fox? é日本 <think>\n" * 150_000  # ~5 MB
    read: list[int] = []
    encode = codec.encode
    monkeypatch.setattr(codec, "encode", lambda t: read.append(len(t)) or encode(t))
    ids, cut = codec.encode_tail(text, 300)
    assert cut and len(ids) == 300
    assert sum(read) <= 3 * 4 * (300 + 16)  # two reads at the first budget (a cut and one twice as long)
    # newlines are token boundaries in both tokenizers, so the text after one encodes as the full text ends
    np.testing.assert_array_equal(ids, encode(text[-20_000:])[-300:])
    with pytest.raises(ValueError, match="max_tokens"):
        codec.encode_tail(text, -1)
