"""Tokenizers: the built-in character tokenizer (a real Hugging Face tokenizer object) and ``load_tokenizer``.

The built-in tokenizer needs no download: one token per printable ASCII character and newline, plus the four
R1-Zero template tags as single tokens (``<think>``, ``</think>``, ``<answer>``, ``</answer>``) and three
special tokens (``<pad>`` = 0, ``<eos>`` = 1, ``<unk>`` = 2). It is a ``PreTrainedTokenizerFast``, so it saves
and loads with ``save_pretrained`` / ``from_pretrained`` like any other, and a model trained with it exports
as a standard Hugging Face folder.

:class:`TokenCodec` is the thin view the environment uses in its hot loop: encode to a numpy array, decode
ids with specials skipped, and the pad / EOS ids. For the built-in tokenizer it decodes with a lookup table,
which is several times faster than the generic path.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # transformers is imported lazily: `import grpo_gym` stays light
    from transformers import PreTrainedTokenizerBase

PAD_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<eos>", "<unk>"
TEMPLATE_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
CHARACTERS = "\n" + "".join(chr(c) for c in range(32, 127))
BUILTIN_NAMES = ("builtin", "char")


def build_char_tokenizer() -> PreTrainedTokenizerBase:
    """Build the built-in character tokenizer (103 tokens) as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate([PAD_TOKEN, EOS_TOKEN, UNK_TOKEN, *CHARACTERS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    tokenizer.add_tokens(list(TEMPLATE_TAGS))
    return tokenizer


def is_builtin_tokenizer(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` has exactly the built-in character vocabulary."""
    vocab = tokenizer.get_vocab()
    return (
        len(vocab) == len(CHARACTERS) + 3 + len(TEMPLATE_TAGS)
        and all(vocab.get(tag) is not None for tag in TEMPLATE_TAGS)
        and vocab.get(PAD_TOKEN) == 0
        and vocab.get(EOS_TOKEN) == 1
    )


def load_tokenizer(tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None) -> PreTrainedTokenizerBase:
    """Return a ready tokenizer: the built-in one (``None``, ``"builtin"``, ``"char"``), an object, or a path/name.

    A path or hub name goes through ``AutoTokenizer.from_pretrained``. A tokenizer without a pad token gets
    its EOS token as pad, and padding is set to the left (the observation layout).

    :param tokenizer: ``None``/``"builtin"``/``"char"``, a tokenizer object, or a local folder / hub name
    """
    if tokenizer is None or (isinstance(tokenizer, str) and tokenizer in BUILTIN_NAMES):
        return build_char_tokenizer()
    if isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(os.fspath(tokenizer))
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
            pieces = [""] * self.vocab_size
            for token, index in tokenizer.get_vocab().items():
                if not self._special[index]:
                    pieces[index] = token
            self._pieces = np.array(pieces, dtype=object)

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` (no special tokens added), as int64."""
        if self._backend is not None:
            return np.asarray(self._backend.encode(text, add_special_tokens=False).ids, dtype=np.int64)
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False), dtype=np.int64)

    def decode(self, ids: np.ndarray) -> str:
        """Text of ``ids`` with special tokens skipped. ``ids`` must be within ``[0, vocab_size)``."""
        ids = np.asarray(ids, dtype=np.int64)
        if self._pieces is not None:
            return "".join(self._pieces[ids].tolist())
        return self.tokenizer.decode(ids[~self._special[ids]].tolist(), skip_special_tokens=True)
