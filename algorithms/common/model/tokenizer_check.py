"""The tokenizer guard: the env's tokenizer and the policy's model must speak the same vocabulary.

Checked when an algorithm builds its policy
(:meth:`LMBaseAlgorithm._setup_model <algorithms.common.base_class.LMBaseAlgorithm._setup_model>`:
:func:`check_model_tokenizer` before, :func:`check_embedding_rows` after; a model with fewer rows than the
tokenizer's ids is the policy's error):

- when the model comes from a folder (or hub name) that ships its own tokenizer, that tokenizer must equal
  the env's: the same token-to-id map and the same special tokens (EOS, pad); a model trained with other ids
  learns nonsense without a word of warning;
- the model's embedding table must hold every id of the env's tokenizer, and may add only padding rows: up to
  the next multiple of :data:`PADDING_MULTIPLE` when the model brings no tokenizer to compare with (checkpoints
  that pad their vocabulary, such as Qwen's, ship their tokenizer and pass by the first rule).

The fix named in every error: make the env with the model's tokenizer, ``gym.make("R1Zero-v0",
tokenizer=<model folder>)`` (``GRPO("TransformerPolicy", "R1Zero-v0", policy_kwargs={"model": folder})`` does that
by itself when the env is given by id).
"""

from __future__ import annotations

import os
from typing import Any

from grpo_gym.gguf import is_gguf
from grpo_gym.tokenizer import gguf_tokenizer

#: embedding rows a model may add beyond its tokenizer without shipping it: up to the next multiple of this
PADDING_MULTIPLE = 128


#: files that mark a folder as holding a saved Hugging Face tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def has_tokenizer(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a saved Hugging Face tokenizer."""
    return os.path.isdir(folder) and any(os.path.isfile(os.path.join(folder, name)) for name in TOKENIZER_FILES)


def model_tokenizer(source: Any) -> Any | None:
    """The tokenizer saved with a model folder or cached hub model, or carried by a GGUF file (None: none there, or
    not a folder/name/file)."""
    from algorithms.common.model.loading import is_builtin_model

    if not isinstance(source, (str, os.PathLike)) or is_builtin_model(source):
        return None
    path = os.fspath(source)
    if is_gguf(path):  # a GGUF file carries its tokenizer
        return gguf_tokenizer(path) if os.path.isfile(path) else None
    if os.path.isdir(path) and not has_tokenizer(path):
        return None
    from transformers import AutoTokenizer

    from grpo_gym.hub import check_hf_source

    safety = check_hf_source(path, what="model folder")  # a folder that would run its own code is an error here too
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True, **safety)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _fix(source: Any) -> str:
    if isinstance(source, (str, os.PathLike)):
        return f"make the env with the model's tokenizer: gym.make('R1Zero-v0', tokenizer={os.fspath(source)!r})"
    return "make the env with the tokenizer the model was trained with: gym.make('R1Zero-v0', tokenizer=...)"


def check_model_tokenizer(env_tokenizer: Any, source: Any) -> bool:
    """Before the model is built: when ``source`` (a folder or hub name) ships its own tokenizer, it must equal
    the env's (else a ``ValueError`` naming both and the fix). Returns whether such a tokenizer was compared."""
    own = model_tokenizer(source)
    if own is None:
        return False
    differences = _differences(env_tokenizer, own)
    if differences:
        raise ValueError(
            f"the env's tokenizer ({len(env_tokenizer)} tokens) differs from the one saved with model "
            f"{os.fspath(source)!r} ({len(own)} tokens): {'; '.join(differences)}. {_fix(source)}"
        )
    return True


def check_embedding_rows(env_tokenizer: Any, model: Any, source: Any = None, verified: bool = False) -> None:
    """After the model is built: beyond the env tokenizer's ids it may add only padding rows, unless its own
    tokenizer was ``verified`` equal to the env's by :func:`check_model_tokenizer` (fewer rows than ids is the
    policy's own error)."""
    env_size, rows = len(env_tokenizer), model.get_input_embeddings().num_embeddings
    padded = -(-env_size // PADDING_MULTIPLE) * PADDING_MULTIPLE
    if not verified and rows > padded:
        where = f"model {os.fspath(source)!r}" if isinstance(source, (str, os.PathLike)) else "the model"
        raise ValueError(
            f"{where} has {rows} token embeddings but the env's tokenizer only {env_size} tokens: more than "
            f"padding rows (up to {padded}), so it was trained with another tokenizer. {_fix(source)}"
        )


def _differences(first: Any, second: Any) -> list[str]:
    """What differs between two tokenizers' vocabularies and special tokens (empty: the same)."""
    found = []
    vocab_a, vocab_b = first.get_vocab(), second.get_vocab()
    if vocab_a != vocab_b:
        changed = sorted(set(vocab_a.items()) ^ set(vocab_b.items()), key=str)[:3]
        found.append(f"{len(set(vocab_a.items()) ^ set(vocab_b.items()))} token ids differ, e.g. {changed}")
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        a, b = getattr(first, name, None), getattr(second, name, None)
        if name == "pad_token_id" and (a is None or b is None):
            continue  # a tokenizer without a pad token gets EOS as pad in the env
        if a != b:
            found.append(f"{name} {a} vs {b}")
    return found
