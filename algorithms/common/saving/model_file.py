"""The model file format: plain JSON and weights, never unpickled by default.

A model zip keeps Stable-Baselines3's layout (``data``, ``policy.pth``, ``policy.optimizer.pth``,
``pytorch_variables.pth``, ``_stable_baselines3_version``, ``system_info.txt``), so SB3 tools list it, but its
``data`` entry is plain JSON that this module writes and reads itself:

- ``arguments``: the constructor arguments by name. Numbers, strings, lists and dicts as they are; schedules by
  their parameters (``{"__schedule__": "linear", "start": ..., ...}``); ``torch.optim`` classes by name
  (``{"__class__": "torch.optim.AdamW"}``); gymnasium spaces by their description.
- ``state``: what a run needs to continue exactly (see :mod:`algorithms.common.saving.run_file`); the torch RNG
  states go to ``pytorch_variables.pth`` as tensors.

A value that has no plain form (a user's own schedule function, say) is written pickled under its key, and
:func:`read_model_file` refuses such an entry, naming the key, unless the caller passes a replacement in
``custom_objects`` or ``allow_pickle=True`` (numpy's word) for a file it trusts. Every ``.pth`` entry is read with
``torch.load(weights_only=True)``. Files are written to a temporary name beside the target and renamed into
place, so a kill at any instant leaves the old complete file or the new one; a truncated or corrupt file gives
an error that says so and names the file.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import pathlib
import pickle
import re
import zipfile
import zlib
from typing import Any

import cloudpickle
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.utils import ConstantSchedule, FloatSchedule, LinearSchedule, get_system_info

from algorithms.common.saving.atomic import atomic_write
from algorithms.common.schedules import UpdateDecay
from grpo_gym.validation import read_json

#: the format of the files this version writes: a file of it holds every entry its class saves (a saved argument, a
#: run-state entry, the env record's arguments, ``ref_model.pth`` when its run keeps a reference), and one that lacks
#: any was edited or damaged (:func:`~algorithms.common.saving.checks.check_complete` refuses it). A saved argument, a
#: run-state entry or an env argument added later makes a new format (tests/test_hostile_round5_missing.py holds the
#: contents of this one), so that the files written before it read as older ones.
FORMAT = "grpo-gym/2"
#: the formats of files earlier versions wrote: what they lack (an argument added since, ...) takes its default, with a
#: warning naming it
OLDER_FORMATS = ("grpo-gym/1",)
#: the markers of described values in ``data``
PICKLED, CLASS, SPACE, SCHEDULE = "__pickled__", "__class__", "__space__", "__schedule__"
#: the extra entry of the zip that holds torch tensors other than state dicts (RNG states)
VARIABLES = "pytorch_variables.pth"


# ---------------------------------------------------------------------------------------------- values <-> JSON
def encode(value: Any) -> Any:
    """A JSON form of ``value``: plain values as they are, schedules, optimizer classes and spaces described,
    anything else pickled under :data:`PICKLED` (which :func:`decode` refuses by default)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float, np.integer, np.floating)):
        return value.item() if isinstance(value, (np.integer, np.floating)) else value
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: encode(v) for k, v in value.items()}
    schedule = _encode_schedule(value)
    if schedule is not None:
        return schedule
    if isinstance(value, type) and value.__module__.startswith("torch.optim") and hasattr(th.optim, value.__name__):
        return {CLASS: f"torch.optim.{value.__name__}"}
    if isinstance(value, spaces.Space):
        return {SPACE: space_to_json(value)}
    return {PICKLED: base64.b64encode(cloudpickle.dumps(value)).decode()}


def _encode_schedule(value: Any) -> dict[str, Any] | None:
    if isinstance(value, FloatSchedule):
        return _encode_schedule(value.value_schedule) or encode(value.value_schedule)
    if isinstance(value, ConstantSchedule):
        return {SCHEDULE: "constant", "value": value.val}
    if isinstance(value, LinearSchedule):
        return {SCHEDULE: "linear", "start": value.start, "end": value.end, "end_fraction": value.end_fraction}
    if isinstance(value, UpdateDecay):
        return {SCHEDULE: "update_decay", "start": value.start, "end": value.end, "n_updates": value.n_updates}
    return None


def decode(value: Any, key: str, allow_pickle: bool = False) -> Any:
    """The object :func:`encode` described. A pickled entry is refused with an error naming ``key`` unless
    ``allow_pickle``; a described class must be one of ``torch.optim``'s."""
    if isinstance(value, list):
        return [decode(v, f"{key}[{i}]", allow_pickle) for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    if PICKLED in value:
        if not allow_pickle:
            raise ValueError(
                f"entry {key!r} of the model file needs unpickling, which can run arbitrary code: pass "
                f"custom_objects={{{key.split('.')[0].split('[')[0]!r}: <value>}} to supply it, or allow_pickle=True "
                "only for a file you trust"
            )
        return cloudpickle.loads(base64.b64decode(value[PICKLED]))
    if set(value) == {CLASS}:
        name = str(value[CLASS]).removeprefix("torch.optim.")
        optimizer = getattr(th.optim, name, None)
        if not (isinstance(optimizer, type) and issubclass(optimizer, th.optim.Optimizer)):
            raise ValueError(f"entry {key!r}: {value[CLASS]!r} is not a torch.optim optimizer class")
        return optimizer
    if set(value) == {SPACE}:
        return space_from_json(value[SPACE])
    if SCHEDULE in value:
        return _decode_schedule(value, key)
    return {k: decode(v, f"{key}.{k}", allow_pickle) for k, v in value.items()}


def _decode_schedule(value: dict[str, Any], key: str) -> Any:
    kind = value[SCHEDULE]
    try:
        if kind == "constant":
            return float(value["value"])
        if kind == "linear":
            return LinearSchedule(float(value["start"]), float(value["end"]), float(value["end_fraction"]))
        if kind == "update_decay":
            return UpdateDecay(float(value["start"]), float(value["end"]), int(value["n_updates"]))
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"entry {key!r}: a malformed {kind!r} schedule ({error})") from None
    raise ValueError(f"entry {key!r}: unknown schedule {kind!r} (constant, linear or update_decay)")


def space_to_json(space: spaces.Space) -> dict[str, Any]:
    """A plain description of a ``Dict`` / ``Box`` / ``MultiDiscrete`` / ``Discrete`` space."""
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_to_json(s) for k, s in space.spaces.items()}}
    if isinstance(space, spaces.Box):
        low, high = space.low, space.high
        return {
            "type": "Box",
            "low": low.flat[0].item() if np.all(low == low.flat[0]) else low.tolist(),
            "high": high.flat[0].item() if np.all(high == high.flat[0]) else high.tolist(),
            "shape": list(space.shape),
            "dtype": str(space.dtype),
        }
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist(), "dtype": str(space.dtype)}
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    raise ValueError(f"cannot describe a {type(space).__name__} space (Dict, Box, MultiDiscrete, Discrete)")


#: the keys each kind of space's description has
SPACE_KEYS = {
    "Dict": {"type", "spaces"},
    "Box": {"type", "low", "high", "shape", "dtype"},
    "MultiDiscrete": {"type", "nvec", "dtype"},
    "Discrete": {"type", "n", "start"},
}
#: the most elements a described space may have (16M: far past any context window; a larger one is a damaged file
#: that would allocate its bounds before anything could say so)
MOST_SPACE_ELEMENTS = 1 << 24


def space_from_json(spec: dict[str, Any]) -> spaces.Space:
    """The space :func:`space_to_json` described; ``ValueError`` for keys it does not have or a size past
    :data:`MOST_SPACE_ELEMENTS`."""
    kind = spec.get("type")
    extra = sorted(set(spec) - SPACE_KEYS.get(kind, set(spec)))
    if extra:
        raise ValueError(f"a {kind} space has no {', '.join(map(repr, extra))}")
    if kind == "Dict":
        return spaces.Dict({k: space_from_json(s) for k, s in spec["spaces"].items()})
    if kind == "Box":
        dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
            raise TypeError(f"a Box's shape is a list of integers >= 0, got {list(shape)!r:.60}")
        if math.prod(shape) > MOST_SPACE_ELEMENTS:
            raise ValueError(f"a Box of shape {list(shape)} has more than {MOST_SPACE_ELEMENTS} elements")
        low, high = (np.broadcast_to(np.asarray(spec[k], dtype), shape) for k in ("low", "high"))
        return spaces.Box(low, high, shape, dtype)
    if kind == "MultiDiscrete":
        if not isinstance(spec["nvec"], list) or len(spec["nvec"]) > MOST_SPACE_ELEMENTS:
            raise ValueError(f"a MultiDiscrete's nvec is a list of at most {MOST_SPACE_ELEMENTS} sizes")
        return spaces.MultiDiscrete(np.asarray(spec["nvec"]), dtype=np.dtype(spec["dtype"]))
    if kind == "Discrete":
        return spaces.Discrete(int(spec["n"]), start=int(spec.get("start", 0)))
    raise ValueError(f"unknown space type {kind!r} in the model file")


# ---------------------------------------------------------------------------------------------- the zip
def write_model_file(
    path: str | os.PathLike, data: dict[str, Any], state_dicts: dict[str, Any], variables: dict[str, Any]
) -> pathlib.Path:
    """Write the model zip atomically (temporary file beside it, then renamed); ``.zip`` is added when missing."""
    path = model_file_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    import stable_baselines3

    with atomic_write(path) as handle, zipfile.ZipFile(handle, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("data", json.dumps({"format": FORMAT, **data}, indent=1))
        for name, state in state_dicts.items():
            archive.writestr(f"{name}.pth", _torch_bytes(state))
        archive.writestr(VARIABLES, _torch_bytes(variables))
        archive.writestr("_stable_baselines3_version", stable_baselines3.__version__)
        archive.writestr("system_info.txt", get_system_info(print_info=False)[1])
    return path


#: the model file inside a checkpoint folder (the command line's ``iteration_<n>/``, ``save_sharded``'s folder)
CHECKPOINT_MODEL = "model.zip"


def check_not_checkpoint_folder(path: str | os.PathLike) -> None:
    """Refuse a checkpoint folder passed where its model file belongs, naming the file to pass instead."""
    inside = pathlib.Path(path) / CHECKPOINT_MODEL
    if inside.is_file():
        raise ValueError(f"{os.fspath(path)!r} is a checkpoint folder: pass its model file, {os.fspath(inside)!r}")


def model_file_path(path: str | os.PathLike) -> pathlib.Path:
    """The file a model saved to ``path`` goes to: ``.zip`` added when missing (SB3's rule: ``save("runs/R1Zero-v0")``
    beside a folder of that name, as rl_zoo3 saves, writes ``R1Zero-v0.zip``); ``ValueError`` naming the fix for a
    name that is no file name (empty, ``.zip`` alone, hidden, a folder). The one rule :func:`write_model_file` and
    the command line's up-front check share."""
    text = os.fspath(path)
    path = pathlib.Path(text)
    if not text.strip():
        raise ValueError(f"{text!r} is empty, not a file name for a model; pass e.g. 'model.zip'")
    if text.endswith(os.sep) or path.name in ("", ".", ".."):
        raise ValueError(f"{text!r} is a folder; pass a file name such as model.zip")
    if path.suffix != ".zip":
        path = path.with_name(path.name + ".zip")
    if path.is_dir():
        raise ValueError(f"{os.fspath(path)!r} is a folder; pass a file name such as model.zip")
    if not path.stem or path.name.startswith("."):
        raise ValueError(f"{text!r} is not a file name for a model; pass e.g. 'model.zip'")
    return path


def read_model_file(
    path: str | os.PathLike | io.BufferedIOBase, device: th.device | str = "cpu"
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(data, state_dicts, variables)`` of a model zip written by :func:`write_model_file`, read safely: every
    entry's size is checked before it is read (:func:`check_entry_sizes`), ``data`` is parsed as JSON (pickled
    entries stay encoded until :func:`decode`), tensors with ``weights_only=True``; ``ValueError`` naming the file
    and the entry otherwise."""
    name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else "<file object>"
    if isinstance(path, (str, os.PathLike)):
        path = pathlib.Path(path)
        if not path.exists() and path.with_name(path.name + ".zip").exists():
            path = path.with_name(path.name + ".zip")
        check_not_checkpoint_folder(path)
        if path.is_dir():
            raise ValueError(f"{name!r} is a folder, not a model file; pass the .zip that model.save() wrote")
        if not path.is_file():
            raise ValueError(f"no model file at {name!r}")
    try:
        with zipfile.ZipFile(path) as archive:
            check_entry_sizes(archive.infolist(), name)
            names = archive.namelist()
            if "data" not in names:
                raise ValueError(f"{name} is not a grpo-gym model file: it has no 'data' entry")
            data = read_json(
                archive.read("data"), f"{name}: its 'data' entry", fix="the file is damaged or not a model"
            )
            tensors = {
                entry.removesuffix(".pth"): _read_weights(archive, entry, name, device)
                for entry in names
                if entry.endswith(".pth")
            }
    except (zipfile.BadZipFile, EOFError, zlib.error) as error:
        raise ValueError(
            f"{name} is truncated or corrupt (not a complete zip file: {error}); use another save"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(
            f"{name}: its 'data' entry holds a JSON {type(data).__name__}, not the object a model file records "
            "(format, arguments, state); the file is damaged or not a model: use another save"
        )
    if "format" not in data and not any(isinstance(value, dict) and ":serialized:" in value for value in data.values()):
        raise ValueError(
            f"{name}: its 'data' entry has no 'format' field (a grpo-gym model file records {FORMAT!r}); the file is "
            "damaged or not a model: use another save"
        )
    if data.get("format") not in (FORMAT, *OLDER_FORMATS):
        found = data.get("format")
        raise ValueError(
            f"{name} was not written by this version of grpo-gym (format {found!r}, expected {FORMAT!r}); "
            "models saved by Stable-Baselines3's own save() are not read, because their data is pickled"
        )
    variables = tensors.pop(VARIABLES.removesuffix(".pth"), {}) or {}
    return data, tensors, variables


#: the largest ``data`` entry read (JSON: arguments, run state, env record; a real one is kilobytes)
MAX_DATA_BYTES = 64 * 2**20


def memory_bytes() -> int:
    """This machine's physical memory (what a model file's weights must fit in to be loaded at all)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system: no limit known
        return 2**62


def check_entry_sizes(entries: list[zipfile.ZipInfo], name: str) -> None:
    """Refuse a zip whose entries declare more than can be read: ``data`` over :data:`MAX_DATA_BYTES`, or weights
    (every ``.pth`` together) over this machine's memory; nothing is decompressed first. (A zip that lies about
    its sizes fails its CRC check while being read.)"""
    for entry in entries:
        if entry.filename == "data" and entry.file_size > MAX_DATA_BYTES:
            raise ValueError(
                f"{name}: its 'data' entry expands to {entry.file_size:,} bytes (a model file's is kilobytes; "
                f"at most {MAX_DATA_BYTES:,} are read): refused, the file is not a grpo-gym model"
            )
    weights = sum(entry.file_size for entry in entries if entry.filename.endswith(".pth"))
    if weights > memory_bytes():
        raise ValueError(
            f"{name}: its weights expand to {weights:,} bytes, more than this machine's memory "
            f"({memory_bytes():,} bytes); refused before reading"
        )


def _read_weights(archive: zipfile.ZipFile, entry: str, name: str, device: th.device | str) -> Any:
    """One ``.pth`` entry, tensors only (``weights_only=True``); ``ValueError`` naming the entry otherwise."""
    try:
        return th.load(io.BytesIO(archive.read(entry)), map_location=device, weights_only=True)
    except pickle.UnpicklingError as error:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(error))
        what = f"it would call {found.group(1)}" if found else "not plain tensors"
        raise ValueError(
            f"{name}: entry {entry!r} holds pickled objects ({what}); refused: a model file holds only weights, "
            "and grpo-gym never unpickles one"
        ) from None
    except (RuntimeError, EOFError, ValueError, KeyError, TypeError) as error:  # a damaged entry
        raise ValueError(
            f"{name}: entry {entry!r} could not be read as weights ({type(error).__name__}: {error})"
        ) from None


def _torch_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    th.save(value, buffer)
    return buffer.getvalue()
