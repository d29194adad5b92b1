"""Cold-start examples: the task's gold solutions as the token ids of ``(prompt, completion)`` pairs.

A single-turn example is the templated prompt and ``<think>REASONING</think><answer>ANSWER</answer>`` + EOS. A
problem whose task gives no gold reasoning (a data row without ``solution``) gets :data:`STAND_IN_REASONING`, so
the target stays well formed.

With tools (``R1ZeroEnv(tools=...)``) and a task that has a tool-using gold solution
(:meth:`Task.tool_solution <grpo_gym.tasks.base.Task.tool_solution>`), a problem gives one example per model turn,
exactly as a rollout shows them to the policy: ``(prompt, tool calls + EOS)``, then ``(prompt + tool calls + the
tool results the env's own tools return, answer turn + EOS)``. The tool results are in the second example's
prompt, so the cold start trains on the model's turns only, as GRPO does.

``episodes=True`` gives the same turns as one example per problem, ``(prompt, completion, roles)``: the completion
is the whole episode after the prompt (tool calls, tool results, answer, EOS) and ``roles`` says what each of its
tokens is (:data:`MODEL_TOKEN`, :data:`ENV_TOKEN`, :data:`TURN_END`): the cold start trains on the model's tokens
and each turn's EOS, attends to the env's tokens without training on them, and hides a turn's EOS from the tokens
after it, so each turn sees exactly the context a rollout shows it, at the same positions, with the prompt and the
first turn run once instead of twice (:func:`episode_turns` gives back the per-turn examples). A problem without a
tool-using solution (or whose episode does not fit the window) gives its turns as episodes of one turn.
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
EpisodeExample = tuple[np.ndarray, np.ndarray, np.ndarray]

MODEL_TOKEN, ENV_TOKEN, TURN_END = 1, 0, 2
"""The ``roles`` of an episode example's tokens: the model's (trained on), the env's (context: attended to, not
trained on), and a turn's EOS (trained on, hidden from the tokens after it: the env does not keep it)."""


def answer_text(reasoning: str, answer: str) -> str:
    """The R1-Zero completion ``<think>reasoning</think><answer>answer</answer>``."""
    return f"<think>{reasoning}</think><answer>{answer}</answer>"


def tool_call_text(calls: list[dict[str, Any]]) -> str:
    """The completion that makes ``calls`` in the Hermes format (:mod:`grpo_gym.tools`)."""
    return "".join(f"{TOOL_CALL_OPEN}{json.dumps(call, ensure_ascii=False)}{TOOL_CALL_CLOSE}" for call in calls)


def _tool_turns(env: Any, problem: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The token ids of a tool-using gold solution of ``problem``: the prompt, the calls, the env's tool results
    and the answer turn (no EOS), or ``None`` when the env (an :class:`~grpo_gym.env.R1ZeroEnv`, which imports this
    module) has no tools or the task no such solution with them."""
    solution = env.task.tool_solution(problem, env.tools.names) if env.tools is not None else None
    if solution is None:
        return None
    calls, reasoning, answer = solution
    calls_text = tool_call_text(calls)
    turn = env.tools.play(calls_text, env.max_tool_calls)  # the env's own tools give the results
    results = env.formatter.tool_results([record["name"] for record in turn.records], turn.messages)
    codec = env.codec
    prompt = env.encode_prompt(problem.prompt_input)[0]
    return prompt, codec.encode(calls_text), codec.encode(results), codec.encode(answer_text(reasoning, answer))


def tool_examples(env: Any, problem: Problem) -> list[Example] | None:
    """The two examples of a tool-using gold solution of ``problem`` (see the module docstring), or ``None`` when
    the env has no tools or the task no such solution with them."""
    turns = _tool_turns(env, problem)
    if turns is None:
        return None
    prompt, first, results, final = turns
    context = np.concatenate([prompt, first, results])[-env.context_length :]
    eos = env.codec.eos_id
    return [(prompt, np.append(first, eos)), (context, np.append(final, eos))]


def tool_episode(env: Any, problem: Problem) -> EpisodeExample | None:
    """The tool-using gold solution of ``problem`` as one episode example ``(prompt, completion, roles)`` (see the
    module docstring), or ``None`` when the env has no tools, the task no such solution with them, or the answer
    turn's context would not fit the env's window (which then drops its oldest tokens: :func:`tool_examples` cuts
    it as the env does)."""
    turns = _tool_turns(env, problem)
    if turns is None:
        return None
    prompt, first, results, final = turns
    if len(prompt) + len(first) + len(results) > env.context_length:
        return None
    eos = np.array([env.codec.eos_id], dtype=np.int64)
    completion = np.concatenate([first, eos, results, final, eos])
    roles = np.concatenate(
        [np.full(len(first), MODEL_TOKEN), [TURN_END], np.full(len(results), ENV_TOKEN),
         np.full(len(final), MODEL_TOKEN), [TURN_END]]
    ).astype(np.int8)  # fmt: skip
    return prompt, completion, roles


def one_turn(example: Example) -> EpisodeExample:
    """A ``(prompt, completion)`` example as an episode example of one model turn."""
    prompt, completion = example
    roles = np.full(len(completion), MODEL_TOKEN, dtype=np.int8)
    roles[-1] = TURN_END
    return prompt, completion, roles


def episode_turns(example: EpisodeExample) -> list[Example]:
    """An episode example's model turns as ``(context, turn + EOS)`` examples, each context what a rollout shows
    that turn: the prompt and everything before the turn, the earlier turns' EOSes left out (uncut: a rollout cuts
    a context to the policy's window)."""
    prompt, completion, roles = example
    turns, context, start = [], np.asarray(prompt), 0
    for end in np.flatnonzero(roles == TURN_END):
        part, own = completion[start : end + 1], roles[start : end + 1]
        env_tokens = int(np.argmax(own != ENV_TOKEN))  # the env's tokens open a turn (the tool results)
        context = np.concatenate([context, part[:env_tokens]])
        turns.append((context, part[env_tokens:]))
        context = np.concatenate([context, part[env_tokens:-1]])
        start = end + 1
    return turns


def gold_examples(
    env: Any, n: int, difficulty: float | None = None, episodes: bool = False
) -> tuple[list[Example] | list[EpisodeExample], int]:
    """Examples from problems drawn like :meth:`R1ZeroEnv.sample_problem`, ``n`` model turns of them (a tool-using
    solution has two; one example per turn, the last one's may be cut to make ``n``; with ``episodes``, one episode
    example per problem, until they hold ``n`` turns or one more), and how many had no gold reasoning and got the
    stand-in."""
    examples: list[Any] = []
    turns = stand_ins = 0
    while turns < n:
        problem = env.sample_problem(difficulty)
        episode = tool_episode(env, problem) if episodes else None
        if episode is not None:
            examples.append(episode)
            turns += 2
            continue
        split = tool_examples(env, problem)
        if split is not None:
            examples.extend([one_turn(example) for example in split] if episodes else split)
            turns += len(split)
            continue
        reasoning, answer = env.task.solution(problem)
        if not str(reasoning).strip():  # no gold reasoning: a stand-in keeps the target well formed
            reasoning = STAND_IN_REASONING.format(answer=answer)
            stand_ins += 1
        example = env.encode_example(problem.prompt_input, answer_text(reasoning, answer))
        examples.append(one_turn(example) if episodes else example)
        turns += 1
    return (examples if episodes else examples[:n]), stand_ins
