"""Schedules counted in updates (SB3's own schedules are functions of the remaining progress)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UpdateDecay:
    """Linear decay from ``start`` to ``end`` over ``n_updates`` gradient updates, then constant at ``end``.

    The original design's entropy coefficient is ``UpdateDecay(0.01, 0.001, 10_000)``: it does not depend on the
    length of the run, which an SB3 progress schedule (``f(progress_remaining)``) would.

    :param start: the value at update 0
    :param end: the value from ``n_updates`` on
    :param n_updates: the length of the decay, in updates
    """

    start: float
    end: float
    n_updates: int

    def __post_init__(self) -> None:
        if self.n_updates <= 0:
            raise ValueError(f"n_updates must be positive, got {self.n_updates}")

    def __call__(self, n_updates: int) -> float:
        """The value after ``n_updates`` updates."""
        fraction = min(max(n_updates, 0) / self.n_updates, 1.0)
        return self.start + fraction * (self.end - self.start)
