"""The saved state of an :class:`~grpo_gym.env.R1ZeroEnv`: what ``get_state()`` returns and ``set_state()`` takes.

The state is a plain, JSON-serialisable ``dict`` (``json.dumps`` works on it; no pickle)::

    {
      "format": "grpo-gym-env-state/1",
      "spec": {"task", "context_length", "max_new_tokens", "action_mode", "max_turns", "vocab_size"},
      "np_random": {...},            # the env's problem generator: numpy's bit_generator.state (e.g. PCG64)
      "difficulty": 0.35,            # the current level
      "reward_weights": {"syntax": 0.3, "consistency": 0.4, "task": 0.3},
      "reward_error_counts": {"syntax": 0, "consistency": 0, "task": 0},
      "task": None,                  # the task's own sampler state (Task.get_state()), None for built-in tasks
      "warned": {"prompt_cut": False},
      "episode": None | {            # the episode in progress (None before the first reset)
        "problem": {"seed": 123, "difficulty": 0.35}     # remade by the task from its seed, or
                   | {"fields": {...Problem fields...}}, # stored whole when it has no seed (pinned rows)
        "window": [ids...], "pending": [ids...], "turn": 1, "transcript": ["prompt text", ...]
      }
    }

``spec`` is checked on ``set_state``: a state restores only into an env built with the same task name, window,
completion budget, action mode, turn budget and vocabulary size (anything else raises ``ValueError`` naming
the difference). Everything else about the env (its tokenizer, template, reward model) comes from its
constructor, as with any Gymnasium env.

This module is the format alone, on plain data: :meth:`R1ZeroEnv.get_state <grpo_gym.env.R1ZeroEnv.get_state>`
hands :func:`make_state` its values, and :meth:`~grpo_gym.env.R1ZeroEnv.set_state` applies what :func:`read_state`
checked and parsed (everything is checked before anything is applied).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from grpo_gym.tasks import Problem, Task

STATE_FORMAT = "grpo-gym-env-state/1"
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")


def problem_state(task: Task, problem: Problem) -> dict[str, Any]:
    """A problem as JSON data: its seed when the task remakes it exactly from the seed, else all its fields."""
    if problem.seed is not None:
        remade = task.sample(problem.difficulty, np.random.default_rng(problem.seed))
        remade.seed = problem.seed
        if remade == problem:
            return {"seed": int(problem.seed), "difficulty": float(problem.difficulty)}
    fields = dataclasses.asdict(problem)
    try:
        json.dumps(fields)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"the current problem cannot be saved: its fields are not JSON data ({error}); keep Problem.metadata "
            "to numbers, strings, lists and dicts, or give the problem a seed the task remakes it from"
        ) from None
    return {"fields": fields}


def restore_problem(task: Task, state: dict[str, Any]) -> Problem:
    """The problem :func:`problem_state` described."""
    if "seed" in state:
        return task.sample_seeded(state["difficulty"], state["seed"])
    return Problem(**state["fields"])


def make_state(
    spec: dict[str, Any],
    np_random: np.random.Generator,
    difficulty: float,
    reward_weights: dict[str, float],
    reward_error_counts: dict[str, int],
    task_state: Any,
    warned_cut: bool,
    episode: dict[str, Any] | None,
) -> dict[str, Any]:
    """The state dict (see the module docstring) from an env's values; ``episode`` is ``{"problem":
    problem_state(...), "window", "pending", "turn", "transcript"}`` or None before the first reset."""
    return {
        "format": STATE_FORMAT,
        "spec": spec,
        "np_random": _jsonable(np_random.bit_generator.state),
        "difficulty": difficulty,
        "reward_weights": reward_weights,
        "reward_error_counts": dict(reward_error_counts),
        "task": task_state,
        "warned": {"prompt_cut": warned_cut},
        "episode": episode,
    }


@dataclasses.dataclass
class SavedEpisode:
    """The episode in progress of a checked state."""

    problem: Problem
    window: np.ndarray  # (n,) int64 token ids
    pending: list[int]
    turn: int
    transcript: list[str]


@dataclasses.dataclass
class SavedState:
    """A state checked by :func:`read_state`, parsed into what an env applies."""

    np_random: np.random.Generator
    difficulty: Any
    reward_weights: Any
    reward_error_counts: dict[str, int]
    task_state: Any
    warned_cut: bool
    episode: SavedEpisode | None


def read_state(
    state: Any, spec: dict[str, Any], task: Task, vocab_size: int, context_length: int, max_new_tokens: int
) -> SavedState:
    """Check ``state`` against the env it is for (its ``spec``, task, vocabulary size, window and completion budget)
    and parse it; ``ValueError`` naming what does not fit. The difficulty and reward weights are checked by the
    env's own setters."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"not an R1ZeroEnv state (format {found!r}, expected {STATE_FORMAT!r})")
    differences = {k: (v, spec.get(k)) for k, v in state.get("spec", {}).items() if spec.get(k) != v}
    if differences or state.get("spec", {}).keys() != spec.keys():
        shown = ", ".join(f"{k}: saved {saved!r}, this env {mine!r}" for k, (saved, mine) in differences.items())
        raise ValueError(f"the state was saved by a different env ({shown or 'spec keys differ'})")
    generator = _generator(state["np_random"])
    episode = state.get("episode")
    saved_episode = None
    if episode is not None:
        problem = restore_problem(task, episode["problem"])
        window = np.asarray(episode["window"], dtype=np.int64)
        pending = np.asarray(episode["pending"], dtype=np.int64)
        for name, ids in (("window", window), ("pending", pending)):
            if ids.ndim != 1 or (ids.size and (ids.min() < 0 or ids.max() >= vocab_size)):
                raise ValueError(f"episode {name} ids must be a list of ids in [0, {vocab_size})")
        if len(window) > context_length or len(pending) > max_new_tokens:
            raise ValueError("episode window or pending tokens longer than this env allows")
        transcript = [str(text) for text in episode["transcript"]]
        saved_episode = SavedEpisode(problem, window, pending.tolist(), int(episode["turn"]), transcript)
    return SavedState(
        np_random=generator,
        difficulty=state["difficulty"],
        reward_weights=state["reward_weights"],
        reward_error_counts={k: int(v) for k, v in state.get("reward_error_counts", {}).items()},
        task_state=state.get("task"),
        warned_cut=bool(state.get("warned", {}).get("prompt_cut", False)),
        episode=saved_episode,
    )


def _generator(state: Any) -> np.random.Generator:
    """A numpy ``Generator`` in the saved bit-generator state."""
    name = state.get("bit_generator") if isinstance(state, dict) else None
    if name not in _BIT_GENERATORS:
        raise ValueError(f"np_random: unknown bit generator {name!r}; expected one of {_BIT_GENERATORS}")
    bit_generator = getattr(np.random, name)()
    try:
        bit_generator.state = state
    except (TypeError, ValueError, KeyError) as error:
        raise ValueError(f"np_random: not a valid {name} state ({error})") from None
    return np.random.Generator(bit_generator)


def _jsonable(value: Any) -> Any:
    """numpy scalars and arrays inside a bit-generator state as Python ints and lists (MT19937 holds an array)."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
