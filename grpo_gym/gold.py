"""Cold-start examples: the task's gold solutions as the token ids of ``(prompt, completion)`` pairs.

A single-turn example is the templated prompt and ``<think>REASONING</think><answer>ANSWER</answer>`` + EOS. A
problem whose task gives no gold reasoning (a data row without ``solution``) gets :data:`STAND_IN_REASONING`, so
the target stays well formed.

With tools (``R1ZeroEnv(tools=...)``) and a task that has a tool-using gold solution
(:meth:`Task.tool_solution <grpo_gym.tasks.base.Task.tool_solution>`), a problem gives one example per model turn,
exactly as a rollout shows them to the policy: ``(prompt, tool calls + EOS)``, then ``(prompt + tool calls + the
tool results the env's own tools return, answer turn + EOS)``. The tool results are in the second example's
prompt, so the cold start trains on the model's turns only, as GRPO does.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from grpo_gym.tasks import Problem
from grpo_gym.tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

STAND_IN_REASONING = "The answer is {answer}."
"""The cold-start reasoning of a problem whose task gives no gold reasoning (so the target stays well formed)."""

Example = tuple[np.ndarray, np.ndarray]


def answer_text(reasoning: str, answer: str) -> str:
    """The R1-Zero completion ``<think>reasoning</think><answer>answer</answer>``."""
    return f"<think>{reasoning}</think><answer>{answer}</answer>"


def tool_call_text(calls: list[dict[str, Any]]) -> str:
    """The completion that makes ``calls`` in the Hermes format (:mod:`grpo_gym.tools`)."""
    return "".join(f"{TOOL_CALL_OPEN}{json.dumps(call, ensure_ascii=False)}{TOOL_CALL_CLOSE}" for call in calls)


def tool_examples(env: Any, problem: Problem) -> list[Example] | None:
    """The two examples of a tool-using gold solution of ``problem`` (see the module docstring), or ``None`` when
    the env (an :class:`~grpo_gym.env.R1ZeroEnv`, which imports this module) has no tools or the task no such
    solution with them."""
    solution = env.task.tool_solution(problem, env.tools.names) if env.tools is not None else None
    if solution is None:
        return None
    calls, reasoning, answer = solution
    calls_text = tool_call_text(calls)
    turn = env.tools.play(calls_text, env.max_tool_calls)  # the env's own tools give the results
    prompt = env.encode_prompt(problem.prompt_input)[0]
    first = env.codec.encode(calls_text)
    results = env.formatter.tool_results([record["name"] for record in turn.records], turn.messages)
    context = np.concatenate([prompt, first, env.codec.encode(results)])[-env.context_length :]
    final = env.codec.encode(answer_text(reasoning, answer))
    return [(prompt, np.append(first, env.codec.eos_id)), (context, np.append(final, env.codec.eos_id))]


def gold_examples(env: Any, n: int, difficulty: float | None = None) -> tuple[list[Example], int]:
    """``n`` examples from problems drawn like :meth:`R1ZeroEnv.sample_problem` (a tool-using solution gives two
    turns, the last one's may be cut to make ``n``), and how many had no gold reasoning and got the stand-in."""
    examples: list[Example] = []
    stand_ins = 0
    while len(examples) < n:
        problem = env.sample_problem(difficulty)
        turns = tool_examples(env, problem)
        if turns is not None:
            examples.extend(turns)
            continue
        reasoning, answer = env.task.solution(problem)
        if not str(reasoning).strip():  # no gold reasoning: a stand-in keeps the target well formed
            reasoning = STAND_IN_REASONING.format(answer=answer)
            stand_ins += 1
        examples.append(env.encode_example(problem.prompt_input, answer_text(reasoning, answer)))
    return examples[:n], stand_ins
