"""The file of a :class:`~algorithms.common.replay.trajectory_buffer.PrioritizedTrajectoryBuffer`: one ``.npz``,
checked. This module works on the plain data the buffer hands it (``state_arrays()``: a JSON header and arrays);
it never touches a buffer.

:func:`write_buffer_file` writes one ``np.savez`` archive (no pickle): the written part of every array and a JSON
header (``meta``) of the settings, the ring's pointers, the sampler's counters and RNG state. A path is written
atomically (:func:`algorithms.common.saving.atomic.atomic_write`): a kill mid-save leaves the previous file.

:func:`read_buffer_file` reads an archive, :func:`check_settings` its settings (before the buffer is built from
them) and :func:`check_buffer_state` everything else, before anything is loaded. A file that is not a readable
archive (truncated, not a zip, a failed CRC, pickled members) raises ``ValueError`` saying it is truncated or
corrupt and naming the file; so does any inconsistency, naming what is wrong: unknown or missing arrays or
settings; wrong dtypes or shapes; ring pointers out of range; live trajectories outside the arena, overlapping, or
not adding up to the recorded token count; token ids outside ``[0, vocab_size)`` (or negative when no vocabulary
is given); non-finite log-probs, rewards or timestamps; priorities or masses negative or non-finite; masses that
are not ``priority ** alpha * boost`` (0 for slots holding nothing); a sampler count that is not the number of
positive masses; iterations not non-decreasing from oldest to newest; a bad RNG state.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

from algorithms.common.saving.atomic import atomic_write
from grpo_gym.validation import check_float, check_int, check_mapping

FORMAT = "grpo-gym-prioritized-trajectory-buffer/1"
SETTINGS = (
    "capacity",
    "max_tokens",
    "alpha",
    "beta",
    "beta_end",
    "beta_steps",
    "high_reward_threshold",
    "high_reward_boost",
    "reward_range",
    "pad_id",
)
_RING = ("_pos", "_size", "_head", "_used", "_high", "n_added")
_META = ("format", "settings", "ring", "sampler", "reward_min", "reward_max", "max_priority", "last_iteration")
_CHUNK_WORDS = 1 << 22
_ARRAYS = {
    "arena": np.int32,
    "offset": np.int64,
    "plen": np.int32,
    "clen": np.int32,
    "priority": np.float64,
    "mass": np.float64,
}
Target = str | os.PathLike[str] | IO[bytes]


def file_name(path: Target) -> str:
    """How errors name ``path``."""
    return os.fspath(path) if isinstance(path, (str, os.PathLike)) else getattr(path, "name", "<stream>")


def write_buffer_file(path: Target, meta: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    """Write a buffer's ``state_arrays()`` to ``path`` (atomically when it is a path; as is to an open binary file)."""
    contents = {**arrays, "meta": np.array(json.dumps({"format": FORMAT, **meta}))}
    if isinstance(path, (str, os.PathLike)):
        with atomic_write(path) as handle:
            np.savez(handle, **contents)
    else:
        np.savez(path, **contents)


def read_buffer_file(path: Target) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The header and arrays of a file written by :func:`write_buffer_file`, unchecked but for being a readable
    archive of this format (``ValueError`` naming the file otherwise)."""
    where = file_name(path)
    if isinstance(path, (str, os.PathLike)) and not Path(path).is_file():
        raise ValueError(f"no replay-buffer file at {where!r}")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
        meta = json.loads(str(arrays.pop("meta")))
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile, zlib.error) as error:
        raise ValueError(
            f"{where}: not a readable replay-buffer file: truncated or corrupt ({type(error).__name__}: {error})"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(
            f"{where}: invalid replay-buffer file: not a saved PrioritizedTrajectoryBuffer (format {found!r})"
        )
    return meta, arrays


def check_settings(meta: dict[str, Any]) -> dict[str, Any]:
    """The buffer's constructor arguments from the header (every one present, no other key)."""
    _check_complete("meta", check_mapping("meta", meta, _META), _META)
    settings = check_mapping("settings", meta["settings"], SETTINGS, allow_none=False)
    _check_complete("settings", settings, SETTINGS)
    reward_range = settings["reward_range"]
    return {**settings, "reward_range": None if reward_range is None else tuple(reward_range)}


def check_buffer_state(
    meta: dict[str, Any],
    arrays: dict[str, np.ndarray],
    field_dtypes: Mapping[str, Any],
    bit_generator: str,
    vocab_size: int | None,
) -> None:
    """Check the header and arrays against the settings they record (see the module docstring); ``field_dtypes``
    are the ring's per-trajectory fields, ``bit_generator`` the sampler RNG's kind."""
    settings = meta["settings"]
    capacity, max_tokens = int(settings["capacity"]), int(settings["max_tokens"])
    ring = check_mapping("ring", meta["ring"], _RING, allow_none=False)
    _check_complete("ring", ring, _RING)
    pointers = {k: check_int(f"ring.{k}", v, low=0) for k, v in ring.items()}
    written = min(pointers["n_added"], capacity)
    _check_arrays(arrays, written, pointers["_high"], field_dtypes)
    _check_pointers(pointers, capacity, max_tokens)
    live = (pointers["_pos"] - pointers["_size"] + np.arange(pointers["_size"])) % capacity  # oldest first
    _check_trajectories(arrays, live, pointers, vocab_size)
    _check_fields(arrays, live, float(settings["high_reward_threshold"]))
    count = _check_masses(arrays, live, written, float(settings["alpha"]), float(settings["high_reward_boost"]))
    _check_sampler(meta["sampler"], count, bit_generator)
    check_float("reward_min", meta["reward_min"], allow_inf=True)
    check_float("reward_max", meta["reward_max"], allow_inf=True)
    check_float("max_priority", meta["max_priority"], low=0.0)
    check_int("last_iteration", meta["last_iteration"])


def _check_complete(name: str, found: Mapping[str, Any], keys: tuple[str, ...]) -> None:
    """Every key of a header part there (a default in its place would load another buffer than the one saved)."""
    missing = [key for key in keys if key not in found]
    if missing:
        raise ValueError(
            f"{name}: missing {missing}, which every saved buffer records: the file was edited or damaged; use "
            "another save"
        )


def _check_arrays(arrays: dict[str, np.ndarray], written: int, high: int, field_dtypes: Mapping[str, Any]) -> None:
    """Exactly the expected arrays, each 1-D with its dtype and length."""
    expected = {**_ARRAYS, **{f"field_{k}": np.dtype(v) for k, v in field_dtypes.items()}}
    if arrays.keys() != expected.keys():
        missing, extra = sorted(expected.keys() - arrays.keys()), sorted(arrays.keys() - expected.keys())
        raise ValueError(f"arrays: missing {missing}, unexpected {extra}")
    for name, dtype in expected.items():
        length = high if name == "arena" else written
        array = arrays[name]
        if array.dtype != np.dtype(dtype) or array.shape != (length,):
            raise ValueError(
                f"array {name!r} must be {np.dtype(dtype)} of shape ({length},), got {array.dtype} {array.shape}"
            )


def _check_pointers(p: dict[str, int], capacity: int, max_tokens: int) -> None:
    if not (p["_pos"] < capacity and p["_size"] <= min(capacity, p["n_added"])):
        raise ValueError(f"ring pointers out of range: _pos={p['_pos']}, _size={p['_size']}, n_added={p['n_added']}")
    if not (p["_head"] <= p["_high"] <= max_tokens and p["_used"] <= p["_high"]):
        raise ValueError(f"arena pointers out of range: {p} with max_tokens={max_tokens}")


def _check_trajectories(arrays: dict[str, np.ndarray], live: np.ndarray, p: dict[str, int], vocab: int | None) -> None:
    """Live trajectories lie inside the arena without overlap, add up to ``_used``, with valid ids and log-probs."""
    offset, plen, clen = arrays["offset"][live], arrays["plen"][live].astype(np.int64), arrays["clen"][live]
    clen = clen.astype(np.int64)
    size = plen + 2 * clen
    if len(live) and (plen.min() < 0 or clen.min() < 0 or size.min() < 1 or offset.min() < 0):
        raise ValueError("a live trajectory has a negative offset or length, or no tokens")
    if len(live) and (offset + size).max() > p["_high"]:
        raise ValueError("a live trajectory lies beyond the written arena")
    if int(size.sum()) != p["_used"]:
        raise ValueError(f"the live trajectories hold {int(size.sum())} arena words, but ring._used is {p['_used']}")
    if len(live) and int(offset[-1] + size[-1]) != p["_head"]:
        raise ValueError("ring._head is not the end of the newest trajectory")
    order = np.argsort(offset, kind="stable")
    if len(order) > 1 and (offset[order[:-1]] + size[order[:-1]] > offset[order[1:]]).any():
        raise ValueError("live trajectories overlap in the arena")
    arena, ends, start = arrays["arena"], np.cumsum(size), 0
    while start < len(live):  # in chunks of about _CHUNK_WORDS arena words: memory stays bounded
        stop = max(start + 1, int(np.searchsorted(ends, ends[start] - size[start] + _CHUNK_WORDS, side="right")))
        part = slice(start, stop)
        ids = arena[_ranges(offset[part], plen[part] + clen[part])]
        if ids.size and (ids.min() < 0 or (vocab is not None and ids.max() >= vocab)):
            wanted = f"in [0, {vocab}) (the policy's vocabulary)" if vocab is not None else ">= 0"
            raise ValueError(f"token ids must be {wanted}, found {ids.min()}..{ids.max()}")
        if not np.isfinite(arena[_ranges(offset[part] + plen[part] + clen[part], clen[part])].view(np.float32)).all():
            raise ValueError("a stored log-prob is NaN or infinite")
        start = stop


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenated index ranges ``[starts[i], starts[i] + lengths[i])``."""
    total = int(lengths.sum())
    first = np.cumsum(lengths) - lengths  # where each range begins in the output
    return np.repeat(starts - first, lengths) + np.arange(total)


def _check_fields(arrays: dict[str, np.ndarray], live: np.ndarray, high_reward_threshold: float) -> None:
    reward, raw = arrays["field_reward"][live], arrays["field_raw_reward"][live]
    if not (np.isfinite(raw).all() and np.isfinite(reward).all() and np.abs(reward).max(initial=0) <= 1):
        raise ValueError("rewards must be finite, and normalised rewards in [-1, 1]")
    if np.isinf(arrays["field_advantage"][live]).any() or not np.isfinite(arrays["field_timestamp"][live]).all():
        raise ValueError("advantages must be finite or NaN, timestamps finite")
    if (np.diff(arrays["field_iteration"][live]) < 0).any():
        raise ValueError("collection iterations must be non-decreasing from the oldest trajectory to the newest")
    if (arrays["field_high"][live] != (reward >= high_reward_threshold)).any():
        raise ValueError("the high-reward flags do not match the rewards and high_reward_threshold")


def _check_masses(arrays: dict[str, np.ndarray], live: np.ndarray, written: int, alpha: float, boost: float) -> int:
    """Priorities and masses finite and >= 0; masses equal ``priority ** alpha * boost`` (0 off the live slots).
    Returns the number of positive masses."""
    priority, mass = arrays["priority"], arrays["mass"]
    if not (np.isfinite(priority).all() and np.isfinite(mass).all()):
        raise ValueError("priorities and masses must be finite (found NaN or inf)")
    if (priority < 0).any() or (mass < 0).any():
        raise ValueError("priorities and masses must be >= 0 (found a negative one)")
    expected = np.zeros(written)
    pri = priority[live]
    with np.errstate(over="ignore"):
        expected[live] = (pri**alpha if alpha else (pri > 0).astype(np.float64)) * np.where(
            arrays["field_high"][live], boost, 1.0
        )
    if not np.allclose(mass, expected, rtol=1e-9, atol=0.0):
        raise ValueError("the masses are not priority ** alpha * boost of the live trajectories (0 elsewhere)")
    return int(np.count_nonzero(mass))


def _check_sampler(state: Any, count: int, bit_generator: str) -> None:
    state = check_mapping("sampler", state, ("n_calls", "count", "rng"), allow_none=False)
    _check_complete("sampler", state, ("n_calls", "count", "rng"))
    if check_int("sampler.count", state.get("count"), low=0) != count:
        raise ValueError(f"sampler.count is {state.get('count')}, but {count} masses are positive")
    check_int("sampler.n_calls", state.get("n_calls"), low=0)
    rng_state = state.get("rng")
    if not isinstance(rng_state, dict) or rng_state.get("bit_generator") != bit_generator:
        raise ValueError(f"sampler.rng must be a {bit_generator} state")
