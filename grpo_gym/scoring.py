"""Scoring ahead: the results of a batch of (problem, completion) pairs, kept until ``step`` plays each pair.

:meth:`R1ZeroEnv.score_ahead <grpo_gym.env.R1ZeroEnv.score_ahead>` scores a rollout's completions in one batch (one
call per reward function, one reward-model forward) and stores the results here, keyed by the problem's content and
the action's bytes; ``step(action)`` after ``reset(options={"problem": problem})`` takes the result of its pair
(each stored result is used once) instead of scoring alone. The key is content, not identity, so it holds when the
problem crossed a process boundary (``SubprocVecEnv`` pickles it for ``set_options`` and for ``env_method``).
Identical pairs (a group's identical completions) queue their results in order.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

from grpo_gym.tasks import Problem

Key = tuple[bytes, bytes]


def problem_key(problem: Any) -> bytes:
    """A digest of the problem's content (its pickle), equal for equal problems in any process."""
    return hashlib.blake2b(pickle.dumps(problem, protocol=4), digest_size=16).digest()


def action_key(ids: np.ndarray) -> bytes:
    """The bytes of an action's token ids as int64."""
    return np.ascontiguousarray(ids, dtype=np.int64).tobytes()


def check_ahead(action_mode: str, problems: Sequence[Any], actions: Sequence[Any]) -> None:
    """Refuse what ``score_ahead`` cannot score: token mode, unequal lengths, problems that are not ``Problem``s."""
    if action_mode != "sequence":
        raise ValueError("score_ahead scores whole completions: make the env with action_mode='sequence'")
    if len(problems) != len(actions):
        raise ValueError(f"got {len(problems)} problems but {len(actions)} actions")
    for problem in problems:
        if not isinstance(problem, Problem):
            raise ValueError(f"score_ahead takes grpo_gym.tasks.Problem objects, got {type(problem).__name__}")


class ScoreAhead:
    """Results scored ahead, waiting for the ``step`` of their (problem, action) pair."""

    def __init__(self) -> None:
        self._results: dict[Key, list[Any]] = {}

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._results.values())

    def store(self, problems: Sequence[Any], actions: Sequence[np.ndarray], results: Sequence[Any]) -> None:
        """Replace what is stored with one result per (problem, action) pair."""
        self._results = {}
        keys = {id(p): problem_key(p) for p in problems}  # a group's G completions share one problem object
        for problem, action, result in zip(problems, actions, results, strict=True):
            self._results.setdefault((keys[id(problem)], action_key(action)), []).append(result)

    def pop(self, problem: Any, action: np.ndarray) -> Any | None:
        """The stored result of this pair (removed), or ``None`` when there is none."""
        if not self._results:
            return None
        key = (problem_key(problem), action_key(action))
        queue = self._results.get(key)
        if not queue:
            return None
        result = queue.pop(0)
        if not queue:
            del self._results[key]
        return result

    def clear(self) -> None:
        """Drop every stored result."""
        self._results = {}
