"""Tokenizers: the built-in character tokenizer (a real Hugging Face tokenizer object) and ``load_tokenizer``.

The built-in tokenizer needs no download: one token per printable ASCII character and newline, plus the four
R1-Zero template tags as single tokens (``<think>``, ``</think>``, ``<answer>``, ``</answer>``) and three
special tokens (``<pad>`` = 0, ``<eos>`` = 1, ``<unk>`` = 2): ids 0..102. Any other character is written as
the bytes of its UTF-8 encoding, one token each (``<0x00>`` .. ``<0xFF>``, ids 103..358: byte fallback, as in
Llama's tokenizer), so every Unicode text round-trips through encode/decode and ``<unk>`` is never produced.
The special tokens are never read from text (``split_special_tokens=True``: a prompt that says ``"<eos>"``
gets its characters), while the template tags are. 359 tokens in all. It is a ``PreTrainedTokenizerFast`` (a
``tokenizers`` BPE model without merges, with ``byte_fallback``), so it saves and loads with
``save_pretrained`` / ``from_pretrained`` like any other, and a model trained with it exports as a standard
Hugging Face folder.

:class:`TokenCodec` is the thin view the environment uses in its hot loop: encode to a numpy array (or only
the newest tokens of a long text, :meth:`TokenCodec.encode_tail`), decode ids with specials skipped, and the
pad / EOS ids. For the built-in tokenizer it decodes with a lookup table, which is several times faster than
the generic path, and gives the same text (byte tokens included).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from grpo_gym.gguf import check_gguf, is_gguf, load_gguf_tokenizer, read_header, require_gguf
from grpo_gym.hub import check_hf_source, check_hub_reachable
from grpo_gym.validation import ArgumentError, check_int

if TYPE_CHECKING:  # transformers is imported lazily: `import grpo_gym` stays light
    from transformers import PreTrainedTokenizerBase

PAD_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<eos>", "<unk>"
TEMPLATE_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
CHARACTERS = "\n" + "".join(chr(c) for c in range(32, 127))
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))
BUILTIN_NAMES = ("builtin", "char")
BUILTIN_VOCAB = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN, *CHARACTERS, *TEMPLATE_TAGS, *BYTE_TOKENS)
"""The built-in vocabulary in id order: specials 0..2, characters 3..98, tags 99..102, bytes 103..358."""
BUILTIN_VOCAB_SIZE = len(BUILTIN_VOCAB)
FIRST_BYTE_ID = BUILTIN_VOCAB.index(BYTE_TOKENS[0])


def build_char_tokenizer() -> PreTrainedTokenizerBase:
    """Build the built-in character tokenizer (359 tokens, byte fallback) as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(BUILTIN_VOCAB)}
    # A BPE model without merges is a character vocabulary; unlike WordLevel it supports byte fallback.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN, byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    backend.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
        split_special_tokens=True,  # "<eos>" written in a text is text, not the EOS token
    )
    tokenizer.add_tokens(list(TEMPLATE_TAGS))  # already in the vocabulary (ids 99..102): matched before splitting
    return tokenizer


def is_builtin_tokenizer(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` has exactly the built-in vocabulary (same tokens, same ids)."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:
        return False
    return len(vocab) == BUILTIN_VOCAB_SIZE and all(vocab.get(t) == i for i, t in enumerate(BUILTIN_VOCAB))


def load_tokenizer(
    tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None, *, trust_remote_code: bool = False
) -> PreTrainedTokenizerBase:
    """Return a ready tokenizer: the built-in one (``None``, ``"builtin"``, ``"char"``), an object, a path/name, or
    a ``.gguf`` file (the tokenizer it carries, :func:`grpo_gym.gguf.load_gguf_tokenizer`).

    A path or hub name goes through ``AutoTokenizer.from_pretrained``, after :func:`grpo_gym.hub.check_hf_source`:
    a folder that would run its own code (``"auto_map"``) is refused unless ``trust_remote_code=True``. A tokenizer
    without a pad token gets its EOS token as pad, and padding is set to the left (the observation layout).

    :param tokenizer: ``None``/``"builtin"``/``"char"``, a tokenizer object, or a local folder / hub name
    :param trust_remote_code: run the folder's own tokenizer code (opt in only for code you have read)
    """
    if tokenizer is None or (isinstance(tokenizer, str) and tokenizer in BUILTIN_NAMES):
        return build_char_tokenizer()
    if not isinstance(tokenizer, (str, os.PathLike)) and not all(
        hasattr(tokenizer, name) for name in ("encode", "decode", "get_vocab", "eos_token_id")
    ):
        raise ArgumentError(
            f"tokenizer must be None (the built-in one), a local folder / hub name, or a Hugging Face tokenizer, "
            f"got {type(tokenizer).__name__}"
        )
    if is_gguf(tokenizer):
        tokenizer = gguf_tokenizer(tokenizer)  # the vocabulary and chat template the file carries
    elif isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer

        safety = check_hf_source(tokenizer, trust_remote_code=trust_remote_code, what="tokenizer folder")
        check_hub_reachable(tokenizer, "tokenizer")
        try:
            tokenizer = AutoTokenizer.from_pretrained(os.fspath(tokenizer), **safety)
        except (OSError, ValueError) as error:
            raise ValueError(
                f"could not load a tokenizer from {os.fspath(tokenizer)!r}: {error}. Pass a local folder "
                "written by `save_pretrained`, a hub name available offline, or None for the built-in one"
            ) from error
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token; set `tokenizer.eos_token` before using it")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


TAIL_CHARS_PER_TOKEN = 4
""":meth:`TokenCodec.encode_tail` first reads ``4 * (n + 16)`` characters for ``n`` tokens, then doubles."""
MAX_TAIL_CHARS_PER_TOKEN = 64
"""... up to ``64 * (n + 16)`` characters: the bound on the work of one call, whatever the text's length."""


class TokenCodec:
    """What the environment needs of a tokenizer, fast: ``encode``, ``decode``, ``pad_id``, ``eos_id``, ``vocab_size``.

    :param tokenizer: a Hugging Face tokenizer (see :func:`load_tokenizer`)
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.pad_id = int(tokenizer.pad_token_id)
        self.eos_id = int(tokenizer.eos_token_id)
        self.vocab_size = len(tokenizer)
        self._special = np.zeros(self.vocab_size, dtype=bool)
        self._special[[i for i in tokenizer.all_special_ids if 0 <= i < self.vocab_size]] = True
        self._backend = getattr(tokenizer, "backend_tokenizer", None)  # the Rust tokenizer, when fast
        self._pieces: np.ndarray | None = None
        if is_builtin_tokenizer(tokenizer):
            # every piece but the byte tokens' is ASCII: a byte token's placeholder (a lone surrogate, never
            # returned) makes the joined text non-ASCII, which sends decode() to the byte-aware path
            pieces = ["" if self._special[i] else token for i, token in enumerate(BUILTIN_VOCAB)]
            pieces[FIRST_BYTE_ID:] = [chr(0xDC00 + b) for b in range(256)]
            self._pieces = np.array(pieces, dtype=object)

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` (no special tokens added), as int64."""
        if self._backend is not None:
            return np.asarray(self._backend.encode(text, add_special_tokens=False).ids, dtype=np.int64)
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False), dtype=np.int64)

    def encode_tail(self, text: str, max_tokens: int) -> tuple[np.ndarray, bool]:
        """The newest ``max_tokens`` ids of ``encode(text)`` and whether older ones were dropped, in bounded work.

        Only the end of a long text is encoded: its last ``4 (n + 16)`` characters, doubled until the encoded
        part holds more than ``n = max_tokens`` tokens *and* encoding twice as many characters gives the same
        newest ``n`` tokens (so the cut, which may split a word or a tag, lies among the dropped tokens). That is
        exact for tokenizers whose split of a text's end does not depend on text far before it: the built-in one
        and the usual BPE / WordPiece / Unigram tokenizers with pre-tokenization. At most ``64 (n + 16)``
        characters are ever read (``MAX_TAIL_CHARS_PER_TOKEN``): a text whose last that many characters encode to
        fewer than ``n`` tokens (e.g. whitespace a tokenizer drops) gives those tokens.

        :param text: the text
        :param max_tokens: how many of its newest tokens to keep (>= 0)
        :return: ``(ids, cut)``: at most ``max_tokens`` int64 ids, and whether ``encode(text)`` is longer
        """
        n: int = check_int("max_tokens", max_tokens, low=0)  # type: ignore[assignment]
        budget = TAIL_CHARS_PER_TOKEN * (n + 16)
        if len(text) <= budget:  # the usual case: a prompt shorter than the window
            ids = self.encode(text)
            return (ids, False) if len(ids) <= n else (ids[len(ids) - n :], True)
        limit = MAX_TAIL_CHARS_PER_TOKEN * (n + 16)
        while len(text) > budget:
            ids = self.encode(text[-budget:])
            if budget >= limit:  # the read limit: the newest tokens of the text's last `limit` characters
                return ids[max(0, len(ids) - n) :], True
            if len(ids) > n:
                if 2 * budget >= len(text):
                    break
                wider = self.encode(text[-2 * budget :])
                if n == 0 or np.array_equal(ids[-n:], wider[-n:]):
                    return ids[len(ids) - n :], True
            budget = min(2 * budget, limit)
        ids = self.encode(text)
        return ids[max(0, len(ids) - n) :], len(ids) > n

    def decode(self, ids: np.ndarray) -> str:
        """Text of ``ids`` with special tokens skipped. ``ids`` must be within ``[0, vocab_size)``."""
        ids = np.asarray(ids, dtype=np.int64)
        if self._pieces is None:
            return self.tokenizer.decode(ids[~self._special[ids]].tolist(), skip_special_tokens=True)
        text = "".join(self._pieces[ids].tolist())
        if text.isascii():  # no byte token (O(1): CPython keeps the flag)
            return text
        return _decode_with_bytes(ids[~self._special[ids]], self._pieces)


def _decode_with_bytes(ids: np.ndarray, pieces: np.ndarray) -> str:
    """Decode built-in ids holding byte tokens as the ``ByteFallback`` decoder does: each run of byte tokens is
    read as UTF-8, or, when invalid, becomes one U+FFFD per byte."""
    parts: list[str] = []
    run = bytearray()
    count = 0
    for i in ids.tolist():
        if i >= FIRST_BYTE_ID:
            run.append(i - FIRST_BYTE_ID)
            count += 1
            continue
        if count:
            parts.append(_bytes_text(run, count))
            run, count = bytearray(), 0
        parts.append(pieces[i])
    if count:
        parts.append(_bytes_text(run, count))
    return "".join(parts)


def _bytes_text(run: bytearray, count: int) -> str:
    try:
        return run.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * count


def gguf_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """The tokenizer a GGUF file carries (:func:`grpo_gym.gguf.load_gguf_tokenizer`), or the built-in character
    tokenizer itself for a file that holds its vocabulary (a built-in model's GGUF export: transformers would read it
    as a SentencePiece vocabulary, adding two tokens and a leading space)."""
    info = check_gguf(path, what="tokenizer")
    return build_char_tokenizer() if holds_builtin_vocabulary(info.path) else load_gguf_tokenizer(info.path)


def holds_builtin_vocabulary(path: str | os.PathLike) -> bool:
    """Whether a GGUF file's vocabulary is the built-in character tokenizer's, as the GGUF export writes it (the
    space as ``▁``)."""
    metadata, _, _ = read_header(os.fspath(path))
    if metadata.get("tokenizer.ggml.model") != "llama" or metadata.get("tokenizer.ggml.tokens") != len(BUILTIN_VOCAB):
        return False
    field = require_gguf().GGUFReader(os.fspath(path)).fields["tokenizer.ggml.tokens"]
    return [token.replace("▁", " ") for token in field.contents()] == list(BUILTIN_VOCAB)
