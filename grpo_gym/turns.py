"""What a finished turn of :class:`~grpo_gym.env.R1ZeroEnv` reports, and the tool calls of an episode.

:func:`turn_info` builds a turn's ``info`` (see the env's docstring for its keys). :class:`ToolSession` holds what
an episode with tools keeps between turns (the calls made against ``max_tool_calls``, the turns that made them)
and plays a tool turn: the calls run (:class:`~grpo_gym.tools.Toolbox`), and the text the env appends after it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from grpo_gym.rewards import RewardResult
from grpo_gym.templates import PromptFormatter
from grpo_gym.tools import Toolbox, ToolTurn, has_tool_call

TOOL_COMPONENTS = ("tool_calls", "tool_errors")
"""The reward components of an env with tools: per turn, the calls made and the calls that failed (weight 0)."""
TOOL_TURN_REASON = "a tool turn: the answer is scored when the model answers"


def turn_info(
    result: RewardResult,
    completion: str,
    body: np.ndarray,
    length: int,
    turn: int,
    difficulty: float,
    tool_calls: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """The ``info`` of a finished turn: the reward's components, reasons, errors and success, the completion, its
    length (EOS included) and whether it was cut at the budget, the turn, the difficulty; ``tool_calls`` (an env
    with tools), ``reward_metrics`` and ``reward_extra`` when there are any."""
    info = {
        "reward_components": result.components,
        "reward_reasons": result.reasons,
        "reward_errors": result.errors,
        "is_success": result.is_success,
        "completion": completion,
        "completion_length": length,
        "completion_clipped": len(body) == length,
        "turn": turn,
        "difficulty": difficulty,
    }
    if tool_calls is not None:
        info["tool_calls"] = tool_calls
    if result.metrics:
        info["reward_metrics"] = result.metrics
    if result.extra:
        info["reward_extra"] = result.extra
    return info


class ToolSession:
    """The tool calls of the episode in progress (an env without tools has one that sees no tool turns).

    :param toolbox: the env's tools, or ``None``
    :param formatter: lays out the tool results for the model
    :param max_calls: the calls an episode may make (``max_tool_calls``)
    """

    def __init__(self, toolbox: Toolbox | None, formatter: PromptFormatter, max_calls: int) -> None:
        self.toolbox = toolbox
        self.formatter = formatter
        self.max_calls = max_calls
        self.calls = 0
        """The calls this episode has made (within the limits)."""
        self.turns = 0
        """The turns of this episode that called tools."""

    @property
    def max_turns(self) -> int:
        """The most tool turns an episode can hold: each counts at least one call, and the one after the budget is
        spent ends the episode."""
        return 0 if self.toolbox is None else self.max_calls + 1

    def reset(self, calls: int = 0, turns: int = 0) -> None:
        """Start an episode (or continue a saved one with its counts, see :meth:`state`)."""
        self.calls, self.turns = int(calls), int(turns)

    def state(self) -> dict[str, int] | None:
        """The counts a saved episode carries (``{"calls", "turns"}``; ``None`` without tools)."""
        return None if self.toolbox is None else {"calls": self.calls, "turns": self.turns}

    def is_tool_turn(self, completion: str) -> bool:
        """Whether the completion calls tools (then it is not an answer); never without tools."""
        return self.toolbox is not None and has_tool_call(completion)

    def answer_scores(self) -> dict[str, float] | None:
        """The tool components of an answer turn: no calls (``None`` without tools: not components)."""
        return None if self.toolbox is None else dict.fromkeys(TOOL_COMPONENTS, 0.0)

    def answer_records(self) -> list[dict[str, Any]] | None:
        """``info["tool_calls"]`` of an answer turn: none (``None`` without tools: no such key)."""
        return None if self.toolbox is None else []

    def play(self, completion: str) -> tuple[ToolTurn, str | None]:
        """Run the calls of a tool turn; the text to append after it (its results), or ``None`` when the budget was
        spent before this turn: every call is refused and the episode ends."""
        assert self.toolbox is not None, "a tool turn needs tools (see is_tool_turn)"
        spent = self.calls >= self.max_calls
        turn = self.toolbox.play(completion, self.max_calls - self.calls)
        self.turns += 1
        self.calls += turn.calls
        if spent:
            return turn, None
        return turn, self.formatter.tool_results([record["name"] for record in turn.records], turn.messages)

    @staticmethod
    def scores(turn: ToolTurn) -> dict[str, float]:
        """The tool components of a tool turn: its calls and its failed calls."""
        return {"tool_calls": float(turn.calls), "tool_errors": float(turn.errors)}
