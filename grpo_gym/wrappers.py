"""Gym interop: any Gymnasium env with text observations and text actions, as an env a language model trains on.

:class:`LMEnvWrapper` wraps an env whose observations become text (``obs_to_text``, ``str`` by default) and whose
``step`` takes what ``action_parser`` makes of the model's completion (the text itself by default); the hooks are
named as in verifiers' ``GymEnv``. It gives the env R1ZeroEnv's spaces and the methods GRPO and LMPPO call, so
``GRPO("TransformerPolicy", make_vec_env(lambda: LMEnvWrapper(MyTextEnv()), n_envs=8))`` trains on it:

- the first observation is shown in the template (``"compact"``: ``User: <text>\\nAssistant: ``), each later one as
  a user turn after the model's completion; the context window, left-padded, is the observation (as R1ZeroEnv's);
- an action is a completion (``max_new_tokens`` token ids, cut at EOS); the wrapped env's reward, ``terminated`` and
  ``truncated`` pass through, and so does its ``info`` (``is_success`` included). A reward that is not a real number
  (``"0.5"``) or flags that are not bools are the env's bug, raised naming it; a reward that is not finite or beyond
  float32's range scores 0 with the reason in ``info["reward_errors"]``, as a reward function's does;
- a completion ``action_parser`` refuses (it raises) is not sent to the wrapped env: the turn scores
  ``invalid_action_reward``, ``info["action_error"]`` says why, and the model reads ``Invalid action: <reason>``
  and tries again; ``max_turns`` model turns end the episode (``truncated``), as does a full window;
- a "problem" is the seed of an episode: :meth:`sample_problem` draws one, ``reset(options={"problem": p})``
  resets the wrapped env with ``seed=p.seed``; held-out problems are fixed seeds (:meth:`eval_problems`);
- a step before ``reset`` or after the episode ended raises :class:`~grpo_gym.episode_order.ResetNeeded`, before
  the wrapped env is stepped (:mod:`grpo_gym.episode_order`): a finished episode is never scored again;
- ``tools`` (:mod:`grpo_gym.tools`: functions, built-in names, or a :class:`~grpo_gym.tools.Toolbox` such as an
  OpenEnv server's MCP tools): the prompt shows them as R1ZeroEnv's does, and a completion holding ``<tool_call>``
  is a tool turn run here, as in R1ZeroEnv: its calls run, their results are appended, the wrapped env is not
  stepped, the turn scores 0 and ``info["tool_calls"]`` lists the calls; ``max_turns`` counts the other turns, and
  a tool turn after ``max_tool_calls`` calls ends the episode (``truncated``).

There are no gold solutions for a cold start: train with ``cold_start=False``, or give
``cold_start_kwargs={"data": ...}``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from grpo_gym.actions import action_space, completion_ids, observation_space, split_completion, text_action
from grpo_gym.context import ContextWindow
from grpo_gym.episode_order import EpisodeOrder
from grpo_gym.rewards.values import returned_flag, reward_number
from grpo_gym.tasks.base import Problem, Task, Verdict, check_difficulty
from grpo_gym.templates import PromptFormatter
from grpo_gym.tokenizer import TokenCodec, load_tokenizer
from grpo_gym.tools import DEFAULT_TIMEOUT, Toolbox, error_text
from grpo_gym.turns import ToolSession
from grpo_gym.validation import ReturnTypeError, check_float, check_int, show_value, user_stacklevel


class EpisodeSeeds(Task):
    """The "problems" of a wrapped env: the seeds its episodes reset with (a problem's text is its first observation,
    known only at reset). There is nothing to verify and no gold solution.

    :param name: the task's name (``"gym:<env id>"``)
    """

    def __init__(self, name: str) -> None:
        self.name = name  # type: ignore[misc]

    def sample(self, difficulty: float, rng: np.random.Generator) -> Problem:
        """An episode at ``difficulty`` (its seed is set by the caller: ``sample_problem``, ``sample_seeded``)."""
        return Problem(prompt="", answer="", task=self.name, difficulty=check_difficulty(difficulty))

    def verify(self, problem: Problem, answer: str) -> Verdict:
        """Not used: the wrapped env's reward scores an episode."""
        return Verdict(False, "a wrapped env's reward scores its episodes")

    def solution(self, problem: Problem) -> tuple[str, str]:
        """No gold solutions: train with ``cold_start=False`` or ``cold_start_kwargs={"data": ...}``."""
        raise ValueError(
            f"{self.name} has no gold solutions: train with cold_start=False, or give the cold start its rows: "
            "cold_start_kwargs={'data': ...}"
        )


class LMEnvWrapper(gym.Wrapper):
    """A Gymnasium env with text observations and text actions as a trainable language-model env (module docstring).

    :param env: the wrapped env
    :param tokenizer: ``None`` for the built-in character tokenizer, a tokenizer object, or a local path
    :param obs_to_text: an observation as the text the model reads
    :param action_parser: a completion's text as the wrapped env's action (raise ``ValueError``, or any exception,
        to refuse it)
    :param context_length: the context window size in tokens
    :param max_new_tokens: the completion budget of one turn
    :param max_turns: model turns per episode before it is truncated
    :param template: ``"compact"``, ``"r1zero"`` or a format string with ``{prompt}`` (see :mod:`grpo_gym.templates`)
    :param use_chat_template: use the tokenizer's chat template when it has one (``"auto"``)
    :param invalid_action_reward: the reward of a turn whose completion ``action_parser`` refused
    :param difficulty: the level recorded on problems (the wrapped env does not read it)
    :param tools: tools the model may call (see the module docstring): a list of functions and built-in names, a dict
        ``{name: fn}``, or a :class:`~grpo_gym.tools.Toolbox`; ``None`` for none
    :param max_tool_calls: the calls an episode may make
    :param tool_timeout: seconds a call may run before it is abandoned (a ``Toolbox`` keeps its own)
    """

    def __init__(
        self,
        env: gym.Env,
        tokenizer: Any = None,
        obs_to_text: Callable[[Any], str] = str,
        action_parser: Callable[[str], Any] = lambda text: text,
        context_length: int = 1024,
        max_new_tokens: int = 64,
        max_turns: int = 16,
        template: str = "compact",
        use_chat_template: bool | str = "auto",
        invalid_action_reward: float = 0.0,
        difficulty: float = 0.5,
        tools: Any = None,
        max_tool_calls: int = 4,
        tool_timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(env)
        self.context_length: int = check_int("context_length", context_length, low=2)  # type: ignore[assignment]
        self.max_new_tokens: int = check_int(  # type: ignore[assignment]
            "max_new_tokens", max_new_tokens, low=1, high=self.context_length - 1
        )
        self.max_turns: int = check_int("max_turns", max_turns, low=1)  # type: ignore[assignment]
        self.invalid_action_reward: float = check_float("invalid_action_reward", invalid_action_reward)  # type: ignore[assignment]
        self.difficulty = check_difficulty(difficulty)
        self.obs_to_text, self.action_parser = obs_to_text, action_parser
        self.tokenizer = load_tokenizer(tokenizer)
        self.codec = TokenCodec(self.tokenizer)
        self.tools = tools if isinstance(tools, Toolbox) or tools is None else Toolbox(tools, tool_timeout)
        schemas = None if self.tools is None else self.tools.schemas
        self.formatter = PromptFormatter(template, self.tokenizer, use_chat_template, schemas)
        max_tool_calls = check_int("max_tool_calls", max_tool_calls, low=1)  # type: ignore[assignment]
        #: the tool calls of the episode in progress
        self.tool_session = ToolSession(self.tools, self.formatter, max_tool_calls)
        self.task = EpisodeSeeds(f"gym:{env.spec.id if env.spec is not None else type(env.unwrapped).__name__}")
        self.observation_space = observation_space(self.codec.vocab_size, self.context_length)
        self.action_space = action_space(self.codec.vocab_size, self.max_new_tokens, "sequence")
        self.window = ContextWindow(self.context_length, self.codec.pad_id)
        self.problem: Problem | None = None
        #: whether an episode is in progress, its steps and how it ended (a step is refused outside one)
        self.order = EpisodeOrder(type(self).__name__)
        self._turn = 0
        self._seeds = np.random.default_rng()
        self._warned_reward = False

    # ------------------------------------------------------------------ what the algorithms call
    def set_difficulty(self, difficulty: float) -> None:
        """Set the level recorded on the next problems."""
        self.difficulty = check_difficulty(difficulty)

    def sample_problem(self, difficulty: float | None = None, seed: int | None = None) -> Problem:
        """An episode to play: the wrapped env reset with ``seed`` (default: drawn from this wrapper's generator)."""
        seed = int(self._seeds.integers(2**63 - 1)) if seed is None else check_int("seed", seed, low=0)
        return self.task.sample_seeded(self.difficulty if difficulty is None else difficulty, seed)

    def eval_problems(self, n: int, difficulty: float, seed: int = 0) -> list[Problem]:
        """``n`` held-out episodes: fixed seeds (:meth:`Task.eval_problems`)."""
        return self.task.eval_problems(n, difficulty, seed)

    def score_ahead(self, problems: list[Problem], actions: list[Any]) -> None:
        """Nothing to score ahead: the wrapped env's ``step`` scores each completion."""

    def encode_action(self, text: str) -> np.ndarray:
        """The action of a completion ``text``: its token ids, EOS, then padding to ``max_new_tokens``."""
        return text_action(text, self.codec, self.max_new_tokens)

    # ------------------------------------------------------------------ gymnasium API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Start an episode: ``options={"problem": p}`` resets the wrapped env with ``seed=p.seed``; otherwise a seed
        is drawn (from ``seed``, when given, as Gymnasium seeds an env)."""
        if seed is not None:
            self._seeds = np.random.default_rng(seed)
        problem = (options or {}).get("problem")
        self.problem = problem if isinstance(problem, Problem) else self.sample_problem()
        obs, info = self.env.reset(seed=self.problem.seed)
        text = self.formatter.prompt(self._text(obs))
        self.window.reset(self.codec.encode(text)[-self.context_length :])
        self._turn = 0
        self.tool_session.reset()
        self.order.start()
        return self.window.observation(), {**info, "prompt": text, "problem": self.problem}

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """One completion: parsed into the wrapped env's action and stepped (see the module docstring)."""
        self.order.check()
        result = self._step(action)
        self.order.stepped(result[2], result[3])
        return result

    def _step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """:meth:`step` within an episode."""
        body, length = split_completion(completion_ids(action, self.max_new_tokens, self.codec.vocab_size), self.codec)
        completion = self.codec.decode(body)
        self._turn += 1
        if self.tool_session.is_tool_turn(completion):
            return self._tool_turn(body, length, completion)
        try:
            parsed = self.action_parser(completion)
        except Exception as exc:  # model output is data: a refused action is information, not a crash
            reason = error_text(exc)
            message, reward, terminated, truncated = (
                f"Invalid action: {reason}",
                self.invalid_action_reward,
                False,
                False,
            )
            info: dict[str, Any] = {"action_error": reason, "is_success": False}
        else:
            obs, reward, terminated, truncated, info = self.env.step(parsed)
            reward, info = self._checked_step(reward, terminated, truncated, info)
            message = self._text(obs)
        info = {**info, "completion": completion, "completion_length": length, "turn": self._turn}
        fits = self.window.append(body)
        if not (terminated or truncated):
            fits = self.window.append(self.codec.encode(self.formatter.feedback(message))) and fits
            answers = self._turn - self.tool_session.turns
            truncated = not fits or self.window.free <= self.max_new_tokens or answers >= self.max_turns
        return self.window.observation(), float(reward), bool(terminated), bool(truncated), info

    def _text(self, obs: Any) -> str:
        """``obs_to_text(obs)``; a value that is not text is refused, naming it (it was "'int' object is not
        iterable")."""
        text = self.obs_to_text(obs)
        if not isinstance(text, str):
            raise ReturnTypeError(
                f"obs_to_text returned {show_value(text)} for the observation {show_value(obs)}, not a str: it renders "
                "an observation as the text the model reads"
            )
        return text

    def _checked_step(self, reward: Any, terminated: Any, truncated: Any, info: Any) -> tuple[float, Any]:
        """The wrapped env's reward as a float, and its ``info``. A reward that is not a real number, or flags that
        are not bools, are the env's bug: raised, naming it. A reward that is not finite or lies beyond float32's
        range scores 0 with the reason in ``info["reward_errors"]["env"]`` (warned once), as a reward function's."""
        what = f"the wrapped env's step ({type(self.env.unwrapped).__name__})"
        contract = "a Gymnasium env's step returns (observation, reward: float, terminated: bool, truncated: bool, ...)"
        for name, flag in (("terminated", terminated), ("truncated", truncated)):
            returned_flag(f"{what}: {name}", flag, contract)
        try:
            return reward_number(what, reward, contract), info
        except ReturnTypeError:
            raise
        except ValueError as error:  # this step's reward error
            if not self._warned_reward:
                self._warned_reward = True
                note = "it scores 0 (further such rewards are in info['reward_errors'])"
                warnings.warn(f"{error}; {note}", RuntimeWarning, stacklevel=user_stacklevel())
            return 0.0, {**info, "reward_errors": {"env": error_text(error)}}

    def _tool_turn(
        self, body: np.ndarray, length: int, completion: str
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """Run a tool turn's calls and append their results; the wrapped env is not stepped."""
        turn, text = self.tool_session.play(completion)
        fits = self.window.append(body)
        if text is not None:
            fits = self.window.append(self.codec.encode(text)) and fits
        truncated = text is None or not fits or self.window.free <= self.max_new_tokens
        info = {"tool_calls": turn.records, "completion": completion, "completion_length": length, "turn": self._turn}
        return self.window.observation(), 0.0, False, bool(truncated), {**info, "is_success": False}
