"""Proportional prioritized sampling on a flat-array sum tree (Schaul et al., 2016), numpy only.

Used by :class:`algorithms.common.replay.trajectory_buffer.PrioritizedTrajectoryBuffer`; usable on its own
over any indexed storage.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

_TOP = 10  # tree levels the batch descent crosses in one searchsorted step


class PrioritySampler:
    """Proportional prioritized sampling over ``capacity`` slots (Schaul et al., 2016, "proportional" variant).

    Slot ``i`` has mass ``m_i = p_i ** alpha * boost_i`` (0 when ``p_i == 0``) and is drawn with probability
    ``P(i) = m_i / sum_j m_j``. A batch is ``batch_size`` i.i.d. draws **with replacement**. Priority 0 takes a slot
    out (never drawn); negative, NaN or infinite priorities raise ``ValueError`` and change nothing.

    Importance-sampling weights: ``w_i = (N P(i)) ** -beta / max_j (N P(j)) ** -beta = (m_min / m_i) ** beta``, with
    ``m_min`` the smallest positive mass held (a min tree keeps it), so weights lie in ``(0, 1]``. ``beta`` anneals
    linearly from ``beta`` to ``beta_end`` over ``beta_steps`` calls of :meth:`sample`; ``sample(beta=...)``
    overrides it for one call (e.g. a schedule of training progress).

    Trees: a sum tree and a min tree as the two columns of one flat float64 array of ``2 L`` rows (``L`` = capacity
    rounded up to a power of two; root 1, node ``n`` has children ``2n`` and ``2n + 1``, leaves at ``L + i``). Every
    internal node is recomputed from its two children (never adjusted by a delta), so sums do not drift and a tree
    is a pure function of its leaves. A batch of queries descends the tree together, one numpy pass per level (the
    top levels in one ``searchsorted``); a batch of updates climbs it the same way.

    :param capacity: number of slots
    :param alpha: prioritization exponent (0 = uniform)
    :param beta: importance-sampling exponent at the start of the anneal
    :param beta_end: importance-sampling exponent after ``beta_steps`` calls of :meth:`sample`
    :param beta_steps: number of :meth:`sample` calls over which ``beta`` anneals linearly (0: ``beta_end`` at once)
    :param seed: seed of the sampler's ``numpy.random.Generator``
    """

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_end: float = 1.0,
        beta_steps: int = 10_000,
        seed: int | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if not (np.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha must be a finite number >= 0, got {alpha}")
        if not (0 <= beta and 0 <= beta_end and np.isfinite(beta) and np.isfinite(beta_end)) or beta_steps < 0:
            raise ValueError(f"need beta, beta_end >= 0 and beta_steps >= 0, got {beta}, {beta_end}, {beta_steps}")
        self.capacity, self.alpha = int(capacity), float(alpha)
        self.beta_start, self.beta_end, self.beta_steps = float(beta), float(beta_end), int(beta_steps)
        self._depth = max(0, (self.capacity - 1).bit_length())
        self._leaves = 1 << self._depth
        # Node n's sum and min side by side, so a node's two children (2n, 2n + 1) share one 32-byte block.
        self._tree = np.zeros((2 * self._leaves, 2))
        self._tree[:, 1] = np.inf
        self._sum, self._min = self._tree[:, 0], self._tree[:, 1]
        self._children = self._tree.reshape(self._leaves, 2, 2)  # [n] = [[sum, min] of 2n, [sum, min] of 2n + 1]
        self._priority = np.zeros(self.capacity)
        self.rng = np.random.default_rng(seed)
        self.n_calls = 0  # calls of sample(), for the beta anneal
        self.count = 0  # slots with mass > 0

    def state_arrays(self, written: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The sampler as plain data: its counters and RNG state, and the priorities and masses of the first
        ``written`` slots (the tree is rebuilt from the masses)."""
        state = {"n_calls": self.n_calls, "count": self.count, "rng": self.rng.bit_generator.state}
        arrays = {"priority": self._priority[:written], "mass": self._sum[self._leaves : self._leaves + written]}
        return state, arrays

    def load_state_arrays(self, state: dict[str, Any], priority: np.ndarray, mass: np.ndarray) -> None:
        """Put back what :meth:`state_arrays` gave (checked by the caller), rebuilding the trees from the masses."""
        self._priority[: len(priority)] = priority
        if len(mass):
            self._write_range(self._leaves, mass)
        self.n_calls, self.count = int(state["n_calls"]), int(state["count"])
        self.rng.bit_generator.state = state["rng"]

    @property
    def nbytes(self) -> int:
        """Bytes held: the priorities and both trees."""
        return self._priority.nbytes + self._tree.nbytes

    @property
    def beta(self) -> float:
        """The importance-sampling exponent the next :meth:`sample` call uses."""
        if self.beta_steps == 0:
            return self.beta_end
        frac = min(1.0, self.n_calls / self.beta_steps)
        return self.beta_start + frac * (self.beta_end - self.beta_start)

    @property
    def total(self) -> float:
        """Sum of all masses."""
        return float(self._sum[1])

    def priorities(self, indices: ArrayLike) -> np.ndarray:
        """The raw priorities ``p_i`` last set at ``indices``."""
        return self._priority[self._check_indices(indices)]

    def probabilities(self, indices: ArrayLike) -> np.ndarray:
        """``P(i)`` of each slot in ``indices`` (0 where nothing can be drawn)."""
        idx = self._check_indices(indices)
        total = self._sum[1]
        return self._sum[idx + self._leaves] / total if total > 0 else np.zeros(len(idx))

    def update(self, indices: ArrayLike, priorities: ArrayLike, boost: ArrayLike | None = None) -> None:
        """Set the priority (and optional mass multiplier ``boost``) of ``indices``, vectorised.

        Duplicate indices: the last occurrence wins (as if the updates ran one after another). ``priorities`` and
        ``boost`` broadcast against ``indices``. Bad values raise ``ValueError`` before anything changes.
        """
        idx = self._check_indices(indices)
        pri = _broadcast(priorities, idx, "priorities")
        if idx.size == 0:
            return
        if not (pri.min() >= 0 and pri.max() < np.inf):
            raise ValueError("priorities must be finite and >= 0 (0 = never sampled); got NaN, inf or a negative")
        with np.errstate(over="ignore"):
            mass = pri**self.alpha if self.alpha else (pri > 0).astype(np.float64)
            if boost is not None:
                mult = _broadcast(boost, idx, "boost")
                if not (mult.min() > 0 and mult.max() < np.inf):
                    raise ValueError("boost must be finite and > 0")
                mass = mass * mult
            if not np.isfinite(self._sum[1] + mass.sum()):
                raise ValueError("priorities too large: the sum of p**alpha overflows float64")
        if idx.size > 1 and not (np.diff(idx) > 0).all():  # keep the last occurrence of each index
            _, first_in_reversed = np.unique(idx[::-1], return_index=True)
            keep = idx.size - 1 - first_in_reversed
            idx, pri, mass = idx[keep], pri[keep], mass[keep]
        leaves = idx + self._leaves
        self.count += int(np.count_nonzero(mass)) - int(np.count_nonzero(self._sum[leaves]))
        self._priority[idx] = pri
        if idx.size == 1:
            self._write_one(int(leaves[0]), float(mass[0]))
        elif idx[-1] - idx[0] == idx.size - 1:  # unique and sorted, so contiguous
            self._write_range(int(leaves[0]), mass)
        else:
            self._write(leaves, mass)

    def sample(self, batch_size: int, beta: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``batch_size`` slots i.i.d. with replacement; returns ``(indices, weights)``, both ``(batch_size,)``.

        ``batch_size`` may exceed the number of slots that can be drawn (the trajectory buffer forbids that). Raises
        ``ValueError`` when no slot has a positive priority.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if self.count == 0:
            raise ValueError("cannot sample: no slot has a positive priority (the buffer is empty)")
        total = self._sum[1]
        if not 0 < total < np.inf:  # masses are checked on update and on load; this guards the invariant
            raise ValueError(f"cannot sample: the sum of the masses is {total} (corrupt tree); rebuild the buffer")
        beta = self.beta if beta is None else float(beta)
        queries = self.rng.random(batch_size) * total
        idx = self._descend(queries.copy())
        mass = self._sum[idx + self._leaves]
        if not (mass > 0).all():  # rounding at an interval's edge reached an empty leaf: descend those once more,
            bad = ~(mass > 0)  # with the rule that only enters subtrees holding mass (no retry loop, no new draws)
            idx[bad] = self._descend(queries[bad], safe=True)
            mass = self._sum[idx + self._leaves]
        self.n_calls += 1
        return idx, (self._min[1] / mass) ** beta

    def _check_indices(self, indices: ArrayLike) -> np.ndarray:
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu" and idx.size:
            raise IndexError(f"indices must be integers, got dtype {idx.dtype}")
        idx = idx.reshape(-1).astype(np.int64, copy=False)
        if idx.size and (idx.min() < 0 or idx.max() >= self.capacity):
            raise IndexError(f"indices must lie in [0, {self.capacity}), got {idx.min()}..{idx.max()}")
        return idx

    def _descend(self, values: np.ndarray, safe: bool = False) -> np.ndarray:
        """Leaf of each query in ``values`` (each in ``[0, total)``; overwritten).

        The top ``_TOP`` levels in one step (``searchsorted`` on the cumulative sums of the ``2**_TOP`` nodes of
        that level), then one vectorised step per remaining level: go right, less the left child's sum, when the
        query is at least that sum. Rounding at an interval's edge can end on a leaf without mass; ``safe=True``
        rules that out by construction: the top step sees only nodes of positive sum, and a step goes right only
        when the right child holds mass (or the left one holds none), so every node visited has a positive sum
        (masses are >= 0) and so has the leaf reached. :meth:`sample` descends the few queries that ended on an
        empty leaf once more with ``safe=True``: a bounded amount of work, never a retry loop.
        """
        top = min(self._depth, _TOP)
        level = self._sum[1 << top : 2 << top]
        nodes = np.flatnonzero(level > 0) if safe else None
        edges = np.cumsum(level if nodes is None else level[nodes])
        j = np.minimum(np.searchsorted(edges, values, side="right"), len(edges) - 1)
        values -= np.concatenate(([0.0], edges))[j]
        node = (j if nodes is None else nodes[j]) + (1 << top)
        for _ in range(self._depth - top):
            node <<= 1
            left = self._sum[node]
            right = values >= left
            if safe:
                right = (right & (self._sum[node + 1] > 0)) | (left <= 0)
            np.subtract(values, left, out=values, where=right)
            node += right
        return node - self._leaves

    def _recompute(self, lo: int, hi: int) -> None:
        """Nodes ``lo:hi`` (of one level) from their children."""
        s, m = self._sum, self._min
        np.add(s[2 * lo : 2 * hi : 2], s[2 * lo + 1 : 2 * hi : 2], out=s[lo:hi])
        np.minimum(m[2 * lo : 2 * hi : 2], m[2 * lo + 1 : 2 * hi : 2], out=m[lo:hi])

    def _write_one(self, leaf: int, mass: float) -> None:
        s, m = self._sum, self._min
        s[leaf], m[leaf] = mass, mass if mass > 0 else np.inf
        while leaf > 1:
            leaf >>= 1
            s[leaf] = s.item(2 * leaf) + s.item(2 * leaf + 1)
            m[leaf] = min(m.item(2 * leaf), m.item(2 * leaf + 1))

    def _write_range(self, lo: int, mass: np.ndarray) -> None:
        hi = lo + len(mass)
        self._sum[lo:hi], self._min[lo:hi] = mass, np.where(mass > 0, mass, np.inf)
        while lo > 1:
            lo, hi = lo >> 1, ((hi - 1) >> 1) + 1
            self._recompute(lo, hi)

    def _write(self, leaves: np.ndarray, mass: np.ndarray) -> None:
        """Scattered leaves (unique): climb with gathers while a level has many more nodes than the batch, then
        recompute the (small) levels above whole."""
        s, m = self._sum, self._min
        s[leaves], m[leaves] = mass, np.where(mass > 0, mass, np.inf)
        for level in range(self._depth - 1, -1, -1):
            if (1 << level) <= 4 * len(leaves):
                for k in range(level, -1, -1):
                    self._recompute(1 << k, 2 << k)
                return
            leaves = leaves >> 1  # parents repeat; each gets the same value from its final children
            children = self._children[leaves]  # (n, 2, 2)
            s[leaves] = children[:, 0, 0] + children[:, 1, 0]
            m[leaves] = np.minimum(children[:, 0, 1], children[:, 1, 1])


def _broadcast(values: ArrayLike, indices: np.ndarray, name: str) -> np.ndarray:
    """``values`` as float64 with the shape of ``indices`` (one value, or one per index)."""
    out = np.asarray(values, dtype=np.float64)
    if out.shape == indices.shape:
        return out
    if out.size != 1:
        raise ValueError(f"expected one value or {indices.size} {name}, got shape {out.shape}")
    return np.broadcast_to(out.reshape(()), indices.shape)
