"""FIFO storage of variable-length token trajectories in one flat arena, bounded by a slot capacity and a token
budget, numpy only. Used by :class:`algorithms.common.replay.trajectory_buffer.PrioritizedTrajectoryBuffer`."""

from __future__ import annotations

import mmap
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

_INT32_MAX = int(np.iinfo(np.int32).max)
_EMPTY = np.zeros(0, dtype=np.int64)


class RingBuffer:
    """FIFO store of up to ``capacity`` variable-length trajectories in one flat token arena.

    A trajectory is a prompt (``P`` token ids), a completion (``C`` ids), the ``C`` log-probs the completion was
    sampled with, and one value per scalar field (``fields``). Its ``P + 2C`` values are stored back to back in an
    int32 arena of ``max_tokens`` words: ``[prompt | completion | log-probs as float32 bits]``; a slot table holds
    its offset and the two lengths.

    Memory, in bytes per trajectory: ``4 (P + 2C)`` in the arena, plus 16 in the slot table (int64 offset, two
    int32 lengths), plus the itemsizes of ``fields``. The arena (``4 max_tokens`` bytes) and the slot table
    (``capacity`` rows) are mapped once, zeroed, and take memory only as they are first written, so memory is
    bounded by ``4 max_tokens + capacity (16 + fields)`` bytes whatever is added: the token budget, not
    the capacity, bounds a buffer of long trajectories.

    Eviction, always oldest first: adding to a full slot table overwrites the oldest slot; adding tokens the arena
    has no contiguous room for evicts the oldest trajectories until the room is free. A block of new tokens never
    wraps around the arena's end: when it does not fit before the end it starts at 0, and the words left at the
    end stay unused until the trajectories before them are evicted (so up to one block of the budget may be
    idle). ``tokens_used`` counts the words of live trajectories. Token ids must lie in ``[0, 2**31)``.

    :param capacity: maximum number of trajectories (slots)
    :param max_tokens: arena size in 4-byte words; a prompt token takes one, a completion token two (id and log-prob)
    :param fields: name -> dtype of the per-trajectory scalar fields
    :param pad_id: the id that :meth:`get` writes into padding
    """

    def __init__(
        self,
        capacity: int = 1_000_000,
        max_tokens: int = 2**27,
        fields: Mapping[str, DTypeLike] | None = None,
        pad_id: int = 0,
    ) -> None:
        if capacity < 1 or max_tokens < 1:
            raise ValueError(f"capacity and max_tokens must be >= 1, got {capacity}, {max_tokens}")
        self.capacity, self.max_tokens, self.pad_id = int(capacity), int(max_tokens), int(pad_id)
        self._arena = _lazy_zeros(self.max_tokens, np.int32)
        self._offset = _lazy_zeros(self.capacity, np.int64)
        self._plen = _lazy_zeros(self.capacity, np.int32)
        self._clen = _lazy_zeros(self.capacity, np.int32)
        self.fields = {name: _lazy_zeros(self.capacity, dtype) for name, dtype in (fields or {}).items()}
        self._pos = 0  # next slot to write
        self._size = 0
        self._head = 0  # arena word after the newest block
        self._used = 0  # arena words held by live trajectories
        self._high = 0  # arena words ever written (the prefix save() keeps)
        self.n_added = 0  # trajectories ever added

    #: the ring's pointers, as a saved buffer records them (the file format's names)
    POINTERS = ("_pos", "_size", "_head", "_used", "_high", "n_added")

    def state_arrays(self) -> tuple[dict[str, int], dict[str, np.ndarray]]:
        """The ring as plain data: its pointers and the written part of its arrays (``arena``, ``offset``, ``plen``,
        ``clen`` and ``field_<name>``): what a saved buffer holds."""
        written = min(self.n_added, self.capacity)
        arrays = {f"field_{name}": values[:written] for name, values in self.fields.items()}
        arrays.update(
            arena=self._arena[: self._high],
            offset=self._offset[:written],
            plen=self._plen[:written],
            clen=self._clen[:written],
        )
        return {name: int(getattr(self, name)) for name in self.POINTERS}, arrays

    def load_state_arrays(self, pointers: Mapping[str, int], arrays: Mapping[str, np.ndarray]) -> None:
        """Put back what :meth:`state_arrays` gave (checked by the caller: see
        :mod:`algorithms.common.saving.buffer_file`)."""
        written = min(int(pointers["n_added"]), self.capacity)
        self._arena[: int(pointers["_high"])] = arrays["arena"]
        self._offset[:written], self._plen[:written], self._clen[:written] = (
            arrays["offset"],
            arrays["plen"],
            arrays["clen"],
        )
        for name, values in self.fields.items():
            values[:written] = arrays[f"field_{name}"]
        for name in self.POINTERS:
            setattr(self, name, int(pointers[name]))

    def __len__(self) -> int:
        return self._size

    @property
    def tokens_used(self) -> int:
        """Arena words held by the live trajectories (``sum of P + 2C``)."""
        return self._used

    @property
    def nbytes(self) -> int:
        """Bytes allocated by the arena, the slot table and the fields."""
        arrays = [self._arena, self._offset, self._plen, self._clen, *self.fields.values()]
        return sum(a.nbytes for a in arrays)

    def oldest_first(self, start: int = 0, count: int | None = None) -> np.ndarray:
        """Slots of the live trajectories from the ``start``-th oldest on (``count`` of them, default: all)."""
        count = self._size - start if count is None else min(count, self._size - start)
        tail = self._pos - self._size
        return (tail + start + np.arange(max(count, 0))) % self.capacity

    def is_live(self, slots: ArrayLike) -> np.ndarray:
        """Whether each slot holds a trajectory."""
        slots = np.asarray(slots, dtype=np.int64)
        return (
            (slots >= 0) & (slots < self.capacity) & ((slots - self._pos) % self.capacity >= self.capacity - self._size)
        )

    def count_oldest_below(self, field: str, value: float) -> int:
        """How many of the oldest trajectories have ``field < value``, for a field non-decreasing in insertion order
        (binary search over the two runs of the slot table, oldest first)."""
        values, tail = self.fields[field], (self._pos - self._size) % self.capacity
        first = values[tail : tail + self._size]
        count = int(np.searchsorted(first, value, side="left"))
        if count == len(first) < self._size:
            count += int(np.searchsorted(values[: self._size - len(first)], value, side="left"))
        return count

    def evict_oldest(self, n: int) -> np.ndarray:
        """Drop the ``n`` oldest trajectories; returns their slots."""
        if n <= 0:
            return _EMPTY
        slots = self.oldest_first(0, n)
        self._used -= int(self._plen[slots].sum()) + 2 * int(self._clen[slots].sum())
        self._size -= len(slots)
        return slots

    def add(
        self, prompt_ids: ArrayLike, completion_ids: ArrayLike, log_probs: ArrayLike, **fields: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        """Add one trajectory (1-D arrays, no padding; one value per field); returns ``(slots, evicted)`` as
        :meth:`add_batch` does."""
        prompt, completion = np.asarray(prompt_ids).reshape(-1), np.asarray(completion_ids).reshape(-1)
        logp = np.asarray(log_probs, dtype=np.float32).reshape(-1)
        if logp.shape != completion.shape:
            raise ValueError(f"log_probs has {logp.size} values for {completion.size} completion tokens")
        _check_tokens(prompt, completion, logp)
        words = np.concatenate([prompt, completion, logp.view(np.int32)], dtype=np.int32, casting="unsafe")
        return self._add(words, np.array([prompt.size]), np.array([completion.size]), fields)

    def add_batch(
        self,
        prompt_ids: ArrayLike,
        prompt_mask: ArrayLike,
        completion_ids: ArrayLike,
        completion_mask: ArrayLike,
        log_probs: ArrayLike,
        **fields: ArrayLike,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Add ``N`` trajectories given as padded rows: ids and masks ``(N, T)`` and ``(N, C)``, log-probs ``(N, C)``.

        The tokens kept are those under the masks, in column order (any padding side works). Fields are ``(N,)``
        (or one value for all). Returns ``(slots, evicted)``: the slot of each row (-1 for a row evicted again by
        later rows of the same call, which happens only when ``N`` exceeds the capacity or the token budget) and the
        slots that no longer hold a trajectory because of this call. Invalid input raises before anything changes.
        """
        pid, pm = np.asarray(prompt_ids), np.asarray(prompt_mask, dtype=bool)
        cid, cm = np.asarray(completion_ids), np.asarray(completion_mask, dtype=bool)
        logp = np.asarray(log_probs, dtype=np.float32)
        if pid.ndim != 2 or pm.shape != pid.shape or cid.ndim != 2 or cid.shape[0] != pid.shape[0]:
            raise ValueError(f"expected prompt ids/mask (N, T) and completion ids (N, C), got {pid.shape}, {cid.shape}")
        if cm.shape != cid.shape or logp.shape != cid.shape:
            raise ValueError(f"completion mask and log_probs must match completion ids {cid.shape}")
        (n, t), c = pid.shape, cid.shape[1]
        full = bool(pm.all() and cm.all())
        if full:
            _check_tokens(pid, cid, logp)
        else:
            _check_tokens(pid[pm], cid[cm], logp[cm])
        rows = np.empty((n, t + 2 * c), dtype=np.int32)  # (N, T + 2C): [prompt | completion | log-prob bits]
        rows[:, :t], rows[:, t : t + c], rows[:, t + c :] = pid, cid, logp.view(np.int32)
        if full:
            return self._add(rows.reshape(-1), np.full(n, t), np.full(n, c), fields)
        words = rows[np.concatenate([pm, cm, cm], axis=1)]
        return self._add(words, pm.sum(axis=1), cm.sum(axis=1), fields)

    def get(self, slots: ArrayLike) -> dict[str, np.ndarray]:
        """Padded arrays of the trajectories at ``slots`` (shape ``(B,)``), ready for a GRPO update.

        ``prompt_ids`` / ``prompt_mask`` ``(B, T)`` int64, left-padded (newest token last); ``completion_ids``
        ``(B, C)`` int64 and ``completion_mask`` bool, right-padded; ``log_probs`` ``(B, C)`` float32, 0 in padding;
        plus each field ``(B,)``. ``T`` and ``C`` are the longest prompt and completion in the batch (at least 1).
        """
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        if not self.is_live(slots).all():
            raise IndexError("some slots hold no trajectory (empty or evicted)")
        plen, clen = self._plen[slots], self._clen[slots]
        width_p, width_c = max(1, int(plen.max(initial=0))), max(1, int(clen.max(initial=0)))
        start = (self._offset[slots] + plen)[:, None]  # where each completion starts
        col_p, col_c = np.arange(-width_p, 0), np.arange(width_c)
        # One gather per part; "clip" keeps padding positions inside the arena, and padding is overwritten below.
        prompt = np.take(self._arena, start + col_p, mode="clip")  # (B, T)
        completion = np.take(self._arena, start + col_c, mode="clip")  # (B, C)
        logp = np.take(self._arena.view(np.float32), start + clen[:, None] + col_c, mode="clip")
        out = {
            "prompt_ids": prompt.astype(np.int64),
            "prompt_mask": np.ones(prompt.shape, dtype=np.int64),
            "completion_ids": completion.astype(np.int64),
            "completion_mask": np.ones(completion.shape, dtype=bool),
            "log_probs": logp,
        }
        if (plen != width_p).any():
            pad = col_p < -plen[:, None]
            out["prompt_ids"][pad], out["prompt_mask"][pad] = self.pad_id, 0
        if (clen != width_c).any():
            pad = col_c >= clen[:, None]
            out["completion_ids"][pad], out["completion_mask"][pad], logp[pad] = self.pad_id, False, 0.0
        out.update({name: values[slots] for name, values in self.fields.items()})
        return out

    def _add(
        self, words: np.ndarray, plen: np.ndarray, clen: np.ndarray, fields: Mapping[str, Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        n = len(plen)
        if fields.keys() != self.fields.keys() or any(np.shape(v) not in ((n,), ()) for v in fields.values()):
            raise ValueError(f"give exactly the fields {sorted(self.fields)}, each one value or one per trajectory")
        sizes = plen + 2 * clen
        if n and (sizes.min() < 1 or sizes.max() > self.max_tokens):
            raise ValueError(
                f"a trajectory takes P + 2C arena words, which must lie in [1, max_tokens={self.max_tokens}]; "
                f"got {sizes.min()}..{sizes.max()}: raise max_tokens or shorten the trajectory"
            )
        evicted: list[np.ndarray] = []
        if n <= self.capacity and len(words) <= self.max_tokens:
            slots = self._store(words, sizes, plen, clen, fields, evicted)
        else:  # in chunks that fit the slot table and the arena; -1 marks the rows later chunks evicted
            ends, done = np.cumsum(sizes), 0
            slots = np.empty(n, dtype=np.int64)
            while done < n:
                first = int(ends[done - 1]) if done else 0
                stop = min(n, done + self.capacity, int(np.searchsorted(ends, first + self.max_tokens, side="right")))
                part = {k: v if np.ndim(v) == 0 else v[done:stop] for k, v in fields.items()}
                chunk = slice(done, stop)
                block = words[first : ends[stop - 1]]
                slots[chunk] = self._store(block, sizes[chunk], plen[chunk], clen[chunk], part, evicted)
                done = stop
            _, last = np.unique(slots[::-1], return_index=True)  # the last row written to each slot
            final = np.full(n, -1, dtype=np.int64)
            final[n - 1 - last] = slots[n - 1 - last]
            final[~self.is_live(final)] = -1
            slots = final
        self.n_added += n
        gone = np.concatenate(evicted) if evicted else _EMPTY
        return slots, gone[~self.is_live(gone)] if len(gone) else gone

    def _store(
        self,
        words: np.ndarray,
        sizes: np.ndarray,
        plen: np.ndarray,
        clen: np.ndarray,
        fields: Mapping[str, Any],
        evicted: list[np.ndarray],
    ) -> np.ndarray:
        """Write rows that fit the capacity and the budget as one contiguous block; returns their slots and appends
        the slots it evicts to ``evicted``."""
        n, total, pos = len(sizes), len(words), self._pos
        if self._size + n > self.capacity:
            evicted.append(self.evict_oldest(self._size + n - self.capacity))
        start = self._head if self._head + total <= self.max_tokens else 0
        blocking = self._blocking(start, start + total)
        if blocking:
            evicted.append(self.evict_oldest(blocking))
        self._arena[start : start + total] = words
        slots = np.arange(pos, pos + n) % self.capacity
        where = slice(pos, pos + n) if pos + n <= self.capacity else slots
        self._offset[where] = start if n == 1 else start + np.cumsum(sizes) - sizes
        self._plen[where], self._clen[where] = plen, clen
        for name, values in fields.items():
            self.fields[name][where] = values
        self._pos, self._size = (pos + n) % self.capacity, self._size + n
        self._head, self._used, self._high = start + total, self._used + total, max(self._high, start + total)
        return slots

    def _blocking(self, start: int, end: int) -> int:
        """How many of the oldest trajectories must go for arena words ``[start, end)`` to be free.

        With trajectory ``j`` the oldest, the live words are ``[o_j, head)``, or ``[o_j, max_tokens) + [0, head)``
        when they wrap; ``j`` blocks while that region meets ``[start, end)``. The first that does not block ends
        the count (everything newer lies beyond it). The oldest is checked alone, then in vectorised chunks.
        """
        if self._size == 0:
            return 0
        head, oldest = self._head, int(self._offset[(self._pos - self._size) % self.capacity])
        if not ((start < head and oldest < end) if oldest < head else (end > oldest or start < head)):
            return 0
        count, chunk = 0, 64
        while count < self._size:
            o = self._offset[self.oldest_first(count, chunk)]
            clash = np.where(o < head, (start < head) & (o < end), (end > o) | (start < head))
            if not clash.all():
                return count + int(np.argmin(clash))
            count, chunk = count + len(o), chunk * 4
        return count


def _lazy_zeros(n: int, dtype: DTypeLike) -> np.ndarray:
    """A zeroed array on an anonymous memory map: no memory until written, then ordinary 4 KiB pages. (numpy's own
    large allocations ask the kernel for huge pages, whose compaction made first writes about 3x slower here.)"""
    dtype = np.dtype(dtype)
    return np.frombuffer(mmap.mmap(-1, max(1, n * dtype.itemsize)), dtype=dtype, count=n)


def _check_tokens(prompt: np.ndarray, completion: np.ndarray, logp: np.ndarray) -> None:
    for name, ids in (("prompt", prompt), ("completion", completion)):
        if ids.size == 0:
            continue
        if ids.dtype.kind not in "iu":
            raise ValueError(f"{name} ids must be integers, got dtype {ids.dtype}")
        if ids.min() < 0 or (ids.dtype.itemsize >= 4 and ids.dtype != np.int32 and ids.max() > _INT32_MAX):
            raise ValueError(f"{name} ids must lie in [0, 2**31), got {ids.min()}..{ids.max()}")
    if not np.isfinite(logp).all():
        raise ValueError("log_probs of real (unmasked) completion tokens must be finite")
