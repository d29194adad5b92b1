"""The spaces, and actions as token ids: checking them, where a completion ends, text <-> action by hand.

A sequence-mode action is an array of ``max_new_tokens`` token ids; the completion ends at the first EOS (or pad) id
and what follows is ignored. A token-mode action is one id. Ids outside the vocabulary or a wrong shape raise
``ValueError`` saying what was expected.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from grpo_gym.tokenizer import TokenCodec


def observation_space(vocab_size: int, context_length: int) -> spaces.Dict:
    """``Dict(input_ids=Box(0, vocab-1, (context_length,)), attention_mask=Box(0, 1, (context_length,)))``, int64."""
    window = spaces.Box(0, vocab_size - 1, shape=(context_length,), dtype=np.int64)
    return spaces.Dict(
        {"input_ids": window, "attention_mask": spaces.Box(0, 1, shape=(context_length,), dtype=np.int64)}
    )


def action_space(vocab_size: int, max_new_tokens: int, action_mode: str) -> spaces.Space:
    """``MultiDiscrete([vocab] * max_new_tokens)`` in sequence mode, ``Discrete(vocab)`` in token mode."""
    if action_mode == "sequence":
        return spaces.MultiDiscrete(np.full(max_new_tokens, vocab_size, dtype=np.int64))
    return spaces.Discrete(vocab_size)


def completion_ids(action: Any, max_new_tokens: int, vocab_size: int) -> np.ndarray:
    """A sequence-mode action checked and as int64 ids."""
    ids = np.asarray(action)
    if ids.shape != (max_new_tokens,):
        raise ValueError(
            f"a sequence-mode action is an array of shape ({max_new_tokens},) of token ids "
            f"(pad after EOS), got shape {ids.shape}"
        )
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"token ids must be integers, got dtype {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(
            f"token ids must be in [0, {vocab_size}) (the env tokenizer's vocabulary), got "
            f"min {ids.min()} max {ids.max()}; does the policy use the env's tokenizer?"
        )
    return ids.astype(np.int64, copy=False)


def token_id(action: Any, vocab_size: int) -> int:
    """A token-mode action checked, as an int."""
    value = np.asarray(action)
    if value.shape not in ((), (1,)) or not np.issubdtype(value.dtype, np.integer):
        raise ValueError(f"a token-mode action is one integer token id, got {action!r}")
    token = int(value.reshape(()))
    if not 0 <= token < vocab_size:
        raise ValueError(f"token id must be in [0, {vocab_size}), got {token}")
    return token


def split_completion(ids: np.ndarray, codec: TokenCodec) -> tuple[np.ndarray, int]:
    """The completion's tokens before the first EOS (or pad), and its length with that token (all of them when
    there is none: a clipped completion)."""
    stop = np.flatnonzero((ids == codec.eos_id) | (ids == codec.pad_id))
    return (ids[: int(stop[0])], int(stop[0]) + 1) if len(stop) else (ids, len(ids))


#: characters per token a completion is first cut to before it is tokenized (a 10 MB text sent to a server is not
#: tokenized whole to keep its first ``max_new_tokens`` tokens)
CHARS_PER_TOKEN = 32


def _leading_ids(text: str, codec: TokenCodec, max_new_tokens: int) -> np.ndarray:
    """The ids of ``text``, or at least their first ``max_new_tokens + 1``: a long text is tokenized from a prefix
    of ``CHARS_PER_TOKEN`` characters per token, which holds more than that many tokens (else the whole text is),
    so the first ``max_new_tokens`` ids are the whole text's (a cut changes at most the prefix's last token)."""
    limit = (max_new_tokens + 2) * CHARS_PER_TOKEN
    if len(text) > limit:
        ids = np.asarray(codec.encode(text[:limit]))
        if len(ids) > max_new_tokens + 1:
            return ids
    return np.asarray(codec.encode(text))


def text_action(text: str, codec: TokenCodec, max_new_tokens: int) -> np.ndarray:
    """The sequence-mode action of a completion ``text``: its ids, EOS, then padding (cut, without EOS, when the text
    is longer than the budget: a clipped completion)."""
    if not isinstance(text, str):
        raise ValueError(f"encode_action takes the completion text, got {type(text).__name__}")
    ids = np.append(_leading_ids(text, codec, max_new_tokens), codec.eos_id)[:max_new_tokens]
    action = np.full(max_new_tokens, codec.pad_id, dtype=np.int64)
    action[: len(ids)] = ids
    return action
