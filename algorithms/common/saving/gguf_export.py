"""GGUF export: a trained Llama-family model back to llama.cpp's format, with an Ollama ``Modelfile`` beside it.

:func:`save_gguf` writes what llama.cpp's ``convert_hf_to_gguf.py`` writes, through the ``gguf`` package's writer:
the tensors under llama.cpp's names (the package's tensor-name map), the query and key projections permuted to
llama.cpp's rotary layout, the architecture's sizes, the tokenizer (tokens, token types, merges, special ids) and its
chat template, and ``general.*`` metadata saying what the model was trained from and how. A model trained from a
GGUF file writes back every metadata key that file holds (its tokenizer's among them), with the sizes and
``general.*`` entries of the export over them: a drop-in replacement for the file it came from.

Types: ``f32``, ``f16``, ``bf16`` and the block types the ``gguf`` package quantizes to (:func:`export_types`). The
norms stay float32, as llama.cpp keeps them; a weight whose rows do not split into the type's blocks is written
``f16`` (as ``convert_hf_to_gguf.py`` does).

The built-in character tokenizer is written as llama.cpp's SentencePiece-style vocabulary (one token per character,
the space as ``▁``, the ``<0xNN>`` byte tokens as byte fallback, the template tags as tokens matched in text), so the
built-in models export too.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from algorithms.common.saving.atomic import atomic_path, atomic_write
from grpo_gym.gguf import require_gguf

#: the architectures written (llama.cpp's ``llama``: Llama and the models of its layout)
ARCHITECTURES = ("llama",)
#: block types the ``gguf`` package quantizes to that are not offered: ternary and MXFP4 weights are for models
#: trained for them (BitNet, gpt-oss), and round an ordinary model's weights away
NOT_OFFERED = ("TQ1_0", "TQ2_0", "MXFP4")
#: the Modelfile written beside the GGUF file
MODELFILE = "Modelfile"


def export_types() -> list[str]:
    """The types :func:`save_gguf` writes: ``f32``, ``f16``, and every type the ``gguf`` package quantizes to
    (``bf16``, ``q8_0``, ``q4_0``, ...), lower case, as llama.cpp's ``--outtype`` names them."""
    gguf = require_gguf()
    block = []
    for kind in gguf.GGMLQuantizationType:
        if kind.name in ("F32", "F16", *NOT_OFFERED):
            continue
        try:
            size = gguf.GGML_QUANT_SIZES[kind][0]
            gguf.quants.quantize(np.zeros((1, size), dtype=np.float32), kind)
        except (NotImplementedError, KeyError, gguf.quants.QuantError):
            continue
        block.append(kind.name.lower())
    floats = [kind for kind in block if not kind.startswith("q")]
    return ["f32", "f16", *floats, *sorted(kind for kind in block if kind.startswith("q"))]


@dataclass
class ExportInfo:
    """What the export says of the model beside its weights and tokenizer.

    :param name: ``general.name``
    :param description: ``general.description``: how it was trained
    :param source: the GGUF file it was trained from, whose metadata is written back (``None``: none)
    :param base_model: ``general.base_model.0.name``: what it was trained from
    :param chat: the prompts were rendered by the tokenizer's chat template (the Modelfile translates it), else
        written as ``prompt_affixes`` around the question
    :param system: the system prompt it was trained with (the Modelfile's ``SYSTEM``), or ``None``
    :param prompt_affixes: the text before and after the question in training (without the chat template)
    :param sampling: the Modelfile's ``PARAMETER`` lines (``temperature``, ``top_p``, ``top_k``, ``num_predict``)
    """

    name: str = "grpo-gym model"
    description: str = ""
    source: str | None = None
    base_model: str | None = None
    chat: bool = True
    system: str | None = None
    prompt_affixes: tuple[str, str] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)


def export_info(algorithm: Any) -> ExportInfo:
    """What an algorithm's export says of its model: the GGUF file it was trained from (when it still exists), how
    it was trained (algorithm, completions, task and difficulty), the system prompt and the prompt around a
    question (its env's), and the policy's sampling settings."""
    from grpo_gym import __version__
    from grpo_gym.gguf import is_gguf

    source = algorithm.policy_kwargs.get("model")
    gguf_source = os.fspath(source) if is_gguf(source) and os.path.isfile(source) else None
    env = algorithm.env
    task, difficulty, budget = (env.get_attr(name, [0])[0] for name in ("task", "difficulty", "max_new_tokens"))
    formatter = env.get_attr("formatter", [0])[0]
    base = os.path.basename(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else "the built-in tiny model"
    name = type(algorithm).__name__
    description = (
        f"{name} with grpo-gym {__version__} from {base}: {algorithm.num_timesteps} completions on the "
        f"{getattr(task, 'name', type(task).__name__)} task at difficulty {difficulty}"
    )
    policy = algorithm.policy
    return ExportInfo(
        name=f"{Path(base).stem} {name}",
        description=description,
        source=gguf_source,
        base_model=base,
        chat=formatter.chat,
        system=formatter.system,
        prompt_affixes=formatter.prompt_affixes,
        sampling={
            "temperature": policy.temperature,
            "top_p": policy.top_p,
            "top_k": policy.top_k or None,
            "num_predict": budget,
        },
    )


def save_gguf(model: Any, tokenizer: Any, path: str | os.PathLike, type: str = "f16", info: ExportInfo | None = None,
              force: bool = False) -> Path:  # fmt: skip
    """Write ``model`` and ``tokenizer`` to a GGUF file at ``path`` and an Ollama ``Modelfile`` beside it; both
    atomically (a temporary file renamed into place: an error or a kill leaves nothing half-written).

    :param model: a Hugging Face Llama-family causal LM (a peft model: merge its adapters first)
    :param tokenizer: its tokenizer (a byte-level BPE one, or the built-in character tokenizer)
    :param path: the ``.gguf`` file to write
    :param type: ``f32``, ``f16``, ``bf16``, ``q8_0``, ... (:func:`export_types`)
    :param info: names, training description, the source GGUF file and the Modelfile's settings
    :param force: replace ``path`` and its ``Modelfile`` when they exist
    :return: the GGUF file written
    """
    gguf = require_gguf()
    info = info or ExportInfo()
    kind = check_type(type)
    check_exportable(model)
    target, modelfile = check_output(path, force)
    metadata = _metadata(model, tokenizer, info, kind, gguf)
    text = modelfile_text(target.name, tokenizer, info)  # before any write: a template it cannot translate stops here
    with atomic_path(target) as temporary:
        writer = gguf.GGUFWriter(os.fspath(temporary), arch="llama")
        for key, (value, vtype, sub) in metadata.items():
            if key != "general.architecture":  # the writer's own
                writer.add_key_value(key, value, vtype, sub)
        for name, data in _tensors(model, kind, gguf):
            writer.add_tensor(name, data, raw_dtype=None if data.dtype in (np.float32, np.float16) else kind)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    with atomic_write(modelfile, "w") as handle:
        handle.write(text)
    return target


def check_type(type: str) -> Any:
    """The ``gguf`` package's type for ``type`` (``"q8_0"``, any case); ``ValueError`` listing the types offered."""
    gguf = require_gguf()
    offered = export_types()
    if not isinstance(type, str) or type.lower() not in offered:
        raise ValueError(f"GGUF type {type!r} is not one this export writes; choose one of {', '.join(offered)}")
    return gguf.GGMLQuantizationType[type.upper()]


def check_exportable(model: Any) -> None:
    """``ValueError`` for a model llama.cpp's ``llama`` architecture does not describe, or a peft model."""
    if hasattr(model, "peft_config"):
        raise ValueError(
            "the model carries LoRA adapters: merge them first (model.merge_and_unload(), or GRPO.save_gguf, which "
            "exports the merged weights)"
        )
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise ValueError(
            f"GGUF export writes Llama-family models (model_type 'llama': SmolLM, Llama, the built-in models); this "
            f"model is {model_type or type(model).__name__!r}: export it with save_pretrained and llama.cpp's "
            "convert_hf_to_gguf.py"
        )
    scaling = getattr(config, "rope_scaling", None) or {}
    if scaling.get("rope_type", scaling.get("type", "default")) not in ("default", "linear"):
        raise ValueError(
            f"the model's rotary scaling {scaling!r} is not written by this export (default and linear are): export "
            "it with save_pretrained and llama.cpp's convert_hf_to_gguf.py"
        )


def check_output(path: str | os.PathLike, force: bool) -> tuple[Path, Path]:
    """The GGUF file and its ``Modelfile``; ``ValueError`` for a name without ``.gguf``, a missing folder, or a
    file that exists (without ``force``)."""
    target = Path(path)
    if target.suffix.lower() != ".gguf":
        raise ValueError(f"the GGUF file's name must end in .gguf, got {os.fspath(path)!r}")
    if not target.parent.is_dir():
        raise ValueError(f"the folder of {os.fspath(path)!r} does not exist: create it first")
    modelfile = target.parent / MODELFILE
    fixes = {
        target: "choose another name",
        modelfile: "the Modelfile goes beside the .gguf file: export into another folder",
    }
    for output, fix in fixes.items():
        if output.is_dir():
            raise ValueError(f"{os.fspath(output)!r} is a folder: {fix}")
        if output.exists() and not force:
            raise ValueError(f"{os.fspath(output)!r} exists: {fix}, or replace it with --force (force=True in Python)")
    return target, modelfile


# ------------------------------------------------------------------------------------------------ tensors
def permute_rotary(weight: np.ndarray, heads: int) -> np.ndarray:
    """A query or key projection in llama.cpp's rotary layout: each head's two halves interleaved (transformers
    undoes it when it reads the file)."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _tensors(model: Any, kind: Any, gguf: Any) -> Iterator[tuple[str, np.ndarray]]:
    """``(llama.cpp name, data)`` of every weight: norms float32, the rest of ``kind`` (f16 where its blocks do
    not fit a row); the output layer left out when it is the embeddings' (llama.cpp ties it then)."""
    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    tied = getattr(config, "tie_word_embeddings", False)
    for hf_name, tensor in model.state_dict().items():
        if (hf_name == "lm_head.weight" and tied) or hf_name.endswith("rotary_emb.inv_freq"):
            continue
        base, _, suffix = hf_name.rpartition(".")
        target = names.get_name(base)
        if target is None:
            raise ValueError(f"the weight {hf_name!r} has no llama.cpp name: the model is not a plain Llama")
        data = tensor.detach().float().cpu().numpy()
        if base.endswith("q_proj"):
            data = permute_rotary(data, config.num_attention_heads)
        elif base.endswith("k_proj"):
            data = permute_rotary(data, config.num_key_value_heads)
        yield f"{target}.{suffix}", _typed(data, kind, gguf)


def _typed(data: np.ndarray, kind: Any, gguf: Any) -> np.ndarray:
    types = gguf.GGMLQuantizationType
    if data.ndim == 1 or kind == types.F32:
        return data.astype(np.float32)
    if kind == types.F16:
        return data.astype(np.float16)
    block = gguf.GGML_QUANT_SIZES[kind][0]
    if data.shape[-1] % block:
        return data.astype(np.float16)
    return gguf.quants.quantize(data, kind)


# ------------------------------------------------------------------------------------------------ metadata
Entry = tuple[Any, Any, Any]  # value, GGUFValueType, the array's element type


def _metadata(model: Any, tokenizer: Any, info: ExportInfo, kind: Any, gguf: Any) -> dict[str, Entry]:
    """Every key to write: the source file's, then the sizes, the tokenizer (when no source gives it) and
    ``general.*`` over them."""
    entries = _source_metadata(info.source, gguf) if info.source else {}
    if not any(key.startswith("tokenizer.ggml.") for key in entries):
        entries.update(tokenizer_metadata(tokenizer, gguf))
    entries.update(_sizes(model.config, kind, gguf))
    V = gguf.GGUFValueType
    entries["general.type"] = ("model", V.STRING, None)
    entries["general.name"] = (info.name, V.STRING, None)
    if info.description:
        entries["general.description"] = (info.description, V.STRING, None)
    if info.base_model:
        entries["general.base_model.count"] = (1, V.UINT32, None)
        entries["general.base_model.0.name"] = (info.base_model, V.STRING, None)
    return entries


def _source_metadata(source: str, gguf: Any) -> dict[str, Entry]:
    """The metadata of the GGUF file a model was trained from, but what describes its tensors and layout."""
    reader = gguf.GGUFReader(source)
    kept = {}
    for key, entry in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.file_type", "general.quantization_version", "general.alignment"):
            continue
        types = entry.types
        kept[key] = (entry.contents(), types[0], types[-1] if types[0] == gguf.GGUFValueType.ARRAY else None)
    return kept


def _sizes(config: Any, kind: Any, gguf: Any) -> dict[str, Entry]:
    """The architecture's hyperparameters under ``llama.*``, and the file type."""
    V, K = gguf.GGUFValueType, gguf.Keys
    arch = "llama"
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    entries = {
        K.LLM.CONTEXT_LENGTH: config.max_position_embeddings,
        K.LLM.EMBEDDING_LENGTH: config.hidden_size,
        K.LLM.BLOCK_COUNT: config.num_hidden_layers,
        K.LLM.FEED_FORWARD_LENGTH: config.intermediate_size,
        K.Attention.HEAD_COUNT: heads,
        K.Attention.HEAD_COUNT_KV: config.num_key_value_heads or heads,
        K.Rope.DIMENSION_COUNT: head_dim,
        K.LLM.VOCAB_SIZE: config.vocab_size,
    }
    written: dict[str, Entry] = {key.format(arch=arch): (int(v), V.UINT32, None) for key, v in entries.items()}
    if head_dim != config.hidden_size // heads:
        for key in (K.Attention.KEY_LENGTH, K.Attention.VALUE_LENGTH):
            written[key.format(arch=arch)] = (int(head_dim), V.UINT32, None)
    written[K.Rope.FREQ_BASE.format(arch=arch)] = (float(theta), V.FLOAT32, None)
    written[K.Attention.LAYERNORM_RMS_EPS.format(arch=arch)] = (float(config.rms_norm_eps), V.FLOAT32, None)
    scaling = getattr(config, "rope_scaling", None) or {}
    if scaling.get("rope_type", scaling.get("type")) == "linear":
        written[K.Rope.SCALING_TYPE.format(arch=arch)] = ("linear", V.STRING, None)
        written[K.Rope.SCALING_FACTOR.format(arch=arch)] = (float(scaling["factor"]), V.FLOAT32, None)
    file_type = getattr(gguf.LlamaFileType, "ALL_F32" if kind.name == "F32" else f"MOSTLY_{kind.name}")
    written[K.General.FILE_TYPE] = (int(file_type), V.UINT32, None)
    written[K.General.QUANTIZATION_VERSION] = (gguf.GGML_QUANT_VERSION, V.UINT32, None)
    return written


def tokenizer_metadata(tokenizer: Any, gguf: Any) -> dict[str, Entry]:
    """A Hugging Face tokenizer as llama.cpp's ``tokenizer.*`` keys: a byte-level BPE one as ``gpt2`` (tokens,
    merges), the built-in character tokenizer as ``llama`` (SentencePiece-style, byte fallback); ``ValueError``
    for another kind, naming what to do instead."""
    V, T = gguf.GGUFValueType, gguf.TokenType
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    model, pre = backend["model"], backend.get("pre_tokenizer") or {}
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    if [vocab[token] for token in tokens] != list(range(len(tokens))):
        raise ValueError("the tokenizer's ids have gaps: llama.cpp needs one token per id from 0")
    special = set(tokenizer.all_special_tokens)
    added = {token for token in tokenizer.get_added_vocab() if token not in special}
    entries: dict[str, Entry] = {}
    if model.get("type") == "BPE" and model.get("byte_fallback") and not model.get("merges"):
        kind = "llama"  # the built-in character tokenizer: one token per character, bytes as <0xNN>
        types = [
            T.CONTROL if t in special else T.USER_DEFINED if t in added else
            T.BYTE if re.fullmatch(r"<0x[0-9A-F]{2}>", t) else T.NORMAL for t in tokens
        ]  # fmt: skip
        tokens = ["▁" if t == " " else t for t in tokens]
        entries["tokenizer.ggml.scores"] = ([0.0] * len(tokens), V.ARRAY, V.FLOAT32)
        entries["tokenizer.ggml.add_space_prefix"] = (False, V.BOOL, None)
    elif model.get("type") == "BPE" and pre.get("type") == "ByteLevel":
        kind = "gpt2"
        types = [T.CONTROL if t in special else T.USER_DEFINED if t in added else T.NORMAL for t in tokens]
        merges = [" ".join(pair) if isinstance(pair, list) else pair for pair in model.get("merges", [])]
        entries["tokenizer.ggml.pre"] = ("gpt-2", V.STRING, None)  # ByteLevel's own split is GPT-2's
        entries["tokenizer.ggml.merges"] = (merges, V.ARRAY, V.STRING)
    else:
        raise ValueError(
            f"this export writes byte-level BPE tokenizers and the built-in one; this tokenizer is a "
            f"{model.get('type')} model with a {pre.get('type', 'no')} pre-tokenizer: train from the model's GGUF file "
            "(its tokenizer is written back as it was), or convert the save_pretrained folder with llama.cpp's "
            "convert_hf_to_gguf.py"
        )
    entries["tokenizer.ggml.model"] = (kind, V.STRING, None)
    entries["tokenizer.ggml.tokens"] = (tokens, V.ARRAY, V.STRING)
    entries["tokenizer.ggml.token_type"] = ([int(t) for t in types], V.ARRAY, V.INT32)
    for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id"),
                      ("unk", "unknown_token_id")):  # fmt: skip
        token_id = getattr(tokenizer, f"{name}_token_id", None)
        if token_id is not None:
            entries[f"tokenizer.ggml.{key}"] = (int(token_id), V.UINT32, None)
    adds_bos = tokenizer.bos_token_id is not None and tokenizer("a")["input_ids"][:1] == [tokenizer.bos_token_id]
    entries["tokenizer.ggml.add_bos_token"] = (adds_bos, V.BOOL, None)
    if isinstance(getattr(tokenizer, "chat_template", None), str):
        entries["tokenizer.chat_template"] = (tokenizer.chat_template, V.STRING, None)
    return entries


# ------------------------------------------------------------------------------------------------ Modelfile
_MARK = "\x00{}\x00"


def ollama_template(tokenizer: Any) -> str:
    """The tokenizer's chat template in Ollama's (Go template) syntax; ``ValueError`` when its messages are not
    each written as ``prefix + content + suffix`` (the layout of ChatML, Llama 3 and most chat templates).

    The pieces are read off the chat template rendered around marker contents: the text before each role's content,
    the end of a message, a default system message the template adds when the conversation has none, and the
    generation prompt."""

    def render(messages: list[tuple[str, str]], generation: bool = False) -> str:
        chat = [{"role": role, "content": _MARK.format(role)} for role, _ in messages]
        return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation)

    user, system, assistant = (_MARK.format(role) for role in ("user", "system", "assistant"))
    one = render([("user", "")])
    two = render([("user", ""), ("assistant", "")])
    both = render([("system", ""), ("user", "")])
    prompt = render([("user", "")], generation=True)
    suffix = two.split(assistant)[1]
    head, _, tail = one.partition(user)
    if tail != suffix or not two.startswith(one) or not prompt.startswith(one):
        raise ValueError("the chat template does not write each message as prefix + content + suffix")
    before_assistant = two[len(one) :].split(assistant)[0]
    before_system, _, rest = both.partition(system)
    if not rest.startswith(suffix):
        raise ValueError("the chat template ends a system message unlike the others")
    before_user = rest[len(suffix) :].split(user)[0]
    if not head.endswith(before_user):
        raise ValueError("the chat template writes a user message differently after a system message")
    default = head[: len(head) - len(before_user)]
    generation = prompt[len(one) :]

    body = (
        f'{{{{ range .Messages }}}}{{{{ if eq .Role "system" }}}}{_literal(before_system)}'
        f'{{{{ else if eq .Role "user" }}}}{_literal(before_user)}'
        f"{{{{ else }}}}{_literal(before_assistant)}{{{{ end }}}}{{{{ .Content }}}}{_literal(suffix)}{{{{ end }}}}"
        f"{_literal(generation)}"
    )
    if default:
        body = f'{{{{ if ne (index .Messages 0).Role "system" }}}}{_literal(default)}{{{{ end }}}}' + body
    return body


def _literal(text: str) -> str:
    """``text`` as literal text of a Go template (its ``{{`` written as a string action)."""
    return text.replace("{{", '{{ "{{" }}')


def modelfile_text(gguf_name: str, tokenizer: Any, info: ExportInfo) -> str:
    """An Ollama ``Modelfile`` for the GGUF file ``gguf_name`` beside it: ``FROM``, the template (the chat
    template's when training used it, else the training prompt around ``.Prompt``), the system prompt, the stop
    tokens and the sampling parameters the model was trained with."""
    if info.chat and isinstance(getattr(tokenizer, "chat_template", None), str):
        template, system = ollama_template(tokenizer), info.system
    else:
        before, after = info.prompt_affixes or ("", "")
        template, system = f"{_literal(before)}{{{{ .Prompt }}}}{_literal(after)}", None
    for name, value in (("chat template", template), ("system prompt", system or "")):
        if '"""' in value:
            raise ValueError(f'the {name} holds """, which a Modelfile cannot quote: edit it out of the {name}')
    lines = [f"# Ollama: ollama create NAME -f {MODELFILE}", f"FROM ./{gguf_name}", f'TEMPLATE """{template}"""']
    if system:
        lines.append(f'SYSTEM """{system}"""')
    stops = [tokenizer.eos_token] if tokenizer.eos_token else []
    for stop in stops:
        lines.append(f"PARAMETER stop {json.dumps(stop)}")
    for key, value in info.sampling.items():
        if value is not None:
            lines.append(f"PARAMETER {key} {value}")
    return "\n".join(lines) + "\n"
