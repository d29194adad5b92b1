"""Order enforcing for every env of the project: ``step`` only while an episode is in progress.

Gymnasium's ``OrderEnforcing`` wrapper (``gym.make`` adds it) refuses a ``step`` before the first ``reset``; it lets a
finished episode be stepped again, and a text env would score that step: a client could farm the reward of one solved
problem, or answer until right after a wrong answer ended the episode. :class:`EpisodeOrder` refuses both with
:class:`ResetNeeded` (Gymnasium's ``gymnasium.error.ResetNeeded``, and a ``RuntimeError``), saying what happened and
the fix. ``R1ZeroEnv``, ``LMEnvWrapper``, and the OpenEnv and GEM envs each keep one; the vector envs reset an ended
episode themselves (autoreset), so they never step one.
"""

from __future__ import annotations

from gymnasium.error import ResetNeeded as GymResetNeeded

ENDINGS = ("terminated", "truncated")
"""How an episode ends: ``terminated`` (its answer was right, or its turns were spent) or ``truncated`` (cut)."""


class ResetNeeded(GymResetNeeded, RuntimeError):
    """``step`` where no episode is in progress: before the first ``reset``, or after the episode ended."""


class EpisodeOrder:
    """Whether an env's episode is in progress, its steps, and how it ended.

    :param owner: the env's name, as the errors name it (``"R1ZeroEnv"``)
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.started = False
        """Whether ``reset`` was called."""
        self.steps = 0
        """The steps of the episode in progress (or of the one that ended)."""
        self.ended: str | None = None
        """``None`` while the episode goes on; ``"terminated"`` or ``"truncated"`` once it ended."""

    def start(self, steps: int = 0, ended: str | None = None) -> None:
        """A new episode (``reset``), or a saved one continued with its ``steps`` and ending (one of
        :data:`ENDINGS`, or ``None``)."""
        self.started, self.steps, self.ended = True, int(steps), ended

    def forget(self) -> None:
        """No episode, as before the first ``reset`` (a saved state from before one)."""
        self.started, self.steps, self.ended = False, 0, None

    def check(self) -> None:
        """Before a step: :class:`ResetNeeded` when no episode is in progress."""
        if not self.started:
            raise ResetNeeded(f"{self.owner}.step() before reset(): call reset() to start an episode, then step()")
        if self.ended is not None:
            raise ResetNeeded(
                f"{self.owner}.step() after the episode ended ({self.ended}) at step {self.steps}: a finished episode "
                "is not scored again; call reset() to start a new episode before step()"
            )

    def stepped(self, terminated: bool, truncated: bool) -> None:
        """After a step: count it, and note the end of the episode."""
        self.steps += 1
        if terminated or truncated:
            self.ended = "terminated" if terminated else "truncated"
