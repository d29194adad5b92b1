"""``R1Zero-v0`` played with text: what the OpenEnv and GEM servings of it share.

A trainer elsewhere sends the model's completion as text and reads text back. :class:`R1ZeroText` drives an
:class:`~grpo_gym.env.R1ZeroEnv` that way: :meth:`~R1ZeroText.reset` gives the question and the prompt, each
:meth:`~R1ZeroText.step` takes a completion (encoded with the env's tokenizer; a text longer than
``max_new_tokens`` is cut, as a clipped completion) and gives a :class:`TextTurn`: the env's reward, whether the
episode ended, its ``info``, and what the model reads next, both as the bare ``message`` (the task's feedback after
a wrong answer, the tool results after a tool turn, ``""`` once the episode ended) and as the ``prompt`` text the env
appends to its own context (the message inside the template's turn markers).

:data:`TEXT_DEFAULTS` are the budgets of an env served as text unless given: a trainer elsewhere writes long
completions, and ``R1Zero-v0``'s own default of 64 new tokens would cut them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from grpo_gym.env import R1ZeroEnv
from grpo_gym.tasks import Verdict

TEXT_DEFAULTS = {"max_new_tokens": 4096, "context_length": 16384}
"""The token budgets of an env served as text, unless given (with the built-in tokenizer, a token is a character)."""


@dataclass
class TextTurn:
    """What one completion did (see the module docstring)."""

    message: str
    prompt: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)
    tool_turn: bool = False


def text_env(env_kwargs: dict[str, Any] | None = None) -> R1ZeroEnv:
    """An :class:`R1ZeroEnv` made with ``env_kwargs`` over :data:`TEXT_DEFAULTS` (the env checks every argument)."""
    kwargs = dict(env_kwargs or {})
    if "context_length" not in kwargs and "max_new_tokens" in kwargs:  # keep the window larger than the budget
        kwargs["context_length"] = max(TEXT_DEFAULTS["context_length"], 4 * int(kwargs["max_new_tokens"]))
    return R1ZeroEnv(**{**TEXT_DEFAULTS, **kwargs})


class R1ZeroText:
    """An :class:`R1ZeroEnv` driven by text (see the module docstring).

    :param env: the env (one episode at a time)
    """

    def __init__(self, env: R1ZeroEnv) -> None:
        if not isinstance(env, R1ZeroEnv):
            raise TypeError(f"R1ZeroText drives an R1ZeroEnv, got {type(env).__name__}")
        if env.action_mode != "sequence":
            raise ValueError("a text-driven env takes whole completions: make it with action_mode='sequence'")
        self.env = env

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The JSON schemas of the env's tools (OpenAI's function format; ``[]`` without tools)."""
        return [] if self.env.tools is None else list(self.env.tools.schemas)

    def reset(self, seed: int | None = None, difficulty: float | None = None) -> tuple[str, str, dict[str, Any]]:
        """Start an episode (from ``seed``, at ``difficulty``): its question (a conversation's messages laid out as
        plain text), the prompt the env renders around it, and the env's ``info``."""
        options = None if difficulty is None else {"difficulty": difficulty}
        _, info = self.env.reset(seed=seed, options=options)
        question = info["problem"].prompt_input
        if not isinstance(question, str):
            question = "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in question)
        return question, info["prompt"], info

    def step(self, completion: str) -> TextTurn:
        """Score one completion (see the module docstring)."""
        if not isinstance(completion, str):
            raise ValueError(f"a completion is text, got {type(completion).__name__}")
        env = self.env
        _, reward, terminated, truncated, info = env.step(env.encode_action(completion))
        message = prompt = ""
        tool_turn = env.tool_session.is_tool_turn(info["completion"])  # the env played it as a tool turn
        if tool_turn:
            records = info.get("tool_calls") or []
            results = [r["result"] if "error" not in r else f"Error: {r['error']}" for r in records]
            if not truncated:
                message = "\n".join(results)
                prompt = env.formatter.tool_results([r["name"] for r in records], results)
        elif not (terminated or truncated):
            message = env.task.feedback(env.problem, Verdict(False, info["reward_reasons"].get("task", "")))
            prompt = env.formatter.feedback(message)
        return TextTurn(message, prompt, float(reward), bool(terminated), bool(truncated), info, tool_turn)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> TextTurn:
        """Play a tool turn that makes one call, ``name(**arguments)``, as the model's ``<tool_call>`` would."""
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise ValueError("a tool call is a tool name (text) and its arguments (an object)")
        call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return self.step(f"<tool_call>{call}</tool_call>")
