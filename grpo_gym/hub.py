"""Reading Hugging Face folders without trusting them: no remote code, bounded JSON files, bounded model sizes.

Every loader of grpo-gym (``load_tokenizer``, ``RewardModelScorer``, ``load_model``, the tokenizer guard,
``load_policy`` and the INT8 export's ``load_int8``) calls :func:`check_hf_source` before transformers reads a
folder (or a hub name's files in the local cache), and passes what it returns (``trust_remote_code=False`` unless the
caller opted in) to every ``from_pretrained``. So:

- **No code from a folder.** A ``config.json`` or ``tokenizer_config.json`` (or another of :data:`CONFIG_FILES`)
  with an ``"auto_map"`` entry names Python classes that transformers would import from the folder or the hub: it
  runs that code (and, with ``trust_remote_code`` left unset, first asks "run the custom code? [y/N]"). Such a
  source is refused with :class:`RemoteCodeError`, which names the file and the fix. The one opt-in is an explicit
  ``trust_remote_code=True`` given in Python to the loader (``load_model(folder, trust_remote_code=True)``,
  ``load_tokenizer(folder, trust_remote_code=True)``, ``RewardModelScorer(folder, trust_remote_code=True)``,
  ``load_policy(folder, trust_remote_code=True)``), whose object you then pass on. A record (a zip's env record or
  ``policy_kwargs``, a YAML config, a command line) never opts in.
- **Bounded files.** Each of :data:`CONFIG_FILES` is at most :data:`MAX_CONFIG_BYTES` (4 MiB; real ones are a few
  KiB) and each tokenizer data file (:data:`TOKENIZER_DATA_FILES`) at most :data:`MAX_TOKENIZER_BYTES` (512 MiB; the
  largest real ones are ~35 MB), checked by size before anything reads them.
- **Bounded models.** A model config's dimensions stay within :data:`MODEL_LIMITS` (e.g. at most 1024 layers, a
  hidden size of 65536), and a lower bound of its size (``vocab * hidden + layers * 2 * hidden * (hidden +
  intermediate)`` parameters at 2 bytes each) must fit this machine's memory: checked before any weight is allocated.
- **Whole weights.** A model whose files lack some of its weights (:func:`check_loaded_weights`) is refused:
  transformers would leave those at their random initial values, with only a log report to say so.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from typing import Any

from grpo_gym.validation import check_bool

MAX_CONFIG_BYTES = 4 * 2**20
"""The largest accepted config-like JSON file (:data:`CONFIG_FILES`), in bytes."""
MAX_TOKENIZER_BYTES = 512 * 2**20
"""The largest accepted tokenizer data file (:data:`TOKENIZER_DATA_FILES`), in bytes."""
CONFIG_FILES = (
    "config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "generation_config.json",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "adapter_config.json",
    "quantization.json",
)
"""The small JSON files transformers (or grpo-gym) reads from a model or tokenizer folder: size-checked and searched
for ``"auto_map"``."""
TOKENIZER_DATA_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model")
"""The tokenizer's data files: size-checked only."""
MODEL_LIMITS = {
    "num_hidden_layers": 1024,
    "n_layer": 1024,
    "num_layers": 1024,
    "hidden_size": 65536,
    "n_embd": 65536,
    "d_model": 65536,
    "intermediate_size": 262144,
    "n_inner": 262144,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "n_head": 1024,
    "head_dim": 8192,
    "vocab_size": 2**22,
    "max_position_embeddings": 2**24,
    "n_positions": 2**24,
    "num_local_experts": 4096,
    "num_experts": 4096,
}
"""The largest value each model-config dimension may take (checked at every nesting level, e.g. ``text_config``);
about eight times the largest open models' values."""
_NESTING = 8  # how deep nested sub-configs are searched


class RemoteCodeError(ValueError):
    """A folder (or record) asks transformers to run its own Python code and nobody opted in."""


def trust_kwargs(trust_remote_code: bool) -> dict[str, bool]:
    """``{"trust_remote_code": ...}`` for ``from_pretrained`` / ``from_config``: always given, never left unset
    (unset, transformers may ask on the terminal whether to run a folder's code)."""
    return {"trust_remote_code": check_bool("trust_remote_code", trust_remote_code)}  # type: ignore[dict-item]


def read_config_file(path: str | os.PathLike, limit: int = MAX_CONFIG_BYTES) -> Any:
    """The JSON value of a config-like file, its size checked before it is read; ``ValueError`` naming the file."""
    where = os.fspath(path)
    size = os.path.getsize(where)
    if size > limit:
        raise ValueError(
            f"{where} is {size} bytes, more than the {limit} a config file may hold (grpo_gym.hub.MAX_CONFIG_BYTES); "
            "it is not a Hugging Face config: remove it, or pass a folder written by save_pretrained"
        )
    try:
        with open(where, "rb") as handle:
            return json.loads(handle.read().decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        detail = " ".join(str(error).split())[:200] if not isinstance(error, RecursionError) else "nested too deeply"
        raise ValueError(f"{where} is not a valid UTF-8 JSON file ({detail}): fix or remove it") from None


def _cached_file(repo_id: str, name: str) -> str | None:
    """The local copy of ``name`` of a hub repo in the Hugging Face cache, or ``None``."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, name)
    except Exception:  # not a valid repo id, no cache: nothing local to check
        return None
    return found if isinstance(found, str) else None


def _files(source: str) -> dict[str, str]:
    """The config and tokenizer files of a folder, or of a hub name's cached snapshot: ``{file name: path}``."""
    names = (*CONFIG_FILES, *TOKENIZER_DATA_FILES)
    if os.path.isdir(source):
        return {name: os.path.join(source, name) for name in names if os.path.isfile(os.path.join(source, name))}
    found = {name: _cached_file(source, name) for name in names}
    return {name: path for name, path in found.items() if path is not None}


def check_hf_source(
    source: str | os.PathLike, *, trust_remote_code: bool = False, what: str = "model folder"
) -> dict[str, bool]:
    """Check a Hugging Face folder (or a cached hub name) before transformers reads it (see the module docstring)
    and return the keyword arguments every ``from_pretrained`` call on it must take.

    :param source: a local folder, or a hub name (its files in the local cache are checked, if any)
    :param trust_remote_code: the caller's explicit opt-in to the folder's own code (never from a record)
    :param what: what the source is, for messages (``"tokenizer folder"``)
    :raises RemoteCodeError: an ``"auto_map"`` entry without the opt-in
    :raises ValueError: an oversized or invalid config file, or a model too large (see :func:`check_model_config`)
    """
    kwargs = trust_kwargs(trust_remote_code)
    path = os.fspath(source)
    for name, file in _files(path).items():
        if name in TOKENIZER_DATA_FILES:
            size = os.path.getsize(file)
            if size > MAX_TOKENIZER_BYTES:
                raise ValueError(
                    f"{file} is {size} bytes, more than the {MAX_TOKENIZER_BYTES} a tokenizer file may hold "
                    "(grpo_gym.hub.MAX_TOKENIZER_BYTES): pass a folder written by save_pretrained"
                )
            continue
        value = read_config_file(file)
        if not isinstance(value, dict):
            raise ValueError(f"{file} must hold a JSON object, got {type(value).__name__}: fix or remove it")
        if not kwargs["trust_remote_code"]:
            refuse_remote_code(value, f"{what} {path!r} ({name})", path, what)
        if name == "config.json":
            check_model_config(value, f"{what} {path!r} (config.json)")
    return kwargs


def check_hub_reachable(source: str | os.PathLike, what: str) -> None:
    """Before ``from_pretrained`` may download: a hub name with nothing of it in the local cache fails at once, naming
    the fix, when the hub cannot be reached (``HF_HUB_OFFLINE`` set, or its host does not resolve), rather than after
    transformers' minute of retries. A folder, a path or a cached name passes."""
    source = os.fspath(source)
    if os.path.isdir(source) or _files(source):
        return
    from urllib.parse import urlparse
    from urllib.request import getproxies

    from huggingface_hub import constants
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(source)
    except HFValidationError:  # a path (a folder that is gone): not a hub lookup, the caller says what is missing
        return
    fix = (
        "download it where there is a network (huggingface-cli download NAME --local-dir FOLDER) and pass the "
        "folder, or pass a local folder or .gguf file"
    )
    if constants.HF_HUB_OFFLINE:
        raise ValueError(
            f"{what} {source!r} is not a folder here and not in the Hugging Face cache, and HF_HUB_OFFLINE is set: "
            f"{fix}"
        )
    if getproxies():  # through a proxy the hub is reached without resolving its host here
        return
    host = urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT
    try:
        socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
    except OSError as error:
        raise ValueError(
            f"{what} {source!r} is not a folder here and not in the Hugging Face cache, and the hub ({host}) cannot "
            f"be reached ({error.strerror or error}): {fix}"
        ) from None


_OPT_IN = {
    "tokenizer folder": "grpo_gym.load_tokenizer({path}, trust_remote_code=True)",
    "reward model folder": "grpo_gym.RewardModelScorer({path}, trust_remote_code=True)",
    "model folder": "algorithms.common.model.loading.load_model({path}, trust_remote_code=True)",
    "INT8 export folder": "algorithms.deploy.loading.load_policy({path}, trust_remote_code=True)",
}


def refuse_remote_code(config: Mapping[str, Any], where: str, source: str | None = None, what: str = "") -> None:
    """:class:`RemoteCodeError` when ``config`` (a parsed config file or record) has an ``"auto_map"`` entry.

    :param config: the parsed JSON object
    :param where: what holds it, for the message (``"model folder 'x' (config.json)"``)
    :param source: the folder or name, for the opt-in shown in the message (``None``: a record)
    :param what: what the source is (a key of the opt-in examples: ``"tokenizer folder"``, ``"model folder"``)
    """
    auto_map = config.get("auto_map")
    if not auto_map:
        return
    classes = ", ".join(map(str, auto_map)) if isinstance(auto_map, Mapping) else str(auto_map)
    example = _OPT_IN.get(what, _OPT_IN["model folder"]).format(path=repr(source))
    opt_in = (
        f"if you have read that code and trust it, build the object in Python with {example} and pass the object "
        "instead of the path"
        if source is not None
        else "if you trust the code, build the model in Python (trust_remote_code=True) and pass the object"
    )
    model_type = config.get("model_type")
    native = f" for model_type {model_type!r}" if isinstance(model_type, str) else ""
    raise RemoteCodeError(
        f'{where} has an "auto_map" entry ({classes[:200]}): loading it would import and run Python code that came '
        f'with it. grpo-gym never runs such code unless you opt in: {opt_in}; or delete the "auto_map" '
        f"entry to load it with transformers' own classes{native}, where transformers has them."
    )


def _limit_errors(config: Mapping[str, Any], depth: int = 0) -> list[str]:
    found = []
    for key, value in config.items():
        if isinstance(value, Mapping) and depth < _NESTING:
            found += [f"{key}.{error}" for error in _limit_errors(value, depth + 1)]
        elif key in MODEL_LIMITS and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not 0 <= value <= MODEL_LIMITS[key]:
                found.append(f"{key} = {value!r} (allowed: 0 to {MODEL_LIMITS[key]})")
    return found


def _first(config: Mapping[str, Any], *keys: str) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def parameters_lower_bound(config: Mapping[str, Any], depth: int = 0) -> int:
    """At least how many parameters the model of ``config`` (and its nested sub-configs) has: embeddings plus, per
    layer, the query and output projections and two MLP matrices (``vocab*h + layers*2*h*(h + intermediate)``)."""
    hidden = _first(config, "hidden_size", "n_embd", "d_model")
    layers = _first(config, "num_hidden_layers", "n_layer", "num_layers")
    vocab = _first(config, "vocab_size")
    inner = _first(config, "intermediate_size", "n_inner")
    total = vocab * hidden + layers * 2 * hidden * (hidden + inner)
    if depth < _NESTING:
        total += sum(parameters_lower_bound(v, depth + 1) for v in config.values() if isinstance(v, Mapping))
    return total


def physical_memory() -> int | None:
    """This machine's memory in bytes (``None`` where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def check_model_config(config: Mapping[str, Any], where: str) -> None:
    """``ValueError`` naming ``where`` when a model config's dimensions exceed :data:`MODEL_LIMITS`, or when even a
    lower bound of the model's size (2 bytes per parameter) is more than this machine's memory; before any
    allocation."""
    errors = _limit_errors(config)
    if errors:
        raise ValueError(
            f"{where} describes an implausible model: {'; '.join(errors[:5])}. The limits are "
            "grpo_gym.hub.MODEL_LIMITS; pass a real model's config"
        )
    memory = physical_memory()
    needed = 2 * parameters_lower_bound(config)
    if memory is not None and needed > memory:
        raise ValueError(
            f"{where} describes a model of at least {needed / 2 / 1e9:.1f} billion parameters "
            f"({needed / 2**30:.1f} GiB in 16-bit floats), more than this machine's {memory / 2**30:.1f} GiB of "
            "memory: pass a smaller model"
        )


def check_loaded_weights(info: Mapping[str, Any], model: Any, where: str, fix: str) -> None:
    """``ValueError`` naming ``where``, how many of ``model``'s weights its source lacks (up to three by name) and
    ``fix``, when ``from_pretrained`` (``output_loading_info=True``, whose ``info`` this is) found weights missing:
    transformers starts those from random values and says so only in a log report, so a file without its tensors
    would evaluate and train as an untrained model."""
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(repr(key) for key in missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        raise ValueError(
            f"{where} lacks {len(missing)} of the model's {len(model.state_dict())} weights ({shown}): they would "
            f"keep the random values a new model starts with; {fix}"
        )
