"""GGUF files (llama.cpp's and Ollama's format) as a model and tokenizer source.

A path ending in ``.gguf`` is accepted wherever a model or tokenizer folder is: ``policy_kwargs={"model":
"x.gguf"}``, ``gym.make("R1Zero-v0", tokenizer="x.gguf")``, ``grpo-gym train --model x.gguf``, ``load_policy``, the
server. transformers reads the file (with the ``gguf`` package: ``pip install "grpo-gym[gguf]"``): the weights are
dequantized to floating point (float32 unless a dtype is asked for), the tokenizer and its chat template come from
the file's metadata. The model it returns is marked as quantized, which makes ``save_pretrained`` refuse it;
:func:`load_gguf_model` removes the mark, so the model trains, saves and exports as any Hugging Face model (a save
writes the dequantized floating-point weights, not GGUF).

Before transformers reads a file, :func:`check_gguf` reads its header and names the fix for a file that is missing,
truncated or not GGUF, for an architecture transformers cannot build from GGUF, for a tensor type the ``gguf``
package cannot dequantize, for sizes beyond :data:`grpo_gym.hub.MODEL_LIMITS`, and for a folder named ``*.gguf``;
after, :func:`load_gguf_model` refuses a file that lacks some of the model's tensors
(:func:`grpo_gym.hub.check_loaded_weights`).
"""

from __future__ import annotations

import math
import os
import struct
from collections import Counter
from dataclasses import dataclass
from typing import Any

from grpo_gym.hub import check_loaded_weights, check_model_config

SUFFIX = ".gguf"
INSTALL = 'pip install "grpo-gym[gguf]"'
#: tensor types stored as plain floating point (the rest are block-quantized)
FLOAT_TYPES = ("F32", "F16", "BF16")


def is_gguf(source: Any) -> bool:
    """Whether ``source`` names a GGUF file: a string or path ending in ``.gguf`` (any case)."""
    return isinstance(source, (str, os.PathLike)) and os.fspath(source).lower().endswith(SUFFIX)


@dataclass(frozen=True)
class GGUFInfo:
    """What :func:`check_gguf` read from a file's header.

    :param path: the file
    :param architecture: ``general.architecture`` (``"llama"``, ``"qwen2"``, ...)
    :param tensor_types: how many tensors of each type (``{"Q4_1": 210, "F32": 61}``)
    :param chat_template: whether the file carries a chat template (``tokenizer.chat_template``)
    :param config: the model's sizes, under transformers' config names (``num_hidden_layers``, ``hidden_size``, ...)
    """

    path: str
    architecture: str
    tensor_types: dict[str, int]
    chat_template: bool
    config: dict[str, Any]


def require_gguf() -> Any:
    """The ``gguf`` package, or an ``ImportError`` that says how to install it."""
    try:
        import gguf
    except ImportError as error:
        raise ImportError(f"reading a GGUF file needs the gguf package: {INSTALL} (or pip install gguf)") from error
    return gguf


def supported_architectures() -> list[str]:
    """The GGUF architectures transformers builds a model from (its ``GGUF_SUPPORTED_ARCHITECTURES``)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return list(GGUF_SUPPORTED_ARCHITECTURES)


def dequantizable_types(architecture: str) -> list[str]:
    """The tensor types transformers turns into floating point for a file of ``architecture``: the ``gguf``
    package's dequantization for most, transformers' own table for the architectures its newer GGUF path builds
    (transformers 5.x: Qwen3.5, LFM2)."""
    gguf = require_gguf()
    try:
        from transformers.integrations.gguf.dequant import GGML_BLOCK
        from transformers.integrations.gguf.utils import is_gguf_arch_supported
    except ImportError:  # transformers 4.x: the gguf package's, for every architecture
        GGML_BLOCK, is_gguf_arch_supported = {}, lambda _: False
    if is_gguf_arch_supported(architecture):
        return sorted({*FLOAT_TYPES, *(gguf.GGMLQuantizationType(kind).name for kind in GGML_BLOCK)})
    from gguf.quants import _type_traits

    return sorted({"F32", "F16", *(kind.name for kind in _type_traits)})


# ------------------------------------------------------------------------------------------------ the header
_MAGIC, _VERSIONS = b"GGUF", (2, 3)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
#: metadata keys whose value maps to a config size, under ``{architecture}.`` (checked against MODEL_LIMITS)
_SIZES = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "context_length": "max_position_embeddings",
    "vocab_size": "vocab_size",
}


class _ShortRead(ValueError):
    """The bytes read so far end inside the header."""


class _Cursor:
    """Reads little-endian values from ``data``, every read bounds-checked (a short file is an error, not a guess)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, size: int) -> bytes:
        if size < 0:
            raise ValueError(f"a negative length at byte {self.pos}")
        if self.pos + size > len(self.data):
            raise _ShortRead(f"the bytes read end at {len(self.data)}, inside a value at byte {self.pos}")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def scalar(self, kind: int) -> Any:
        form = _SCALARS[kind]
        return struct.unpack(form, self.take(struct.calcsize(form)))[0]

    def string(self) -> str:
        return self.take(self.scalar(10)).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        """A metadata value; an array of strings as its length (a vocabulary is read by transformers, not here)."""
        if kind in _SCALARS:
            return self.scalar(kind)
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise ValueError(f"unknown metadata value type {kind}")
        inner, count = self.scalar(4), self.scalar(10)
        if inner == _STRING:
            for _ in range(count):
                self.take(self.scalar(10))
            return count
        if inner not in _SCALARS:
            raise ValueError(f"unknown array element type {inner}")
        self.take(count * struct.calcsize(_SCALARS[inner]))
        return count


def read_header(path: str) -> tuple[dict[str, Any], list[tuple[str, int, int, int]], int]:
    """A GGUF file's metadata (string arrays as their lengths) and tensor table ``(name, type id, elements,
    offset)``, and where its data section starts; ``ValueError`` for a file that is not GGUF or ends early. The
    file's start is read (16 MiB, more only when the header is longer: a vocabulary of 150k tokens takes ~3 MiB)."""
    size, budget = os.path.getsize(path), 16 * 2**20
    while True:
        with open(path, "rb") as handle:
            data = handle.read(budget)
        try:
            return _parse_header(data)
        except _ShortRead:
            if budget >= size:
                raise ValueError(f"the file ends at byte {size}, inside its header") from None
            budget *= 4


def _parse_header(data: bytes) -> tuple[dict[str, Any], list[tuple[str, int, int, int]], int]:
    cursor = _Cursor(data)
    if cursor.take(4) != _MAGIC:
        raise ValueError("it does not start with the GGUF magic bytes")
    version = cursor.scalar(4)
    if version not in _VERSIONS:
        raise ValueError(f"GGUF version {version} (readable: {', '.join(map(str, _VERSIONS))})")
    tensors, entries = cursor.scalar(10), cursor.scalar(10)
    metadata = {}
    for _ in range(entries):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.scalar(4))
    table = []
    for _ in range(tensors):
        name, dims = cursor.string(), cursor.scalar(4)
        shape = [cursor.scalar(10) for _ in range(dims)]
        kind, offset = cursor.scalar(4), cursor.scalar(10)
        table.append((name, kind, math.prod(shape), offset))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0:
        raise ValueError(f"general.alignment is {alignment!r}")
    return metadata, table, (cursor.pos + alignment - 1) // alignment * alignment


def check_gguf(path: str | os.PathLike, what: str = "model") -> GGUFInfo:
    """Read a GGUF file's header and check that transformers can load it; ``ValueError`` naming the file and the fix.

    :param path: the ``.gguf`` file
    :param what: what the file is used as, for messages (``"model"``, ``"tokenizer"``)
    """
    where = os.fspath(path)
    if os.path.isdir(where):
        try:
            inside = sorted(name for name in os.listdir(where) if is_gguf(name))[:3]
        except OSError:  # a folder this user cannot list
            inside = []
        raise ValueError(
            f"GGUF path {where!r} is a folder, not a file: pass "
            + (f"a .gguf file inside it ({', '.join(inside)})" if inside else "the path of a .gguf file")
            + ", or a Hugging Face model folder by a name that does not end in .gguf"
        )
    if not os.path.isfile(where):
        raise ValueError(
            f"GGUF file {where!r} does not exist: pass the path of a .gguf file (a {what} from llama.cpp or Ollama), "
            "a Hugging Face folder or a hub name"
        )
    gguf = require_gguf()
    fix = "download it again, or export it again with llama.cpp's convert_hf_to_gguf.py"
    try:
        metadata, table, data_start = read_header(where)
        architecture = str(metadata["general.architecture"])
    except (ValueError, KeyError, struct.error, OSError, MemoryError) as error:
        detail = " ".join(str(error).split())[:200] or type(error).__name__
        raise ValueError(
            f"{where} is not a readable GGUF file ({detail}): it may be truncated or not GGUF at all; {fix}"
        ) from None
    names = {kind.value: kind.name for kind in gguf.GGMLQuantizationType}
    types = Counter(names.get(kind, f"type {kind}") for _, kind, _, _ in table)
    needed = max((offset + _nbytes(gguf, kind, count) for _, kind, count, offset in table), default=0)
    size = os.path.getsize(where)
    if data_start + needed > size:
        raise ValueError(
            f"{where} is truncated: its tensors need {data_start + needed} bytes and the file holds {size}; {fix}"
        )
    known = supported_architectures()
    if architecture not in known:
        raise ValueError(
            f"{where} holds a {architecture!r} model, which transformers cannot build from GGUF (it reads "
            f"{', '.join(sorted(known))}): pass the model's original Hugging Face folder or hub name instead"
        )
    readable = dequantizable_types(architecture)
    unreadable = sorted(kind for kind in types if kind not in readable)
    if unreadable:
        raise ValueError(
            f"{where} holds tensors of type {', '.join(unreadable)}, which transformers cannot dequantize (it reads "
            f"{', '.join(readable)}): export the model again in one of those (llama.cpp's llama-quantize ... Q8_0, or "
            "convert_hf_to_gguf.py --outtype f16), or pass its Hugging Face folder"
        )
    config = {
        name: metadata[f"{architecture}.{key}"] for key, name in _SIZES.items() if f"{architecture}.{key}" in metadata
    }
    config.setdefault("vocab_size", metadata.get("tokenizer.ggml.tokens", 0))
    check_model_config(config, f"GGUF file {where!r}")
    return GGUFInfo(where, architecture, dict(types), "tokenizer.chat_template" in metadata, config)


def _nbytes(gguf: Any, kind: int, count: int) -> int:
    """The bytes ``count`` values of tensor type ``kind`` take in a file (0 for a type gguf does not know)."""
    try:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        return 0
    return count // block * size


def load_gguf_tokenizer(path: str | os.PathLike) -> Any:
    """The tokenizer a GGUF file carries (vocabulary, merges, special tokens, chat template), via transformers (the
    built-in vocabulary is read by :func:`grpo_gym.tokenizer.gguf_tokenizer`)."""
    from transformers import AutoTokenizer

    info = check_gguf(path, what="tokenizer")
    folder, name = os.path.split(os.path.abspath(info.path))
    try:
        return AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (OSError, ValueError, KeyError, NotImplementedError) as error:
        raise ValueError(
            f"transformers could not read the tokenizer of {info.path} ({type(error).__name__}: {error}); pass "
            "tokenizer= a Hugging Face tokenizer folder of the same model (--tokenizer on the command line)"
        ) from error


def load_gguf_model(path: str | os.PathLike, dtype: Any = None) -> Any:
    """The causal LM a GGUF file holds, dequantized to ``dtype`` (float32 by default), as a plain Hugging Face model:
    it trains, saves (``save_pretrained`` writes floating-point weights) and exports like one loaded from a folder.

    :param path: the ``.gguf`` file
    :param dtype: the parameters' dtype (``torch.bfloat16``, ``"float32"``, ...); ``None``: float32
    """
    import torch
    from transformers import AutoModelForCausalLM

    info = check_gguf(path)
    folder, name = os.path.split(os.path.abspath(info.path))
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else (dtype or torch.float32)
    fix = "pass the model's Hugging Face folder or hub name instead"
    try:
        model, loading = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=dtype, output_loading_info=True, **_dequantized()
        )
    except (OSError, ValueError, KeyError, NotImplementedError, RuntimeError) as error:
        raise ValueError(
            f"transformers could not load the model of {info.path} ({type(error).__name__}: {error}); {fix}"
        ) from error
    again = f"export it again from the whole model (llama.cpp's convert_hf_to_gguf.py), or {fix}"
    check_loaded_weights(loading, model, f"GGUF file {info.path!r}", again)
    if getattr(model, "is_quantized", False):  # an older transformers marks the dequantized model quantized, and
        model.hf_quantizer = None  # save_pretrained refuses such a model: its weights are plain tensors, the mark goes
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    return model


def _dequantized() -> dict[str, Any]:
    """``from_pretrained``'s argument that asks for every weight dequantized (transformers 5.x would otherwise keep
    some architectures' weights in packed blocks, which do not train); nothing for an older version, which always
    dequantizes."""
    import inspect

    from transformers.utils.quantization_config import GgufConfig

    if "dequantize" not in inspect.signature(GgufConfig.__init__).parameters:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}
