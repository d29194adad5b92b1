"""The saved state of an :class:`~grpo_gym.env.R1ZeroEnv`: what ``get_state()`` returns and ``set_state()`` takes.

The state is a plain, JSON-serialisable ``dict`` (``json.dumps`` works on it; no pickle)::

    {
      "format": "grpo-gym-env-state/2",
      "spec": {"task", "context_length", "max_new_tokens", "action_mode", "max_turns", "vocab_size"},
      "np_random": {...},            # the env's problem generator: numpy's bit_generator.state (e.g. PCG64)
      "difficulty": 0.35,            # the current level
      "reward_weights": {"syntax": 0.3, "consistency": 0.4, "task": 0.3},
      "reward_error_counts": {"syntax": 0, "consistency": 0, "task": 0},
      "task": None,                  # the task's own sampler state (Task.get_state()), None for built-in tasks
      "warned": {"prompt_cut": False},
      "episode": None | {            # the episode in progress or ended (None before the first reset)
        "problem": {"seed": 123, "difficulty": 0.35}     # remade by the task from its seed, or
                   | {"fields": {...Problem fields...}}, # stored whole when it has no seed (pinned rows)
        "window": [ids...], "pending": [ids...], "turn": 1, "transcript": ["prompt text", ...],
        "tools": None | {"calls": 1, "turns": 1},        # an env with tools: the episode's tool calls and turns
        "steps": 1, "ended": None | "terminated" | "truncated"  # its steps; how it ended (then it takes no step)
      }
    }

A state holds every field above (and its episode, every one of its fields): one that lacks any was edited or damaged,
and is refused naming them (a default in its place would continue another run than the one saved). A state of an
earlier format (:data:`OLDER_STATE_FORMATS`) lacks the fields added since, which take their defaults with a warning
naming them: a ``grpo-gym-env-state/1`` episode may have no ``tools`` (None: no tool calls), no ``steps`` (its turns
are taken) and no ``ended`` (None: it goes on).

``spec`` is checked on ``set_state``: a state restores only into an env built with the same task name, window,
completion budget, action mode, turn budget and vocabulary size (anything else raises ``ValueError`` naming
the difference; an env with tools adds ``"tools"``, their names, and ``"max_tool_calls"``). Everything else about
the env (its tokenizer, template, reward model, tool functions) comes from its constructor, as with any Gymnasium
env.

This module is the format alone, on plain data: :meth:`R1ZeroEnv.get_state <grpo_gym.env.R1ZeroEnv.get_state>`
hands :func:`make_state` its values, and :meth:`~grpo_gym.env.R1ZeroEnv.set_state` applies what :func:`read_state`
checked and parsed (everything is checked before anything is applied).
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from grpo_gym.episode_order import ENDINGS
from grpo_gym.tasks import Problem, Task, check_difficulty
from grpo_gym.tasks.base import check_prompt
from grpo_gym.validation import check_bool, check_int, check_mapping, user_stacklevel

#: the format of the states this version writes: a state of it holds every field of :data:`STATE_FIELDS` and
#: :data:`EPISODE_FIELDS`; a field added later makes a new format, so that the states written before it read as older
STATE_FORMAT = "grpo-gym-env-state/2"
#: the formats earlier versions wrote, each with the episode fields it may lack (added since): each takes its default
#: (:data:`EPISODE_DEFAULTS`), with a warning naming it
OLDER_STATE_FORMATS = {"grpo-gym-env-state/1": ("tools", "steps", "ended")}
#: the defaults of the episode fields an older state lacks, as a warning names them
EPISODE_DEFAULTS = {"tools": "None (no tool calls)", "steps": "its turns", "ended": "None (it goes on)"}
#: the fields every state holds
STATE_FIELDS = ("spec", "np_random", "difficulty", "reward_weights", "reward_error_counts", "task", "warned", "episode")
#: the fields every saved episode holds
EPISODE_FIELDS = ("problem", "window", "pending", "turn", "transcript", "tools", "steps", "ended")
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
    problem_state(...), "window", "pending", "turn", "transcript", "tools", "steps", "ended"}`` or None before the
    first reset."""
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
class SavedState:
    """A state checked by :func:`read_state`: every value as the env applies it."""

    np_random: np.random.Generator
    difficulty: float
    reward_weights: dict[str, float]
    reward_error_counts: dict[str, int]
    task_state: Any  # checked by the task itself, when the env applies it
    warned_cut: bool
    problem: Problem | None  # the episode in progress (None: before the first reset)
    window: np.ndarray  # (n,) int64 token ids
    pending: list[int]
    turn: int
    transcript: list[str]
    tool_counts: tuple[int, int]  # the episode's tool calls and tool turns ((0, 0) without tools)
    progress: tuple[int, str | None]  # the episode's steps, and how it ended (None: it goes on)


@dataclasses.dataclass(frozen=True)
class StateLimits:
    """What a state must fit: the env's ``spec``, task, reward components, vocabulary size, window, completion
    budget, the most turns of an episode (tool turns included), its ``max_tool_calls`` (``None``: no tools), and
    its check of reward weights."""

    spec: dict[str, Any]
    task: Task
    reward_names: tuple[str, ...]
    check_weights: Callable[[Any], dict[str, float]]
    vocab_size: int
    context_length: int
    max_new_tokens: int
    max_turns: int
    max_tool_calls: int | None = None


def read_state(state: Any, limits: StateLimits) -> SavedState:
    """Every part of a saved state checked against the env it is for, as the values the env applies; a
    ``ValueError`` naming the part that does not fit (nothing is changed: the env applies only what this returns)."""
    if not isinstance(state, dict) or state.get("format") not in (STATE_FORMAT, *OLDER_STATE_FORMATS):
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"not an R1ZeroEnv state (format {found!r}, expected {STATE_FORMAT!r})")
    _check_complete(state, limits.reward_names)
    spec, saved = limits.spec, state.get("spec")
    saved = saved if isinstance(saved, dict) else {}
    differences = {k: (v, spec.get(k)) for k, v in saved.items() if spec.get(k) != v}
    if differences or saved.keys() != spec.keys():
        shown = ", ".join(f"{k}: saved {old!r}, this env {mine!r}" for k, (old, mine) in differences.items())
        raise ValueError(f"the state was saved by a different env ({shown or 'spec keys differ'})")
    warned = state.get("warned", {})
    if isinstance(warned, dict):
        warned_cut = check_bool("state['warned']['prompt_cut']", warned.get("prompt_cut"))
    else:
        warned_cut = check_bool("state['warned']", warned)
    return SavedState(
        np_random=_generator(state.get("np_random")),
        difficulty=check_difficulty(state.get("difficulty"), name="state['difficulty']"),
        reward_weights=limits.check_weights(state.get("reward_weights")),
        reward_error_counts=_error_counts(limits.reward_names, state.get("reward_error_counts")),
        task_state=state.get("task"),
        warned_cut=warned_cut,
        **_checked_episode(limits, state.get("episode")),
    )


def _check_complete(state: dict[str, Any], reward_names: tuple[str, ...]) -> None:
    """Refuse a state that lacks a field every state of its format holds (module docstring), naming each; warn, naming
    them, when a state of an earlier format lacks the episode fields added since (they take their defaults)."""
    added = OLDER_STATE_FORMATS.get(state["format"], ())
    missing = [f"state[{key!r}]" for key in STATE_FIELDS if key not in state]
    parts = {"warned": ("prompt_cut",), "reward_weights": reward_names, "reward_error_counts": reward_names}
    for part, keys in parts.items():
        found = state.get(part)
        if isinstance(found, dict):  # (what is not a dict is refused where the part is read)
            missing += [f"state[{part!r}][{key!r}]" for key in keys if key not in found]
    episode, older = state.get("episode"), []
    if isinstance(episode, dict):
        for key in EPISODE_FIELDS:
            if key not in episode:
                if key in added:
                    older.append(f"state['episode'][{key!r}] (default {EPISODE_DEFAULTS[key]})")
                else:
                    missing.append(f"state['episode'][{key!r}]")
    if missing:
        raise ValueError(
            f"the R1ZeroEnv state lacks {', '.join(missing)}, which every state of format {state['format']!r} holds: "
            "it was edited or damaged; use another save (a checkpoint's previous iteration, or the run's --save-path)"
        )
    if older:
        warnings.warn(
            f"the R1ZeroEnv state was written by an earlier version of grpo-gym (format {state['format']!r}) and "
            f"records no {', '.join(older)}: each takes its default; save it again to record them",
            stacklevel=user_stacklevel(),
        )


def _error_counts(names: tuple[str, ...], counts: Any) -> dict[str, int]:
    checked = check_mapping("state['reward_error_counts']", counts, names, allow_none=False)
    return {name: check_int(f"state['reward_error_counts'][{name!r}]", n, low=0) for name, n in checked.items()}


def _checked_episode(limits: StateLimits, episode: Any) -> dict[str, Any]:
    """The episode, checked: its problem, window and pending ids, turn, transcript, tool counts, steps and end."""
    empty = np.zeros(0, dtype=np.int64)
    if episode is None:
        nothing = {"pending": [], "turn": 0, "transcript": [], "tool_counts": (0, 0), "progress": (0, None)}
        return {"problem": None, "window": empty, **nothing}
    if not isinstance(episode, dict):
        raise ValueError(f"state['episode'] must be None or a dict, got {type(episode).__name__}")
    try:
        problem = restore_problem(limits.task, episode["problem"])
        check_prompt(problem)
        ids = {name: np.asarray(episode[name], dtype=np.int64) for name in ("window", "pending")}
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise ValueError(f"state['episode'] is not a saved episode ({type(error).__name__}: {error})") from None
    for name, array in ids.items():
        if array.ndim != 1 or (array.size and (array.min() < 0 or array.max() >= limits.vocab_size)):
            raise ValueError(f"episode {name} ids must be a list of ids in [0, {limits.vocab_size})")
    if len(ids["window"]) > limits.context_length or len(ids["pending"]) > limits.max_new_tokens:
        raise ValueError("episode window or pending tokens longer than this env allows")
    transcript = episode.get("transcript")
    if not isinstance(transcript, list) or not all(isinstance(text, str) for text in transcript):
        raise ValueError("state['episode']['transcript'] must be a list of texts")
    turn = check_int("state['episode']['turn']", episode.get("turn"), low=0, high=limits.max_turns)
    tool_counts = _tool_counts(limits.max_tool_calls, episode.get("tools"), turn)
    steps = check_int("state['episode']['steps']", episode.get("steps", turn), low=0)  # an older state's: its turns
    ended = episode.get("ended")
    if ended not in (None, *ENDINGS):
        raise ValueError(f"state['episode']['ended'] must be None, 'terminated' or 'truncated', got {ended!r:.100}")
    return {
        "problem": problem,
        **ids,
        "pending": ids["pending"].tolist(),
        "turn": turn,
        "transcript": list(transcript),
        "tool_counts": tool_counts,
        "progress": (steps, ended),
    }


def _tool_counts(max_calls: int | None, tools: Any, turn: int) -> tuple[int, int]:
    """The episode's ``(calls, turns)`` of tools, checked: none without tools; with them, at most ``max_calls``
    calls, and tool turns among the episode's ``turn`` turns, at most one past the call budget."""
    if max_calls is None:
        if tools is not None:
            raise ValueError("state['episode']['tools'] must be None: this env has no tools")
        return 0, 0
    if not isinstance(tools, dict) or tools.keys() != {"calls", "turns"}:
        raise ValueError(f"state['episode']['tools'] must be {{'calls': int, 'turns': int}}, got {tools!r}")
    calls = check_int("state['episode']['tools']['calls']", tools["calls"], low=0, high=max_calls)
    turns = check_int("state['episode']['tools']['turns']", tools["turns"], low=0, high=min(turn, max_calls + 1))
    return calls, turns


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
