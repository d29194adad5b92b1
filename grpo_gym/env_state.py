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
        "window": [ids...], "pending": [ids...], "turn": 1, "transcript": ["prompt text", ...],
        "tools": {"calls": 1, "turns": 1}                # an env with tools: the episode's tool calls and turns
      }
    }

``spec`` is checked on ``set_state``: a state restores only into an env built with the same task name, window,
completion budget, action mode, turn budget and vocabulary size (anything else raises ``ValueError`` naming
the difference; an env with tools adds ``"tools"``, their names, and ``"max_tool_calls"``). Everything else about
the env (its tokenizer, template, reward model, tool functions) comes from its constructor, as with any Gymnasium
env.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

import numpy as np

from grpo_gym.tasks import Problem

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
        **({"tools": env.tools.names, "max_tool_calls": env.max_tool_calls} if env.tools is not None else {}),
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
        if env.tool_session is not None:
            episode["tools"] = {"calls": env.tool_session.calls, "turns": env.tool_session.turns}
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
    """Restore ``env`` from :func:`get_env_state`'s output; ``ValueError`` when it does not fit this env."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"not an R1ZeroEnv state (format {found!r}, expected {STATE_FORMAT!r})")
    spec = _spec(env)
    differences = {k: (v, spec.get(k)) for k, v in state.get("spec", {}).items() if spec.get(k) != v}
    if differences or state.get("spec", {}).keys() != spec.keys():
        shown = ", ".join(f"{k}: saved {saved!r}, this env {mine!r}" for k, (saved, mine) in differences.items())
        raise ValueError(f"the state was saved by a different env ({shown or 'spec keys differ'})")
    generator = _generator(state["np_random"])
    episode = state.get("episode")
    problem = restore_problem(env.task, episode["problem"]) if episode is not None else None
    if episode is not None:
        window = np.asarray(episode["window"], dtype=np.int64)
        pending = np.asarray(episode["pending"], dtype=np.int64)
        for name, ids in (("window", window), ("pending", pending)):
            if ids.ndim != 1 or (ids.size and (ids.min() < 0 or ids.max() >= env.codec.vocab_size)):
                raise ValueError(f"episode {name} ids must be a list of ids in [0, {env.codec.vocab_size})")
        if len(window) > env.context_length or len(pending) > env.max_new_tokens:
            raise ValueError("episode window or pending tokens longer than this env allows")
    tools = (episode or {}).get("tools", {"calls": 0, "turns": 0})
    counts = [tools.get(key) if isinstance(tools, dict) else None for key in ("calls", "turns")]
    if not all(isinstance(count, int) and count >= 0 for count in counts):
        raise ValueError(f"episode tools must be {{'calls': int >= 0, 'turns': int >= 0}}, got {tools!r}")
    # everything is checked: now change the env
    env.np_random = generator
    env.set_difficulty(state["difficulty"])
    env.set_reward_weights(state["reward_weights"])
    env.reward_fn.error_counts.update({k: int(v) for k, v in state.get("reward_error_counts", {}).items()})
    env.task.set_state(state.get("task"))
    env._warned_cut = bool(state.get("warned", {}).get("prompt_cut", False))
    env.problem = problem
    if episode is None:
        env.window.reset(np.zeros(0, dtype=np.int64))
        env._pending, env._turn, env._transcript = [], 0, []
    else:
        env.window.reset(window)
        env._pending = pending.tolist()
        env._turn = int(episode["turn"])
        env._transcript = [str(text) for text in episode["transcript"]]
    if env.tool_session is not None:
        env.tool_session.reset(tools["calls"], tools["turns"])


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
