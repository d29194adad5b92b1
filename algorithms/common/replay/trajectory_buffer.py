"""Replay buffer of GRPO trajectories with prioritized sampling, numpy only.

- :class:`PrioritizedTrajectoryBuffer`: reward normalisation into [-1, 1] on ingest, the 3x sampling boost of
  high-reward trajectories, ``sample_batch``, priority updates, staleness eviction, ``save`` / ``load``.
- :class:`TrajectoryBatch`: what ``sample_batch`` returns, with the arrays of a GRPO ``RolloutBatch``.
- Its parts, re-exported here: :class:`RingBuffer` (``ring_buffer.py``: FIFO store of variable-length trajectories
  in one flat token arena, bounded by a slot capacity and a token budget) and :class:`PrioritySampler`
  (``sum_tree.py``: proportional prioritized sampling on a flat-array sum tree with annealed importance weights).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
from numpy.typing import ArrayLike

from algorithms.common.replay.ring_buffer import RingBuffer
from algorithms.common.replay.sum_tree import PrioritySampler
from algorithms.common.saving import buffer_file
from grpo_gym.validation import check_int

__all__ = ["PrioritizedTrajectoryBuffer", "PrioritySampler", "RingBuffer", "TrajectoryBatch"]


#: the batch's fields after ``indices`` and ``weights``, each read from the ring's array of the name it maps to
BATCH_FIELDS = {
    "prompt_ids": "prompt_ids", "prompt_mask": "prompt_mask", "completion_ids": "completion_ids",
    "completion_mask": "completion_mask", "old_log_probs": "log_probs", "rewards": "reward",
    "raw_rewards": "raw_reward", "advantages": "advantage", "group_ids": "group_id", "iterations": "iteration",
    "timestamps": "timestamp", "high": "high",
}  # fmt: skip


@dataclass
class TrajectoryBatch:
    """Trajectories read from a :class:`PrioritizedTrajectoryBuffer`; every array has first dimension ``B``.

    :param indices: ``(B,)`` buffer slots (pass them back to ``update_priorities``)
    :param weights: ``(B,)`` importance-sampling weights in ``(0, 1]`` (1 for :meth:`~PrioritizedTrajectoryBuffer.get`)
    :param prompt_ids: ``(B, T)`` int64, left-padded (newest token last)
    :param prompt_mask: ``(B, T)`` int64
    :param completion_ids: ``(B, C)`` int64, right-padded
    :param completion_mask: ``(B, C)`` bool, True on the completion's tokens
    :param old_log_probs: ``(B, C)`` float32 log-probs at sampling time, 0 in padding
    :param rewards: ``(B,)`` float32 rewards normalised into [-1, 1] on ingest
    :param raw_rewards: ``(B,)`` float32 rewards as given
    :param advantages: ``(B,)`` float32 advantages given at ingest (NaN where none was given)
    :param group_ids: ``(B,)`` int64 group of each trajectory (completions of one prompt share it)
    :param iterations: ``(B,)`` int64 training iteration that collected each trajectory
    :param timestamps: ``(B,)`` float64 wall-clock time (``time.time()``) of collection
    :param high: ``(B,)`` bool, whether the trajectory got the high-reward sampling boost
    """

    indices: np.ndarray
    weights: np.ndarray
    prompt_ids: np.ndarray
    prompt_mask: np.ndarray
    completion_ids: np.ndarray
    completion_mask: np.ndarray
    old_log_probs: np.ndarray
    rewards: np.ndarray
    raw_rewards: np.ndarray
    advantages: np.ndarray
    group_ids: np.ndarray
    iterations: np.ndarray
    timestamps: np.ndarray
    high: np.ndarray

    def __len__(self) -> int:
        return len(self.indices)

    def rollout_arrays(self, advantages: ArrayLike | None = None) -> dict[str, np.ndarray]:
        """The arrays of ``algorithms.common.rollout.batch.RolloutBatch`` (same names, shapes and dtypes), as numpy.

        ``advantages`` replaces the stored ones (e.g. recomputed within each group); ``returns`` are the raw rewards.
        Build the batch with ``RolloutBatch(**{k: torch.from_numpy(v) for k, v in batch.rollout_arrays().items()})``.
        """
        adv = self.advantages if advantages is None else np.asarray(advantages, dtype=np.float32).reshape(-1)
        if adv.shape != self.indices.shape or not np.isfinite(adv).all():
            raise ValueError(f"need {len(self)} finite advantages (stored ones are NaN where none was given)")
        return {
            "prompt_ids": self.prompt_ids,
            "prompt_mask": self.prompt_mask,
            "completion_ids": self.completion_ids,
            "completion_mask": self.completion_mask,
            "old_log_probs": self.old_log_probs,
            "advantages": adv,
            "returns": self.raw_rewards,
            "groups": self.group_ids,
        }


_FIELDS = {
    "reward": np.float32,
    "raw_reward": np.float32,
    "advantage": np.float32,
    "group_id": np.int64,
    "iteration": np.int64,
    "timestamp": np.float64,
    "high": np.bool_,
}


class PrioritizedTrajectoryBuffer:
    """Replay buffer of GRPO trajectories with prioritized sampling (high-reward trajectories 3x as likely).

    Ingest: each reward is normalised into [-1, 1] (``reward_range=(lo, hi)``: ``clip(2 (r - lo) / (hi - lo) - 1,
    -1, 1)``, the identity plus clipping for the env's default range (-1, 1); ``reward_range=None``: the same with
    the running min and max of every reward ingested so far, 0 while they are equal; stored values are not
    rescaled later). A trajectory is **high-reward** when its normalised reward is ``>= high_reward_threshold``;
    its sampling mass is multiplied by ``high_reward_boost`` (the original design's 3), so with equal priorities it is
    drawn exactly 3x as often as another (the boost multiplies ``p ** alpha``; it is not raised to ``alpha``).

    Priorities: a new trajectory gets ``priority`` if given, else the largest priority set so far (1.0 at first),
    as in Schaul et al. (2016), so it is likely drawn soon; :meth:`update_priorities` changes them (e.g. to
    ``|advantage| + eps``). Sampling is proportional to ``priority ** alpha * boost``, i.i.d. **with replacement**;
    see :class:`PrioritySampler` for the importance weights and the ``beta`` anneal.

    Staleness: collection iterations must be non-decreasing in insertion order, so the oldest trajectories are the
    stalest and :meth:`evict_older_than` drops every trajectory collected before an iteration (``max_replay_age``:
    ``evict_older_than(iteration - max_replay_age)`` before sampling). It evicts; it does not mask.

    Memory: a trajectory with ``P`` prompt and ``C`` completion tokens takes ``4 (P + 2C)`` bytes of the token arena
    (e.g. 1,024 bytes for P = 128, C = 64); every slot costs 61 bytes (slot table 16, fields 37, priority 8) and
    every tree leaf 32 (sum and min trees, inner nodes included; leaves = capacity rounded up to a power of two).
    Everything is allocated at construction and bounded: :attr:`nbytes` = ``4 max_tokens + 61 capacity + 32
    leaves``, i.e. 512 MiB of tokens by default plus 94.6 MB at capacity 1e6. The token budget, not the capacity,
    bounds a buffer of long trajectories: when the arena is full the oldest trajectories are evicted (see
    :class:`RingBuffer`).

    Save / load: :meth:`save` writes one ``.npz`` (``np.savez``, no pickle), atomically, with the written part of
    every array and a JSON header of the settings, the ring's pointers and the RNG state; :meth:`load` checks every
    array and pointer (shapes, dtypes, finite non-negative priorities and masses, token ids in the vocabulary,
    consistent counts) and rebuilds the trees from their leaves, so a loaded buffer samples exactly what the saved
    one would have (see :mod:`algorithms.common.saving.buffer_file`).

    Indices returned by :meth:`sample_batch` name slots: update their priorities before adding more trajectories,
    which may overwrite them.

    :param capacity: maximum number of trajectories held (the original design's 1e6)
    :param max_tokens: token budget: arena size in 4-byte words (a prompt token takes one, a completion token two)
    :param alpha: prioritization exponent (the original design's 0.6)
    :param beta: importance-sampling exponent at the start of the anneal
    :param beta_end: importance-sampling exponent at the end of the anneal
    :param beta_steps: number of ``sample_batch`` calls over which beta anneals linearly
    :param high_reward_threshold: normalised reward at or above which a trajectory is high-reward
    :param high_reward_boost: sampling-mass multiplier of high-reward trajectories (the original design's 3)
    :param reward_range: ``(lo, hi)`` mapped onto [-1, 1], or None for the running min and max
    :param pad_id: the id written into padding of sampled batches
    :param seed: seed of the sampling RNG
    """

    def __init__(
        self,
        capacity: int = 1_000_000,
        max_tokens: int = 2**27,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_end: float = 1.0,
        beta_steps: int = 10_000,
        high_reward_threshold: float = 0.5,
        high_reward_boost: float = 3.0,
        reward_range: tuple[float, float] | None = (-1.0, 1.0),
        pad_id: int = 0,
        seed: int | None = None,
    ) -> None:
        if reward_range is not None and not (np.isfinite(reward_range).all() and reward_range[0] < reward_range[1]):
            raise ValueError(f"reward_range must be finite (lo, hi) with lo < hi, or None; got {reward_range}")
        if not (np.isfinite(high_reward_boost) and high_reward_boost > 0):
            raise ValueError(f"high_reward_boost must be finite and > 0, got {high_reward_boost}")
        self.ring = RingBuffer(capacity, max_tokens, _FIELDS, pad_id)
        self.sampler = PrioritySampler(capacity, alpha, beta, beta_end, beta_steps, seed)
        self.high_reward_threshold, self.high_reward_boost = float(high_reward_threshold), float(high_reward_boost)
        self.reward_range = None if reward_range is None else (float(reward_range[0]), float(reward_range[1]))
        self.reward_min, self.reward_max = np.inf, -np.inf  # over every reward ingested
        self.max_priority = 1.0
        self.last_iteration = np.iinfo(np.int64).min

    def __len__(self) -> int:
        return len(self.ring)

    @property
    def capacity(self) -> int:
        """Maximum number of trajectories."""
        return self.ring.capacity

    @property
    def nbytes(self) -> int:
        """Bytes of all the buffer's arrays (token arena, slot table, fields, priorities, trees)."""
        return self.ring.nbytes + self.sampler.nbytes

    def normalize_rewards(self, rewards: ArrayLike) -> np.ndarray:
        """``rewards`` mapped into [-1, 1] as they would be on ingest now (with ``reward_range=None``: with the range
        of the rewards seen so far and these)."""
        r = np.asarray(rewards, dtype=np.float64)
        if self.reward_range == (-1.0, 1.0):
            return np.clip(r, -1.0, 1.0)
        if self.reward_range is not None:
            lo, hi = self.reward_range
        else:
            lo, hi = min(self.reward_min, r.min(initial=np.inf)), max(self.reward_max, r.max(initial=-np.inf))
        if not hi > lo:
            return np.zeros_like(r)
        return np.clip((r - lo) * (2.0 / (hi - lo)) - 1.0, -1.0, 1.0)

    def add(
        self,
        prompt_ids: ArrayLike,
        completion_ids: ArrayLike,
        log_probs: ArrayLike,
        reward: float,
        group_id: int,
        iteration: int,
        advantage: float = float("nan"),
        priority: float | None = None,
        timestamp: float | None = None,
    ) -> int:
        """Add one trajectory (1-D prompt ids, completion ids and their sampling log-probs); returns its slot."""
        rows, pri = self._ingest(1, [reward], [group_id], iteration, priority, advantage, timestamp)
        slots, evicted = self.ring.add(prompt_ids, completion_ids, log_probs, **rows)
        self._commit(slots, evicted, pri, rows)
        return int(slots[0])

    def add_batch(
        self,
        prompt_ids: ArrayLike,
        prompt_mask: ArrayLike,
        completion_ids: ArrayLike,
        completion_mask: ArrayLike,
        log_probs: ArrayLike,
        rewards: ArrayLike,
        group_ids: ArrayLike,
        iteration: int | ArrayLike,
        advantages: ArrayLike | None = None,
        priorities: ArrayLike | None = None,
        timestamp: float | None = None,
    ) -> np.ndarray:
        """Add ``N`` trajectories given as GRPO rows (see ``RolloutBatch``: prompts ``(N, T)`` with their mask,
        completions and log-probs ``(N, C)`` with their mask); ``rewards``, ``group_ids`` (and the optional
        ``advantages``, ``priorities``) are ``(N,)``, ``iteration`` one int or ``(N,)``. Returns the ``(N,)`` slots
        (-1 for rows pushed out again within the call, see :meth:`RingBuffer.add_batch`). Invalid input raises
        ``ValueError`` before anything changes."""
        n = len(prompt_ids) if np.ndim(prompt_ids) == 2 else -1
        rows, pri = self._ingest(n, rewards, group_ids, iteration, priorities, advantages, timestamp)
        slots, evicted = self.ring.add_batch(
            prompt_ids, prompt_mask, completion_ids, completion_mask, log_probs, **rows
        )
        self._commit(slots, evicted, pri, rows)
        return slots

    def sample_batch(self, batch_size: int, beta: float | None = None) -> TrajectoryBatch:
        """Draw ``batch_size`` trajectories with replacement, proportionally to ``priority ** alpha * boost``.

        Raises ``ValueError`` on an empty buffer or when ``batch_size`` exceeds the number of trajectories that can
        be drawn (those with a positive priority). ``beta`` overrides the annealed exponent for this call.
        """
        if len(self) == 0:
            raise ValueError("cannot sample from an empty buffer: add trajectories first")
        if batch_size > self.sampler.count:
            raise ValueError(
                f"batch_size {batch_size} > the {self.sampler.count} trajectories that can be drawn (priority > 0); "
                "sampling is with replacement, but a batch larger than what the buffer holds is refused"
            )
        indices, weights = self.sampler.sample(batch_size, beta)
        return self._batch(indices, weights)

    def get(self, indices: ArrayLike) -> TrajectoryBatch:
        """The trajectories at ``indices`` (weights 1); raises ``IndexError`` for slots holding none."""
        indices = self.sampler._check_indices(indices)
        return self._batch(indices, np.ones(len(indices)))

    def update_priorities(self, indices: ArrayLike, priorities: ArrayLike) -> None:
        """Set new priorities (>= 0, finite; 0 = never drawn) for the slots ``indices``; the last duplicate wins."""
        indices = self.sampler._check_indices(indices)
        if not self.ring.is_live(indices).all():
            raise IndexError("some indices hold no trajectory (empty or evicted)")
        boost = np.where(self.ring.fields["high"][indices], self.high_reward_boost, 1.0)
        self.sampler.update(indices, priorities, boost)
        self.max_priority = max(self.max_priority, float(self.sampler.priorities(indices).max(initial=0.0)))

    def evict_older_than(self, min_iteration: int) -> int:
        """Drop every trajectory collected before ``min_iteration`` (they are the oldest); returns how many."""
        slots = self.ring.evict_oldest(self.ring.count_oldest_below("iteration", min_iteration))
        self.sampler.update(slots, 0.0)
        return len(slots)

    def state_arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The buffer as plain data (what :meth:`save` writes): a JSON-able header (settings, the ring's pointers,
        the sampler's counters and RNG state, the running statistics) and the written part of every array."""
        pointers, arrays = self.ring.state_arrays()
        sampler_state, sampler_arrays = self.sampler.state_arrays(min(self.ring.n_added, self.ring.capacity))
        meta = {
            "settings": {
                "capacity": self.ring.capacity,
                "max_tokens": self.ring.max_tokens,
                "alpha": self.sampler.alpha,
                "beta": self.sampler.beta_start,
                "beta_end": self.sampler.beta_end,
                "beta_steps": self.sampler.beta_steps,
                "high_reward_threshold": self.high_reward_threshold,
                "high_reward_boost": self.high_reward_boost,
                "reward_range": self.reward_range,
                "pad_id": self.ring.pad_id,
            },
            "ring": pointers,
            "sampler": sampler_state,
            "reward_min": self.reward_min,
            "reward_max": self.reward_max,
            "max_priority": self.max_priority,
            "last_iteration": int(self.last_iteration),
        }
        return meta, {**arrays, **sampler_arrays}

    def load_state_arrays(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Put back what :meth:`state_arrays` gave, once checked
        (:func:`~algorithms.common.saving.buffer_file.check_buffer_state`)."""
        self.ring.load_state_arrays(meta["ring"], arrays)
        self.sampler.load_state_arrays(meta["sampler"], arrays["priority"], arrays["mass"])
        self.reward_min, self.reward_max = float(meta["reward_min"]), float(meta["reward_max"])
        self.max_priority, self.last_iteration = float(meta["max_priority"]), int(meta["last_iteration"])

    def save(self, path: str | os.PathLike[str] | IO[bytes]) -> None:
        """Write the buffer to ``path``: one ``.npz`` file, written exactly there, atomically (a kill mid-save leaves
        the previous file); see :mod:`algorithms.common.saving.buffer_file`."""
        buffer_file.write_buffer_file(path, *self.state_arrays())

    @classmethod
    def load(
        cls, path: str | os.PathLike[str] | IO[bytes], vocab_size: int | None = None
    ) -> PrioritizedTrajectoryBuffer:
        """Read a buffer written by :meth:`save`, checking everything first
        (:mod:`algorithms.common.saving.buffer_file`).

        :param path: the file (or an open binary file)
        :param vocab_size: the policy's vocabulary size: stored token ids must lie in ``[0, vocab_size)``
            (``None``: only checked to be >= 0)
        :raises ValueError: naming the file, when it is truncated, corrupt or inconsistent
        """
        if vocab_size is not None:
            vocab_size = check_int("vocab_size", vocab_size, low=1)
        meta, arrays = buffer_file.read_buffer_file(path)
        try:
            settings = buffer_file.check_settings(meta)
            try:
                buffer = cls(**settings)
            except (MemoryError, OSError) as error:
                raise ValueError(f"cannot allocate a buffer with these settings ({error})") from None
            rng_kind = type(buffer.sampler.rng.bit_generator).__name__
            buffer_file.check_buffer_state(meta, arrays, _FIELDS, rng_kind, vocab_size)
            buffer.load_state_arrays(meta, arrays)
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(f"{buffer_file.file_name(path)}: invalid replay-buffer file: {error}") from None
        return buffer

    def _ingest(
        self,
        n: int,
        rewards: ArrayLike,
        group_ids: ArrayLike,
        iteration: int | ArrayLike,
        priorities: ArrayLike | None,
        advantages: ArrayLike | None,
        timestamp: float | None,
    ) -> tuple[dict[str, Any], Any]:
        """Validate the per-row values; returns the ring's fields and the priorities (scalars broadcast)."""
        raw = np.asarray(rewards, dtype=np.float64).reshape(-1)
        if n < 0 or raw.shape != (n,):
            raise ValueError(f"expected one reward per trajectory ({n}), got shape {np.shape(rewards)}")
        if not np.isfinite(raw).all():
            raise ValueError("rewards must be finite; got NaN or inf")
        groups = np.asarray(group_ids)
        if groups.shape not in ((n,), ()) or (groups.size and groups.dtype.kind not in "iu"):
            raise ValueError(f"expected one integer group id per trajectory ({n}), got {np.shape(group_ids)}")
        iters = np.asarray(iteration)
        if iters.dtype.kind not in "iu" or iters.shape not in ((n,), ()):
            raise ValueError(f"iteration must be one integer or one per trajectory, got {iteration!r}")
        if iters.size and (
            int(iters.flat[0]) < self.last_iteration or (iters.ndim and bool((np.diff(iters) < 0).any()))
        ):
            raise ValueError(f"iterations must be non-decreasing from the last one added ({self.last_iteration})")
        pri: Any = self.max_priority if priorities is None else np.asarray(priorities, dtype=np.float64)
        if priorities is not None and (pri.shape not in ((n,), ()) or not (pri.min() >= 0 and pri.max() < np.inf)):
            raise ValueError(f"expected {n} finite priorities >= 0 (0 = never sampled), got {priorities!r}")
        adv = np.nan if advantages is None else np.asarray(advantages, dtype=np.float64)
        if advantages is not None and (adv.shape not in ((n,), ()) or np.isinf(adv).any()):
            raise ValueError(f"expected {n} advantages, finite or NaN (unknown)")
        norm = self.normalize_rewards(raw)
        rows = {
            "reward": norm,
            "raw_reward": raw,
            "advantage": adv,
            "group_id": groups,
            "iteration": iters,
            "timestamp": time.time() if timestamp is None else float(timestamp),
            "high": norm >= self.high_reward_threshold,
        }
        return rows, pri

    def _commit(self, slots: np.ndarray, evicted: np.ndarray, priorities: Any, rows: dict[str, Any]) -> None:
        """Point the sampler at what the ring now holds, and remember the running statistics."""
        if len(evicted):
            self.sampler.update(evicted, 0.0)
        boost = np.where(rows["high"], self.high_reward_boost, 1.0)
        if len(slots) and slots.min() < 0:  # rows evicted again within the call
            kept = slots >= 0
            slots, boost = slots[kept], boost[kept]
            priorities = priorities[kept] if np.ndim(priorities) else priorities
        self.sampler.update(slots, priorities, boost)
        if len(slots):
            self.max_priority = max(self.max_priority, float(np.max(priorities)))
            self.last_iteration = int(np.max(rows["iteration"]))
            if self.reward_range is None:
                raw = rows["raw_reward"]
                self.reward_min, self.reward_max = min(self.reward_min, raw.min()), max(self.reward_max, raw.max())

    def _batch(self, indices: np.ndarray, weights: np.ndarray) -> TrajectoryBatch:
        data = self.ring.get(indices)
        return TrajectoryBatch(indices, weights, **{field: data[key] for field, key in BATCH_FIELDS.items()})
