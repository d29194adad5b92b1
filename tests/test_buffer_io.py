"""algorithms/common/saving/buffer_file.py: replay-buffer files are checked on load and written atomically."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from algorithms.common.replay.trajectory_buffer import PrioritizedTrajectoryBuffer

VOCAB = 1000


def filled(n: int = 8, seed: int = 0, **kwargs) -> PrioritizedTrajectoryBuffer:
    """A buffer of ``n`` trajectories with token ids in [3, 500), some high-reward, wrapped once (capacity 6)."""
    buffer = PrioritizedTrajectoryBuffer(capacity=6, max_tokens=200, seed=seed, **kwargs)
    rng = np.random.default_rng(seed)
    for i in range(n):
        buffer.add(
            rng.integers(3, 500, 2 + i % 3), rng.integers(3, 500, 3), -rng.random(3),
            reward=float(rng.uniform(-1, 1)), group_id=i // 2, iteration=i, priority=float(rng.random()) + 0.1,
        )  # fmt: skip
    buffer.sample_batch(2)
    return buffer


def tampered(tmp_path: Path, change: Callable[[dict, dict], None]) -> Path:
    """Save a good buffer, change its arrays / JSON header with ``change``, and write it back."""
    good = tmp_path / "good.npz"
    filled().save(good)
    with np.load(good) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays["meta"]))
    change(arrays, meta)
    arrays["meta"] = np.array(json.dumps(meta))
    path = tmp_path / "bad.npz"
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def live_slot(meta: dict) -> int:
    return (meta["ring"]["_pos"] - 1) % meta["settings"]["capacity"]  # the newest trajectory


def set_at(name: str, index: Callable[[dict], int], value: float) -> Callable[[dict, dict], None]:
    def change(arrays: dict, meta: dict) -> None:
        arrays[name] = arrays[name].copy()
        arrays[name][index(meta)] = value

    return change


def first_completion_word(offset_of_logp: bool) -> Callable[[dict, dict], None]:
    """Overwrite the newest trajectory's first completion id (or first log-prob's bits)."""

    def change(arrays: dict, meta: dict) -> None:
        slot = live_slot(meta)
        at = arrays["offset"][slot] + arrays["plen"][slot] + (arrays["clen"][slot] if offset_of_logp else 0)
        arrays["arena"] = arrays["arena"].copy()
        arrays["arena"][at] = np.array(np.nan, dtype=np.float32).view(np.int32) if offset_of_logp else VOCAB + 5

    return change


def meta_set(keys: tuple[str, ...], value: object) -> Callable[[dict, dict], None]:
    def change(arrays: dict, meta: dict) -> None:
        target = meta
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return change


def forget_the_oldest(arrays: dict, meta: dict) -> None:
    """Drop the oldest trajectory from the ring's pointers only: its slot keeps a mass."""
    ring = meta["ring"]
    oldest = (ring["_pos"] - ring["_size"]) % meta["settings"]["capacity"]
    ring["_size"] -= 1
    ring["_used"] -= int(arrays["plen"][oldest]) + 2 * int(arrays["clen"][oldest])


def overlap(arrays: dict, meta: dict) -> None:
    """Point the second-newest trajectory at the newest one's words (lengths kept, so counts still add up)."""
    newest = live_slot(meta)
    second = (newest - 1) % meta["settings"]["capacity"]
    arrays["offset"] = arrays["offset"].copy()
    arrays["offset"][second] = arrays["offset"][newest]


CORRUPTIONS = {
    "negative mass": (set_at("mass", live_slot, -1.0), "masses must be >= 0"),
    "NaN mass": (set_at("mass", live_slot, np.nan), "must be finite"),
    "mass not priority**alpha": (set_at("mass", live_slot, 123.0), r"not priority \*\* alpha \* boost"),
    "mass on an empty slot": (forget_the_oldest, r"not priority \*\* alpha \* boost"),
    "negative priority": (set_at("priority", live_slot, -0.5), "must be >= 0"),
    "inf priority": (set_at("priority", live_slot, np.inf), "must be finite"),
    "id outside vocabulary": (first_completion_word(False), r"token ids must be in \[0, 1000\)"),
    "NaN log-prob": (first_completion_word(True), "log-prob is NaN"),
    "offset beyond arena": (set_at("offset", live_slot, 10_000), "beyond the written arena"),
    "overlapping trajectories": (overlap, "live trajectories overlap"),
    "reward out of range": (set_at("field_reward", live_slot, 3.0), r"normalised rewards in \[-1, 1\]"),
    "inf advantage": (set_at("field_advantage", live_slot, np.inf), "advantages must be finite or NaN"),
    "iterations decreasing": (set_at("field_iteration", live_slot, -7), "non-decreasing"),
    "wrong high flag": (set_at("field_high", live_slot, True), "high-reward flags"),
    "count inconsistent": (meta_set(("sampler", "count"), 99), "sampler.count is 99"),
    "negative n_calls": (meta_set(("sampler", "n_calls"), -1), r"sampler\.n_calls must be an integer >= 0"),
    "bad rng": (meta_set(("sampler", "rng"), {"bit_generator": "MT19937"}), "PCG64 state"),
    "size beyond capacity": (meta_set(("ring", "_size"), 99), "ring pointers out of range"),
    "used count wrong": (meta_set(("ring", "_used"), 1), "ring._used is 1"),
    "fractional pointer": (meta_set(("ring", "_pos"), 2.5), r"ring\._pos must be an integer"),
    "unknown setting": (meta_set(("settings", "evil"), 1), "settings: unknown key 'evil'"),
    "NaN alpha": (meta_set(("settings", "alpha"), float("nan")), "alpha must be a finite number"),
    "NaN max_priority": (meta_set(("max_priority",), float("nan")), "max_priority must be a finite number"),
    "huge capacity": (meta_set(("settings", "max_tokens"), 2**60), "cannot allocate|max_tokens"),
    "float arena": (lambda a, m: a.update(arena=a["arena"].astype(np.float64)), "'arena' must be int32"),
    "short offsets": (lambda a, m: a.update(offset=a["offset"][:2]), "'offset' must be int64 of shape"),
    "2-D masses": (lambda a, m: a.update(mass=a["mass"][:, None]), "'mass' must be float64 of shape"),
    "missing array": (lambda a, m: a.pop("priority"), r"missing \['priority'\]"),
    "extra array": (lambda a, m: a.update(payload=np.zeros(3)), r"unexpected \['payload'\]"),
    "other format": (meta_set(("format",), "other"), "not a saved PrioritizedTrajectoryBuffer"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_every_inconsistency_is_refused_naming_the_file(tmp_path: Path, case: str) -> None:
    change, message = CORRUPTIONS[case]
    path = tampered(tmp_path, change)
    with pytest.raises(ValueError, match=message) as info:
        PrioritizedTrajectoryBuffer.load(path, vocab_size=VOCAB)
    assert str(info.value).startswith(f"{path}: ")


@pytest.mark.parametrize(
    "damage",
    [lambda b: b[: len(b) // 2], lambda b: b[:-10], lambda b: b"", lambda b: b[:300] + bytes(40) + b[340:]],
    ids=["half", "last-10-bytes", "empty", "zeroed-bytes"],
)
def test_truncated_or_corrupt_files_say_so(tmp_path: Path, damage: Callable[[bytes], bytes]) -> None:
    path = tmp_path / "replay.npz"
    filled().save(path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=rf"^{path}: not a readable replay-buffer file: truncated or corrupt"):
        PrioritizedTrajectoryBuffer.load(path)
    with pytest.raises(ValueError, match="no replay-buffer file at"):
        PrioritizedTrajectoryBuffer.load(tmp_path / "absent.npz")


def test_vocab_size_bounds_the_token_ids(tmp_path: Path) -> None:
    path = tmp_path / "replay.npz"
    filled().save(path)
    assert len(PrioritizedTrajectoryBuffer.load(path, vocab_size=500)) == 6  # ids are < 500
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 300\)"):
        PrioritizedTrajectoryBuffer.load(path, vocab_size=300)
    with pytest.raises(ValueError, match="vocab_size must be an integer >= 1"):
        PrioritizedTrajectoryBuffer.load(path, vocab_size=0)


def test_loaded_buffers_sample_like_the_saved_one_with_alpha_zero_and_boost(tmp_path: Path) -> None:
    for kwargs in ({"alpha": 0.0}, {"high_reward_threshold": -1.0}, {"reward_range": None}):
        buffer = filled(**kwargs)
        buffer.evict_older_than(4)  # empty slots keep mass 0
        buffer.save(tmp_path / "r.npz")
        loaded = PrioritizedTrajectoryBuffer.load(tmp_path / "r.npz", vocab_size=VOCAB)
        np.testing.assert_array_equal(loaded.sample_batch(3).indices, buffer.sample_batch(3).indices)


# ---------------------------------------------------------------- kill -9 during saves


def big_buffer() -> PrioritizedTrajectoryBuffer:
    """~3 MB on disk, so a save takes long enough for kills to land in the middle of it."""
    buffer = PrioritizedTrajectoryBuffer(capacity=4096, max_tokens=1 << 20, seed=0)
    rng = np.random.default_rng(0)
    n, t, c = 2048, 200, 64
    buffer.add_batch(
        rng.integers(3, 500, (n, t)), np.ones((n, t)), rng.integers(3, 500, (n, c)), np.ones((n, c)),
        -rng.random((n, c)), rewards=rng.uniform(-1, 1, n), group_ids=np.arange(n) // 8, iteration=0,
    )  # fmt: skip
    return buffer


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_kill_9_during_repeated_saves_always_leaves_a_loadable_file(tmp_path: Path) -> None:
    buffer = big_buffer()
    path = tmp_path / "replay.npz"
    buffer.save(path)  # version 0
    rng = random.Random(0)
    versions = set()
    for _ in range(30):
        ready_read, ready_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: save new versions in a loop until killed
            try:
                os.close(ready_read)
                k = 0
                while True:
                    k += 1
                    buffer.update_priorities(np.arange(2048), float(k))  # each save holds version k everywhere
                    buffer.save(path)
                    if k == 1:
                        os.write(ready_write, b"1")
            finally:
                os._exit(0)
        os.close(ready_write)
        os.read(ready_read, 1)  # one save is done: the next ones run while we wait a random instant
        os.close(ready_read)
        time.sleep(rng.uniform(0.0, 0.15))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        loaded = PrioritizedTrajectoryBuffer.load(path, vocab_size=500)  # always complete and consistent
        priorities = loaded.sampler.priorities(np.arange(2048))
        assert (priorities == priorities[0]).all() and len(loaded) == 2048
        versions.add(float(priorities[0]))
    assert len(versions) > 1  # the kills landed at different points of the save loop
    buffer.save(path)  # a later save cleans up the temporary files of the killed processes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replay.npz"]


def test_save_to_an_open_stream_and_failed_save_keeps_the_old_file(tmp_path: Path, monkeypatch) -> None:
    import io

    stream = io.BytesIO()
    filled().save(stream)
    stream.seek(0)
    assert len(PrioritizedTrajectoryBuffer.load(stream)) == 6
    path = tmp_path / "replay.npz"
    filled(seed=1).save(path)
    before = path.read_bytes()

    def broken_savez(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken_savez)
    with pytest.raises(OSError, match="disk full"):
        filled(seed=2).save(path)
    # the old file is untouched and the temporary file was removed
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["replay.npz"]
