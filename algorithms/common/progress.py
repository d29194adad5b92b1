"""Progress a person can follow, wherever the output goes: a bar on a terminal, a line per tenth of the work when
the output goes to a file or a pipe (a bar redrawn there shows nothing until the end)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from stable_baselines3.common.callbacks import BaseCallback
from tqdm.auto import tqdm

__all__ = ["ProgressBar", "ProgressCallback", "ProgressLines", "progress"]


class ProgressLines:
    """One line per tenth of ``total`` (and at the end): ``label: done/total (p%), elapsed, about s left``.

    :param total: the amount of work (steps, completions)
    :param label: what the work is, at the start of each line
    :param stream: where the lines go (default: standard output)
    :param parts: how many lines over the whole work
    """

    def __init__(self, total: int, label: str, stream: TextIO | None = None, parts: int = 10) -> None:
        self.total, self.label, self.parts = max(int(total), 1), label, parts
        self.stream = stream
        self._started = time.perf_counter()
        self._shown = 0  # tenths shown so far

    def update(self, done: int) -> None:
        """Report ``done`` units of work so far (a line when a new tenth is reached)."""
        reached = min(self.parts, done * self.parts // self.total)
        if reached <= self._shown:
            return
        self._shown = reached
        elapsed = time.perf_counter() - self._started
        left = elapsed * max(self.total - done, 0) / max(done, 1)  # learn runs whole iterations: done may pass total
        stream = self.stream or sys.stdout
        share = f"{done}/{self.total} ({100 * done / self.total:.0f}%)"
        print(f"{self.label}: {share}, {elapsed:.0f} s, about {left:.0f} s left", file=stream, flush=True)

    def close(self) -> None:
        """Nothing to clean up (the bar's counterpart)."""


class ProgressBar:
    """A tqdm bar with :class:`ProgressLines`' interface (``update(done)`` takes the running total)."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None) -> None:
        self._bar = tqdm(total=total, desc=label, file=stream or sys.stdout)

    def update(self, done: int) -> None:
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        self._bar.close()


def progress(total: int, label: str, stream: TextIO | None = None) -> ProgressBar | ProgressLines:
    """A bar when ``stream`` (standard output by default) is a terminal, else :class:`ProgressLines`."""
    target = stream or sys.stdout
    on_terminal = callable(getattr(target, "isatty", None)) and target.isatty()
    return ProgressBar(total, label, target) if on_terminal else ProgressLines(total, label, target)


class ProgressCallback(BaseCallback):
    """``learn``'s progress in completions, as :func:`progress` shows it (SB3's own bar draws on terminals only).

    :param label: the start of each line
    :param stream: where it goes (default: standard output)
    """

    def __init__(self, label: str = "GRPO", stream: TextIO | None = None) -> None:
        super().__init__()
        self.label, self.stream = label, stream
        self._progress: ProgressBar | ProgressLines | None = None
        self._start = 0

    def _on_training_start(self) -> None:
        self._start = self.model.num_timesteps
        total = int(self.locals["total_timesteps"]) - self._start
        self._progress = progress(total, self.label, self.stream)

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        assert self._progress is not None
        self._progress.update(self.model.num_timesteps - self._start)

    def _on_training_end(self) -> None:
        if self._progress is not None:
            self._progress.close()
