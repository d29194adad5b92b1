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
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

import numpy as np

from grpo_gym.tasks import Problem, check_difficulty
from grpo_gym.tasks.base import check_prompt
from grpo_gym.validation import check_bool, check_int, check_mapping

if TYPE_CHECKING:
    from grpo_gym.env import R1ZeroEnv
    from grpo_gym.tasks import Task

STATE_FORMAT = "grpo-gym-env-state/1"
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")


def _spec(env: R1ZeroEnv) -> dict[str, Any]:
    return {
        "task": env.task.name,
        "context_length": env.context_length,
        "max_new_tokens": env.max_new_tokens,
        "action_mode": env.action_mode,
        "max_turns": env.max_turns,
        "vocab_size": env.codec.vocab_size,
    }


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


def get_env_state(env: R1ZeroEnv) -> dict[str, Any]:
    """The state of ``env`` as described in the module docstring."""
    episode = None
    if env.problem is not None:
        episode = {
            "problem": problem_state(env.task, env.problem),
            "window": env.window.tokens().tolist(),
            "pending": [int(t) for t in env._pending],
            "turn": env._turn,
            "transcript": list(env._transcript),
        }
    return {
        "format": STATE_FORMAT,
        "spec": _spec(env),
        "np_random": _jsonable(env.np_random.bit_generator.state),
        "difficulty": env.difficulty,
        "reward_weights": env.reward_fn.weights,
        "reward_error_counts": dict(env.reward_fn.error_counts),
        "task": env.task.get_state(),
        "warned": {"prompt_cut": env._warned_cut},
        "episode": episode,
    }


def set_env_state(env: R1ZeroEnv, state: dict[str, Any]) -> None:
    """Restore ``env`` from :func:`get_env_state`'s output. The whole state is checked first
    (:func:`check_env_state`); a state that does not fit raises ``ValueError`` and leaves ``env`` exactly as it was."""
    checked = check_env_state(env, state)
    before = env.task.get_state()
    try:  # the one part only the task can check: applied first, undone if refused
        env.task.set_state(checked["task"])
    except Exception as error:
        env.task.set_state(before)
        raise ValueError(f"task: the task {env.task.name!r} refused its saved state ({error})") from None
    # everything is checked: now change the env
    env.np_random = checked["generator"]
    env.set_difficulty(checked["difficulty"])
    env.set_reward_weights(checked["reward_weights"])
    env.reward_fn.error_counts.update(checked["reward_error_counts"])
    env._warned_cut = checked["prompt_cut"]
    env.problem = checked["problem"]
    env.window.reset(checked["window"])
    env._pending, env._turn, env._transcript = checked["pending"], checked["turn"], checked["transcript"]


def check_env_state(env: R1ZeroEnv, state: Any) -> dict[str, Any]:
    """Every part of a saved state checked against ``env``, as the values :func:`set_env_state` applies; a
    ``ValueError`` naming the part that does not fit (``env`` is not changed)."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"not an R1ZeroEnv state (format {found!r}, expected {STATE_FORMAT!r})")
    spec, saved = _spec(env), state.get("spec")
    saved = saved if isinstance(saved, dict) else {}
    differences = {k: (v, spec.get(k)) for k, v in saved.items() if spec.get(k) != v}
    if differences or saved.keys() != spec.keys():
        shown = ", ".join(f"{k}: saved {old!r}, this env {mine!r}" for k, (old, mine) in differences.items())
        raise ValueError(f"the state was saved by a different env ({shown or 'spec keys differ'})")
    warned = state.get("warned", {})
    checked = {
        "generator": _generator(state.get("np_random")),
        "difficulty": check_difficulty(state.get("difficulty"), name="state['difficulty']"),
        "reward_weights": env.reward_fn.check_weights(state.get("reward_weights")),  # type: ignore[arg-type]
        "reward_error_counts": _error_counts(env, state.get("reward_error_counts", {})),
        "prompt_cut": check_bool("state['warned']['prompt_cut']", warned.get("prompt_cut", False))
        if isinstance(warned, dict)
        else check_bool("state['warned']", warned),
        "task": state.get("task"),
    }
    return {**checked, **_checked_episode(env, state.get("episode"))}


def _error_counts(env: R1ZeroEnv, counts: Any) -> dict[str, int]:
    names = env.reward_fn.names
    checked = check_mapping("state['reward_error_counts']", counts, names, allow_none=False)
    return {name: check_int(f"state['reward_error_counts'][{name!r}]", n, low=0) for name, n in checked.items()}


def _checked_episode(env: R1ZeroEnv, episode: Any) -> dict[str, Any]:
    """The episode in progress, checked: its problem, window and pending ids, turn and transcript."""
    empty = np.zeros(0, dtype=np.int64)
    if episode is None:
        return {"problem": None, "window": empty, "pending": [], "turn": 0, "transcript": []}
    if not isinstance(episode, dict):
        raise ValueError(f"state['episode'] must be None or a dict, got {type(episode).__name__}")
    try:
        problem = restore_problem(env.task, episode["problem"])
        check_prompt(problem)
        ids = {name: np.asarray(episode[name], dtype=np.int64) for name in ("window", "pending")}
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise ValueError(f"state['episode'] is not a saved episode ({type(error).__name__}: {error})") from None
    for name, array in ids.items():
        if array.ndim != 1 or (array.size and (array.min() < 0 or array.max() >= env.codec.vocab_size)):
            raise ValueError(f"episode {name} ids must be a list of ids in [0, {env.codec.vocab_size})")
    if len(ids["window"]) > env.context_length or len(ids["pending"]) > env.max_new_tokens:
        raise ValueError("episode window or pending tokens longer than this env allows")
    transcript = episode.get("transcript")
    if not isinstance(transcript, list) or not all(isinstance(text, str) for text in transcript):
        raise ValueError("state['episode']['transcript'] must be a list of texts")
    turn = check_int("state['episode']['turn']", episode.get("turn"), low=0, high=env.max_turns)
    return {"problem": problem, **ids, "pending": ids["pending"].tolist(), "turn": turn, "transcript": list(transcript)}


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
