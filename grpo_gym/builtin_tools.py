"""Built-in tools, named by a string in ``R1ZeroEnv(tools=["calculator"])`` (so a YAML preset can name them).

- ``calculator``: exact arithmetic on integers with ``+ - * /`` and parentheses, through the safe expression
  parser of :mod:`grpo_gym.tasks.safe_expr` (a hand-written recursive-descent parser: never ``eval``, bounded
  length, digits and nesting). The ``arithmetic`` task's gold solutions call it (:meth:`ArithmeticTask.tool_solution
  <grpo_gym.tasks.arithmetic.ArithmeticTask.tool_solution>`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grpo_gym.tasks.safe_expr import evaluate, format_number


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: integers with + - * / and parentheses, e.g. "37+48*2"

    Returns:
        The exact value: an integer such as "133", or a fraction such as "7/2".
    """
    return format_number(evaluate(expression).value)  # ExprError (a ValueError) names what is wrong


BUILTIN_TOOLS: dict[str, Callable[..., Any]] = {"calculator": calculator}
"""The built-in tools by name."""
