"""Learnability-prioritised prompt selection: a pool of recently drawn problems, sampled by ``p (1 - p)``.

A problem the policy always solves (``p = 1``) or never solves (``p = 0``) gives a group whose rewards are all
equal: no advantage, no gradient. One it solves sometimes gives the most signal; ``p (1 - p)`` (the variance of a
Bernoulli success) measures that "learnability" (Tzannetos et al. 2023, "Proximal curriculum"; Foster & Foerster
2025, "Learning to reason at the frontier of learnability"). :class:`LearnabilityPool` keeps the problems of the
last ``capacity`` fresh draws with a running estimate of each one's success rate, and fills every rollout with

- ``round(n * fresh_fraction)`` fresh problems (never seen: the task's stream, at the env's current level), and
- the rest drawn from the pool without replacement with probability proportional to
  ``priority = p (1 - p) + floor`` (the floor lets problems at ``p = 0`` or ``1`` come back now and then: the
  policy may have changed), through the project's sum tree
  (:class:`~algorithms.common.replay.sum_tree.PrioritySampler`).

While the pool holds fewer problems than a rollout needs, the rest are fresh. A problem enters the pool after it
is played (its first estimate is the success rate of its group); when the pool is full the oldest entry leaves.
The estimate is updated as ``p <- (1 - rate) p + rate * observed`` (``rate`` 0.5), so it follows the policy as it
learns. Problems are identified by the keyword arguments of ``sample_problem`` (``seed`` and the ``difficulty``
they were drawn at), so a pool entry is remade exactly and the whole pool is plain JSON data in a saved run. With
the curriculum, fresh problems come at the current level and pool entries keep theirs: the pool holds the
problems the policy solves sometimes, the curriculum moves the level of the new ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from algorithms.common.replay.sum_tree import PrioritySampler

#: added to every pool entry's ``p (1 - p)`` so that no problem's chance of coming back is 0
PRIORITY_FLOOR = 0.01
#: weight of the newest observation in a problem's running success estimate
ESTIMATE_RATE = 0.5

Key = dict[str, Any]


def learnability(success: np.ndarray | float) -> np.ndarray:
    """``p (1 - p)``: the variance of a success with probability ``p`` (0 at p = 0 and 1, 0.25 at p = 0.5)."""
    p = np.asarray(success, dtype=np.float64)
    return p * (1.0 - p)


def pool_draw_count(n: int, fresh_fraction: float, pool_size: int) -> int:
    """How many of ``n`` problems come from a pool of ``pool_size`` entries: ``n - round(n * fresh_fraction)``, at
    most the pool's size."""
    return min(n - round(n * fresh_fraction), pool_size)


class LearnabilityPool:
    """The pool of recently drawn problems and their success estimates (see the module docstring).

    :param capacity: how many problems the pool holds (the most recently drawn fresh ones)
    :param fresh_fraction: the share of each draw that is fresh problems, in [0, 1]
    :param floor: added to every entry's ``p (1 - p)``
    :param seed: seed of the sampler's generator
    """

    def __init__(
        self, capacity: int = 256, fresh_fraction: float = 0.25, floor: float = PRIORITY_FLOOR, seed: int | None = None
    ) -> None:
        if capacity < 1 or not 0.0 <= fresh_fraction <= 1.0 or not floor > 0:
            raise ValueError(f"need capacity >= 1, fresh_fraction in [0, 1], floor > 0; got {capacity}, "
                             f"{fresh_fraction}, {floor}")  # fmt: skip
        self.capacity, self.fresh_fraction, self.floor = int(capacity), float(fresh_fraction), float(floor)
        self.sampler = PrioritySampler(self.capacity, alpha=1.0, beta=0.0, beta_end=0.0, beta_steps=0, seed=seed)
        self.keys: list[Key | None] = [None] * self.capacity  # slot -> sample_problem arguments
        self.success = np.zeros(self.capacity)  # slot -> running success estimate
        self.next_slot = 0  # where the next new problem goes (the oldest entry once full)
        self.awaiting: list[tuple[int, Key]] = []  # drawn, outcome not yet observed (empty between rollouts)

    @property
    def size(self) -> int:
        """Problems in the pool."""
        return sum(key is not None for key in self.keys)

    def priorities(self) -> np.ndarray:
        """``(size,)`` the sampling priority ``p (1 - p) + floor`` of each entry, in slot order."""
        held = [slot for slot, key in enumerate(self.keys) if key is not None]
        return learnability(self.success[held]) + self.floor

    def draw(self, n: int, fresh: Callable[[int], list[Key]]) -> list[tuple[int, Key]]:
        """``n`` problems as ``(slot, key)``: pool entries (without replacement, by priority) then ``fresh(m)``'s
        new ones (slot -1)."""
        picked: list[int] = []
        for _ in range(pool_draw_count(n, self.fresh_fraction, self.size)):
            slot = int(self.sampler.sample(1)[0][0])
            picked.append(slot)
            self.sampler.update([slot], 0.0)  # without replacement within one draw
        self._reprioritise(picked)
        new = fresh(n - len(picked))
        drawn = [(slot, dict(self.keys[slot])) for slot in picked] + [(-1, dict(key)) for key in new]
        self.awaiting.extend(drawn)
        return drawn

    def observe_awaiting(self, rates: list[float]) -> None:
        """:meth:`observe` the problems drawn since the last call, given their success rates in drawing order."""
        drawn, self.awaiting = self.awaiting, []
        self.observe(list(zip(drawn, rates, strict=True)))

    def observe(self, outcomes: list[tuple[tuple[int, Key], float]]) -> None:
        """Record each drawn problem's observed success rate: pool entries update their estimate, fresh problems
        enter the pool (the oldest entry leaves when it is full)."""
        for (slot, key), rate in outcomes:
            if slot >= 0 and self.keys[slot] == key:  # still the entry that was drawn
                self.success[slot] = (1 - ESTIMATE_RATE) * self.success[slot] + ESTIMATE_RATE * rate
                self._reprioritise([slot])
        for (slot, key), rate in outcomes:
            if slot < 0:
                slot, self.next_slot = self.next_slot, (self.next_slot + 1) % self.capacity
                self.keys[slot], self.success[slot] = dict(key), float(rate)
                self._reprioritise([slot])

    def _reprioritise(self, slots: list[int]) -> None:
        if slots:
            held = [self.keys[s] is not None for s in slots]
            self.sampler.update(slots, np.where(held, learnability(self.success[slots]) + self.floor, 0.0))

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict[str, Any]:
        """The pool as plain JSON data (keys, estimates, the next slot, the sampler's generator)."""
        return {
            "keys": [None if key is None else dict(key) for key in self.keys],
            "success": self.success.tolist(),
            "next_slot": self.next_slot,
            "rng": self.sampler.rng.bit_generator.state,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`'s data into a pool of the same capacity."""
        if len(state["keys"]) != self.capacity:
            raise ValueError(f"the saved prompt pool holds {len(state['keys'])} slots, this one {self.capacity}")
        self.keys = [None if key is None else dict(key) for key in state["keys"]]
        self.success = np.asarray(state["success"], dtype=np.float64)
        self.next_slot = int(state["next_slot"])
        self.sampler.rng.bit_generator.state = state["rng"]
        self._reprioritise(list(range(self.capacity)))
