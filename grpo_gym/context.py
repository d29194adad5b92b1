"""The context window: the token history of one episode, shown to the policy as a left-padded array.

Truncation rules, in one place:

- The window holds at most ``length`` tokens. The observation is the newest ``length`` tokens, left-padded
  with the pad id, so the newest token is always last (the layout a causal LM expects for batched decoding).
- A prompt longer than the window keeps its newest tokens (the end of the question and the turn cue);
  :meth:`ContextWindow.reset` reports that it cut something so the env can say so in ``info``.
- :meth:`ContextWindow.append` never drops old tokens silently: it appends what fits and reports whether all
  of it did. The env ends the episode with ``truncated=True`` when the window cannot take the next turn.
"""

from __future__ import annotations

import numpy as np

from grpo_gym.validation import check_int


class ContextWindow:
    """A fixed-capacity token buffer with a left-padded observation view.

    :param length: the window size in tokens (``context_length``, 4096 by default in the env)
    :param pad_id: the id used for padding on the left
    """

    def __init__(self, length: int, pad_id: int) -> None:
        self.length: int = check_int("context_length", length, low=1)  # type: ignore[assignment]
        self.pad_id: int = check_int("pad_id", pad_id, low=0)  # type: ignore[assignment]
        self._tokens = np.full(self.length, self.pad_id, dtype=np.int64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def free(self) -> int:
        """How many more tokens fit."""
        return self.length - self._size

    def reset(self, ids: np.ndarray) -> bool:
        """Start a new episode with ``ids``; returns ``True`` when the prompt had to be cut to fit (left side)."""
        ids = np.asarray(ids, dtype=np.int64)
        cut = len(ids) > self.length
        ids = ids[-self.length :]
        self._tokens[: len(ids)] = ids
        self._size = len(ids)
        return cut

    def append(self, ids: np.ndarray) -> bool:
        """Append ``ids``; returns ``False`` (and appends only what fits) when they do not all fit."""
        ids = np.asarray(ids, dtype=np.int64)
        n = min(len(ids), self.free)
        self._tokens[self._size : self._size + n] = ids[:n]
        self._size += n
        return n == len(ids)

    def tokens(self) -> np.ndarray:
        """A copy of the tokens held, oldest first."""
        return self._tokens[: self._size].copy()

    def observation(self) -> dict[str, np.ndarray]:
        """``{"input_ids", "attention_mask"}``, each of shape ``(length,)`` int64, left-padded."""
        input_ids = np.full(self.length, self.pad_id, dtype=np.int64)
        attention_mask = np.zeros(self.length, dtype=np.int64)
        if self._size:
            input_ids[-self._size :] = self._tokens[: self._size]
            attention_mask[-self._size :] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask}
