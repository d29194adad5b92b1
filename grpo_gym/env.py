"""``R1ZeroEnv``: one R1-Zero episode as a Gymnasium environment."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from grpo_gym.actions import action_space, completion_ids, observation_space, split_completion, text_action, token_id
from grpo_gym.context import ContextWindow
from grpo_gym.describe import describe_env, env_kwargs_from_record
from grpo_gym.env_state import StateLimits, make_state, problem_state, read_state
from grpo_gym.episode_order import EpisodeOrder
from grpo_gym.gold import gold_examples
from grpo_gym.rewards import CompositeReward, RewardModelScorer
from grpo_gym.rewards.composite import TurnInput
from grpo_gym.rewards.timeouts import DEFAULT_REWARD_TIMEOUT
from grpo_gym.scoring import ScoreAhead, check_ahead
from grpo_gym.tasks import Problem, Task, Verdict, check_difficulty, make_task
from grpo_gym.tasks.base import check_prompt
from grpo_gym.templates import PromptFormatter
from grpo_gym.tokenizer import TokenCodec, load_tokenizer
from grpo_gym.tools import DEFAULT_TIMEOUT, Toolbox
from grpo_gym.trl_names import NOT_THE_ENVS, with_trl_hints
from grpo_gym.turns import TOOL_COMPONENTS, TOOL_TURN_REASON, ToolSession, turn_info
from grpo_gym.validation import ArgumentError, check_choice, check_float, check_int

ACTION_MODES = ("sequence", "token")
RENDER_MODES = (None, "ansi", "human", "rgb_array")
ON_REWARD_ERROR = ("zero", "raise")


#: the largest token window an env allocates (1M tokens: an 8 MB observation per step) and the most turns of an
#: episode; larger values (e.g. from a crafted record) are refused before anything is allocated
MAX_CONTEXT_LENGTH, MAX_TURNS = 2**20, 10_000


class R1ZeroEnv(gym.Env):
    """R1-Zero-style reasoning episodes: a verifiable problem in, a scored ``<think>/<answer>`` completion out.

    **Description.** Each episode draws a problem from a task family (``arithmetic`` by default) at the
    current difficulty, shows it in the R1-Zero template, and scores the model's completion with the
    composite reward (syntax, consistency, task). With ``max_turns > 1`` a wrong answer gets feedback
    appended to the context and the model answers again (the episode's state transition).

    **Observation space.** ``Dict(input_ids=Box(0, vocab-1, (context_length,), int64),
    attention_mask=Box(0, 1, (context_length,), int64))``: the context window, left-padded so the newest
    token is last (see :mod:`grpo_gym.context` for the truncation rules). The prompt's ids are the template's
    constant text (encoded once per env) around the question (encoded at each reset); for the built-in
    character tokenizer that equals encoding the whole text, for a BPE tokenizer it can differ at the seams.

    **Action space.** ``action_mode="sequence"`` (default): one step is one whole completion,
    ``MultiDiscrete([vocab] * max_new_tokens)``; the completion ends at the first EOS (or pad) id and what
    follows is ignored. ``action_mode="token"``: one step is one token, ``Discrete(vocab)``; the turn ends at
    EOS or after ``max_new_tokens`` tokens. Ids outside the vocabulary or a wrong shape raise ``ValueError``.

    **Rewards.** Per finished turn: the weighted sum of named components (:mod:`grpo_gym.rewards.composite`),
    clipped to [-1, 1] unless you give reward functions (``reward_clip``): the built-ins ``syntax``,
    ``consistency``, ``task`` (0.3 / 0.4 / 0.3) and ``length`` (DAPO's overlong penalty, weight 0), and your
    ``reward_funcs`` (TRL's signature, weight 1); 0 for the tokens of an unfinished turn in token mode. A
    component that does not apply to a completion (``None``) is left out. A multi-turn episode is scored per model
    turn: each answer by all of them, each tool turn by ``length``, the tool components and the reward functions
    marked :func:`~grpo_gym.rewards.functions.per_turn`.
    ``info["reward_components"]`` holds every component (``None`` where not applicable), ``info["reward_reasons"]``
    why, ``info["is_success"]`` whether the task gave full credit. :meth:`score_ahead` scores a batch of
    completions in one call per reward function; ``step`` then takes each pair's result.

    **Reward errors.** An exception raised by the task's hooks, the reward model or a reward function is caught
    for that component: ``info["reward_errors"]`` maps it to ``"ExceptionType: message"``, the env warns once,
    and ``on_reward_error`` decides: ``"zero"`` scores it 0, ``"raise"`` re-raises; ``reward_fn.error_counts``.

    **Episode end.** ``terminated`` when the answer is correct or the turn budget is spent (the budget is part
    of the task). ``truncated`` when the context window cannot hold another turn. A step before ``reset`` or after
    the episode ended raises :class:`~grpo_gym.episode_order.ResetNeeded` (Gymnasium's ``ResetNeeded``): a finished
    episode is never scored again (:mod:`grpo_gym.episode_order`).

    **Tools** (``tools=[fn, ...]``; :mod:`grpo_gym.tools`, :mod:`grpo_gym.turns`): a completion holding
    ``<tool_call>`` is a tool turn: its calls run, their results are appended, and the model goes on until it answers
    (``max_turns`` counts answers) or a limit ends the episode (``truncated``: the window is full, or a tool turn
    comes after ``max_tool_calls`` calls). A tool turn scores ``length``, ``tool_calls`` and ``tool_errors`` (weight
    0) only; ``info["tool_calls"]`` lists its calls. What the env inserts is observation, never action: training on
    actions trains on the model's own tokens, and the episode's return credits every model turn.

    **Long prompts.** A prompt longer than the window costs ``O(context_length)`` tokenization: only its newest
    part is encoded (the same ids as encoding it whole and keeping the newest ``context_length``).

    **Saving and resuming.** :meth:`get_state` returns a JSON-serialisable dict with everything needed to
    continue exactly (generator, difficulty, weights, the task's sampler state, the episode in progress);
    :meth:`set_state` restores it into an env built with the same arguments (format: :mod:`grpo_gym.env_state`).
    :meth:`describe` records the constructor's arguments, :meth:`from_description` rebuilds the env from them.

    :param task: a task name (``"arithmetic"``, ``"countdown"``, ``"jsonl"``, ``"dataset"``,
        ``"reasoning_gym:<dataset>"``, a registered name or a ``"module:Class"`` path) or a ``Task``
    :param task_kwargs: keyword arguments for the task (e.g. ``{"path": "data.jsonl"}`` for ``jsonl``,
        ``{"data": ds, "prompt": "question"}`` for ``dataset``; see :mod:`grpo_gym.tasks`)
    :param tokenizer: ``None`` for the built-in character tokenizer, a tokenizer object, or a local path
    :param context_length: the context window size in tokens (the original design's 4096)
    :param max_new_tokens: the completion budget of one turn
    :param action_mode: ``"sequence"`` or ``"token"``
    :param max_turns: turns per episode (1: single answer)
    :param difficulty: the initial difficulty in [0.1, 1.0] (the dynamic curriculum starts at 0.3)
    :param template: ``"r1zero"``, ``"compact"`` or a format string with ``{prompt}``
    :param use_chat_template: use the tokenizer's chat template when it has one (``"auto"``)
    :param reward_weights: weights of the components (``syntax``, ``consistency``, ``task``, ``length`` and the names
        of ``reward_funcs``; partial dicts allowed; finite, negative allowed)
    :param reward_model: a :class:`RewardModelScorer` or a path to a sequence-classification model; when
        given, it scores the ``consistency`` component
    :param render_mode: ``None``, ``"ansi"`` (``render()`` returns the conversation) or ``"human"`` (prints it);
        ``"rgb_array"``, which SB3 requests by default, is accepted and renders nothing
    :param on_reward_error: ``"zero"`` (default: a reward component whose scoring raised scores 0, reported in
        ``info["reward_errors"]``) or ``"raise"`` (the exception propagates from ``step``, or from ``score_ahead``)
    :param reward_funcs: a list of functions (each named after its function, as TRL names them) or ``{name: fn}``,
        each ``fn(prompts, completions, **kwargs) -> list[float | None]`` (TRL's signature, ``async def`` allowed;
        ``"module:function"`` strings are imported; see :mod:`grpo_gym.rewards.functions` for what is passed)
    :param overlong_buffer: the ``length`` component's buffer in tokens: the penalty falls linearly from 0 at
        ``max_new_tokens - overlong_buffer`` tokens to -1 at ``max_new_tokens`` (default: ``max_new_tokens // 4``)
    :param reward_timeout: seconds a reward function call (sync or async), a reward-model scoring or a user task's
        verify (and consistency hooks) may take; past it that component scores 0 and is reported in
        ``info["reward_errors"]`` (a sync call is abandoned in a daemon thread, where it keeps running; see
        :mod:`grpo_gym.rewards.timeouts`). ``None``: no limit
    :param reward_clip: the total reward is clipped to ``[-reward_clip, reward_clip]``: ``"auto"`` is 1 (the original
        design's [-1, 1]) with the built-in components alone and no clip (``None``) when ``reward_funcs`` are given,
        as TRL sums its reward functions; a clip that changes a total warns once (``reward_fn.clipped_count``)
    :param tools: functions the model may call: a list (built-in names such as ``"calculator"`` allowed) or a dict
        ``{name: fn}`` (:mod:`grpo_gym.tools`); ``max_tool_calls`` per episode, each abandoned after ``tool_timeout`` s

    Every argument is checked here: integers must be integral (``4.0`` reads as 4, ``2.7`` is refused),
    numbers finite and in range, booleans real booleans, mappings free of unknown keys; a bad one raises
    :class:`~grpo_gym.validation.ArgumentError` (a ``ValueError`` and a ``TypeError``) naming it.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi", "human", "rgb_array"], "render_fps": 1}  # noqa: RUF012

    @with_trl_hints(otherwise=NOT_THE_ENVS)  # a TRL name (max_completion_length=...) raises a TypeError naming ours
    def __init__(
        self,
        task: str | Task = "arithmetic",
        task_kwargs: dict[str, Any] | None = None,
        tokenizer: Any = None,
        context_length: int = 4096,
        max_new_tokens: int = 64,
        action_mode: str = "sequence",
        max_turns: int = 1,
        difficulty: float = 0.3,
        template: str = "r1zero",
        use_chat_template: bool | str = "auto",
        reward_weights: dict[str, float] | None = None,
        reward_model: RewardModelScorer | str | os.PathLike | None = None,
        render_mode: str | None = None,
        on_reward_error: str = "zero",
        reward_funcs: Sequence[Callable[..., Any] | str] | Mapping[str, Callable[..., Any] | str] | None = None,
        overlong_buffer: int | None = None,
        reward_timeout: float | None = DEFAULT_REWARD_TIMEOUT,
        reward_clip: float | str | None = "auto",
        tools: Sequence[Any] | Mapping[str, Callable[..., Any]] | None = None,
        max_tool_calls: int = 4,
        tool_timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        #: the constructor's arguments as given (what :meth:`describe` records)
        self.init_arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        self.action_mode: str = check_choice("action_mode", action_mode, ACTION_MODES)
        # "rgb_array" is accepted only because SB3 (make_vec_env, string env ids) asks for it by default; a
        # text env has no frames, so render() returns None in that mode.
        self.render_mode = check_choice("render_mode", render_mode, RENDER_MODES)
        self.context_length: int = check_int(  # type: ignore[assignment]
            "context_length", context_length, low=2, high=MAX_CONTEXT_LENGTH, hint="the window is allocated per step"
        )
        self.max_new_tokens: int = check_int(  # type: ignore[assignment]
            "max_new_tokens",
            max_new_tokens,
            low=1,
            high=self.context_length - 1,
            hint=f"it must be smaller than context_length ({self.context_length})",
        )
        self.max_turns: int = check_int("max_turns", max_turns, low=1, high=MAX_TURNS)  # type: ignore[assignment]
        self.difficulty = check_difficulty(difficulty)
        on_reward_error = check_choice("on_reward_error", on_reward_error, ON_REWARD_ERROR)
        if task_kwargs is not None and not isinstance(task_kwargs, Mapping):
            raise ArgumentError(f"task_kwargs must be a dict of the task's arguments or None, got {task_kwargs!r}")
        self.task = make_task(task, **(task_kwargs or {}))
        self.tokenizer = load_tokenizer(tokenizer)
        self.codec = TokenCodec(self.tokenizer)
        self.max_tool_calls: int = check_int("max_tool_calls", max_tool_calls, low=1)  # type: ignore[assignment]
        tool_timeout = check_float("tool_timeout", tool_timeout, low=0.0, low_open=True)  # type: ignore[assignment]
        self.tools = None if tools is None else Toolbox(tools, tool_timeout)
        schemas = None if self.tools is None else self.tools.schemas
        self.formatter = PromptFormatter(template, self.tokenizer, use_chat_template, schemas)
        #: the tool calls of the episode in progress
        self.tool_session = ToolSession(self.tools, self.formatter, self.max_tool_calls)
        if isinstance(reward_model, (str, os.PathLike)):
            reward_model = RewardModelScorer(reward_model)
        self.reward_fn = CompositeReward(
            reward_weights,
            reward_model=reward_model,
            on_error=on_reward_error,
            reward_funcs=reward_funcs,
            max_new_tokens=self.max_new_tokens,
            overlong_buffer=overlong_buffer,
            column_names=lambda: self.task.column_names(self.difficulty),
            reward_timeout=reward_timeout,
            clip=reward_clip,
            env_components=TOOL_COMPONENTS if self.tools is not None else (),
        )

        self.observation_space = observation_space(self.codec.vocab_size, self.context_length)
        self.action_space = action_space(self.codec.vocab_size, self.max_new_tokens, self.action_mode)

        self.window = ContextWindow(self.context_length, self.codec.pad_id)
        # token ids of the constant text around a question / a feedback message (encoded once)
        self._prompt_affix_ids = tuple(self.codec.encode(text) for text in self.formatter.prompt_affixes)
        self._feedback_affix_ids = tuple(self.codec.encode(text) for text in self.formatter.feedback_affixes)
        self.problem: Problem | None = None
        #: whether an episode is in progress, its steps and how it ended (a step is refused outside one)
        self.order = EpisodeOrder(type(self).__name__)
        self._pending: list[int] = []  # token mode: the tokens of the unfinished turn
        self._turn = 0
        self._transcript: list[str] = []
        self._warned_cut = False  # warn once per env about prompts cut to fit the window
        self._ahead = ScoreAhead()
        self.gold_stand_ins = 0
        """How many :meth:`gold_examples` had no gold reasoning and got the stand-in (since construction)."""

    # ------------------------------------------------------------------ problems and levels
    def set_difficulty(self, difficulty: float) -> None:
        """Set the level of the next problems (kept until changed; see ``DynamicCurriculum.apply``)."""
        self.difficulty = check_difficulty(difficulty)

    def set_reward_weights(self, weights: dict[str, float]) -> None:
        """Change the weights of the reward components at run time (partial dicts allowed); scores computed ahead
        with the old weights are dropped."""
        self.reward_fn.set_weights(weights)
        self._ahead.clear()

    def sample_problem(self, difficulty: float | None = None, seed: int | None = None) -> Problem:
        """Draw a problem at ``difficulty`` (default: the current level) from ``seed``, or from the env's seeded
        generator when ``seed`` is None.

        The problem records its own seed, so ``task.sample(d, np.random.default_rng(problem.seed))`` remakes it.
        """
        level = self.difficulty if difficulty is None else check_difficulty(difficulty)
        seed = int(self.np_random.integers(2**63 - 1)) if seed is None else check_int("seed", seed, low=0)
        return self.task.sample_seeded(level, seed)

    def eval_problems(self, n: int, difficulty: float, seed: int = 0) -> list[Problem]:
        """The task's held-out problems (:meth:`Task.eval_problems`): fresh seeds, or the eval split of data."""
        return self.task.eval_problems(n, difficulty, seed)

    def _encode_between(self, text: str, affix_ids: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Ids of ``text`` inside the template: the cached affix ids around the encoded text."""
        return np.concatenate([affix_ids[0], self.codec.encode(text), affix_ids[1]])

    def encode_prompt(self, question: str | list[dict[str, str]]) -> tuple[np.ndarray, bool]:
        """The newest ``context_length`` ids of the templated prompt around ``question`` (or of a conversation, a
        list of messages, rendered whole: :meth:`PromptFormatter.prompt`), and whether older ones were cut;
        ``O(context_length)`` work for a question of any length (see the class docstring)."""
        if not isinstance(question, str):
            return self.codec.encode_tail(self.formatter.prompt(question), self.context_length)
        before, after = self._prompt_affix_ids
        ids, cut = self.codec.encode_tail(question, max(0, self.context_length - len(after)))
        ids = np.concatenate([before, ids, after])
        return ids[-self.context_length :], cut or len(ids) > self.context_length

    def encode_example(self, question: str | list[dict[str, str]], completion: str) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of a supervised example: the templated prompt (a question, or a conversation:
        ``problem.prompt_input``), and the completion followed by EOS."""
        return self.encode_prompt(question)[0], np.append(self.codec.encode(completion), self.codec.eos_id)

    def gold_examples(self, n: int, difficulty: float | None = None, episodes: bool = False) -> list[Any]:
        """``n`` cold-start examples from problems drawn like :meth:`sample_problem`: the task's gold
        solutions, one ``(prompt, completion)`` example per model turn, or with ``episodes`` one ``(prompt,
        completion, roles)`` example per problem, its whole episode (see :mod:`grpo_gym.gold`). :attr:`gold_stand_ins`
        counts the problems without gold reasoning, which got a stand-in (the cold start warns with the count)."""
        examples, stand_ins = gold_examples(self, n, difficulty, episodes)
        self.gold_stand_ins += stand_ins
        return examples

    def score_completion(
        self, problem: Problem, action: np.ndarray
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """``reset(options={"problem": problem})`` then ``step(action)``: one scored completion, as evaluation
        needs it (called through ``VecEnv.env_method`` it bypasses wrappers such as ``Monitor``)."""
        self.reset(options={"problem": problem})
        return self.step(action)

    def score_ahead(self, problems: Sequence[Problem], actions: Sequence[Any]) -> None:
        """Score the completions ``actions[i]`` of ``problems[i]`` in one batch (one call per reward function, one
        reward-model forward) and keep the results: ``step(actions[i])`` after ``reset(options={"problem":
        problems[i]})`` returns that result (once) instead of scoring alone, the same result it would compute.
        A new call replaces what the last one kept. Through a VecEnv:
        ``venv.env_method("score_ahead", problems, actions, indices=[i])``.

        :param problems: one problem per completion
        :param actions: sequence-mode actions (arrays of ``max_new_tokens`` token ids, pad after EOS)
        """
        check_ahead(self.action_mode, problems, actions)
        ids = [completion_ids(action, self.max_new_tokens, self.codec.vocab_size) for action in actions]
        cut = [split_completion(row, self.codec) for row in ids]
        texts = [self.codec.decode(body) for body, _ in cut]
        answers = [i for i, text in enumerate(texts) if not self.tool_session.is_tool_turn(text)]  # tools: on step
        results = self.reward_fn.score_batch(
            self.task,
            [problems[i] for i in answers],
            [texts[i] for i in answers],
            [self.formatter.prompt(problems[i].prompt_input) for i in answers],
            [ids[i][: cut[i][1]] for i in answers],
            supplied=[self.tool_session.answer_scores()] * len(answers),
        )
        self._ahead.store([problems[i] for i in answers], [ids[i] for i in answers], results)

    def encode_action(self, text: str) -> np.ndarray:
        """The sequence-mode action of a completion ``text``: its token ids, EOS, then padding to
        ``max_new_tokens`` (a text longer than the budget is cut, without EOS, as a clipped completion)."""
        return text_action(text, self.codec, self.max_new_tokens)

    def decode_action(self, action: Any) -> str:
        """The completion text a sequence-mode action stands for (its tokens up to EOS), as ``step`` scores it."""
        body, _ = split_completion(completion_ids(action, self.max_new_tokens, self.codec.vocab_size), self.codec)
        return self.codec.decode(body)

    # ------------------------------------------------------------------ describing
    def describe(self) -> dict[str, Any]:
        """A JSON-serialisable record of this env's id and constructor arguments, and the argument names that must
        be passed back to rebuild it (``"needs"``); see :mod:`grpo_gym.describe`."""
        env_id = self.spec.id if self.spec is not None else "R1Zero-v0"
        return describe_env(self.init_arguments, env_id, list(self.reward_fn.reward_funcs))

    @classmethod
    def from_description(cls, record: Mapping[str, Any], **objects: Any) -> R1ZeroEnv:
        """Rebuild an env from :meth:`describe`'s record and the objects it needs (``reward_funcs={...}``,
        ``tokenizer=...``, ``task_kwargs={"data": ...}``); ``ValueError`` naming what is missing."""
        return cls(**env_kwargs_from_record(record, **objects))

    # ------------------------------------------------------------------ saving and resuming
    def get_state(self) -> dict[str, Any]:
        """Everything needed to continue this env exactly, as a JSON-serialisable dict (see the class docstring
        and :mod:`grpo_gym.env_state` for the format)."""
        episode = None
        if self.problem is not None:
            episode = {
                "problem": problem_state(self.task, self.problem),
                "window": self.window.tokens().tolist(),
                "pending": [int(t) for t in self._pending],
                "turn": self._turn,
                "transcript": list(self._transcript),
                "tools": self.tool_session.state(),
                "steps": self.order.steps,
                "ended": self.order.ended,
            }
        weights, errors = self.reward_fn.weights, self.reward_fn.error_counts
        task_state = self.task.get_state()
        return make_state(
            self._spec(), self.np_random, self.difficulty, weights, errors, task_state, self._warned_cut, episode
        )

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`get_state` (of an env built with the same arguments). The whole state is
        checked first (:func:`~grpo_gym.env_state.read_state`); one that does not fit raises ``ValueError`` and leaves
        the env exactly as it was."""
        limits = StateLimits(
            self._spec(), self.task, tuple(self.reward_fn.names), self.reward_fn.check_weights,
            self.codec.vocab_size, self.context_length, self.max_new_tokens,
            self.max_turns + self.tool_session.max_turns, None if self.tools is None else self.max_tool_calls,
        )  # fmt: skip
        saved = read_state(state, limits)
        before = self.task.get_state()
        try:  # the one part only the task can check: applied first, undone if refused
            self.task.set_state(saved.task_state)
        except Exception as error:
            self.task.set_state(before)
            raise ValueError(f"task: the task {self.task.name!r} refused its saved state ({error})") from None
        self.np_random = saved.np_random
        self.set_difficulty(saved.difficulty)
        self.set_reward_weights(saved.reward_weights)
        self.reward_fn.error_counts.update(saved.reward_error_counts)
        self._warned_cut = saved.warned_cut
        self.problem = saved.problem
        self.window.reset(saved.window)
        self._pending, self._turn, self._transcript = saved.pending, saved.turn, saved.transcript
        self.tool_session.reset(*saved.tool_counts)
        if saved.problem is None:
            self.order.forget()
        else:
            self.order.start(*saved.progress)

    def _spec(self) -> dict[str, Any]:
        """What a saved state must have been saved by (see :mod:`grpo_gym.env_state`)."""
        return {
            "task": self.task.name,
            "context_length": self.context_length,
            "max_new_tokens": self.max_new_tokens,
            "action_mode": self.action_mode,
            "max_turns": self.max_turns,
            "vocab_size": self.codec.vocab_size,
            **({"tools": self.tools.names, "max_tool_calls": self.max_tool_calls} if self.tools else {}),
        }

    # ------------------------------------------------------------------ gymnasium API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Start an episode. ``options``: ``{"problem": Problem}`` pins one, ``{"difficulty": d}`` sets the level."""
        super().reset(seed=seed)
        options = options or {}
        if "difficulty" in options:
            self.set_difficulty(options["difficulty"])
        problem = options.get("problem")
        if problem is not None and not isinstance(problem, Problem):
            raise ValueError(f"options['problem'] must be a grpo_gym.tasks.Problem, got {type(problem).__name__}")
        problem = problem if problem is not None else self.sample_problem()
        check_prompt(problem)  # before anything changes: a bad prompt leaves the env as it was
        self.problem = problem
        prompt_text = self.formatter.prompt(self.problem.prompt_input)
        prompt_ids, prompt_cut = self.encode_prompt(self.problem.prompt_input)
        self.window.reset(prompt_ids)
        if prompt_cut and not self._warned_cut:
            self._warned_cut = True
            warnings.warn(
                f"the prompt is longer than context_length={self.context_length}; its oldest tokens were cut",
                stacklevel=2,
            )
        self._pending = []
        self._turn = 0
        self.tool_session.reset()
        self._transcript = [prompt_text]
        self.order.start()
        info = {"problem": self.problem, "prompt": prompt_text, "prompt_truncated": prompt_cut}
        return self.window.observation(), info

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """Apply a completion (sequence mode) or one token (token mode); see the class docstring. Outside an episode
        (before ``reset``, after its end) :class:`~grpo_gym.episode_order.ResetNeeded`."""
        self.order.check()
        result = self._step(action)
        self.order.stepped(result[2], result[3])
        return result

    def _step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """:meth:`step` within an episode."""
        if self.action_mode == "sequence":
            return self._finish_turn(completion_ids(action, self.max_new_tokens, self.codec.vocab_size))
        token = token_id(action, self.codec.vocab_size)
        ended = token in (self.codec.eos_id, self.codec.pad_id)
        self._pending.append(token)
        if not ended:
            self.window.append(np.array([token]))
        if not ended and len(self._pending) < self.max_new_tokens and self.window.free > 0:
            info = {"turn": self._turn, "is_success": False, "reward_errors": {}}
            return self.window.observation(), 0.0, False, False, info
        ids = np.asarray(self._pending, dtype=np.int64)
        self._pending = []
        return self._finish_turn(ids, in_window=True)

    def _finish_turn(
        self, ids: np.ndarray, in_window: bool = False
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """Score the completion ``ids`` (EOS included when present), then end the episode or go on.

        ``in_window``: the completion's tokens are already in the window (token mode appends as it goes).
        """
        body, length = split_completion(ids, self.codec)
        completion = self.codec.decode(body)
        if self.tool_session.is_tool_turn(completion):
            return self._tool_turn(body, length, completion, ids, in_window)
        result = self._ahead.pop(self.problem, ids) if not in_window and self._turn == 0 else None  # first turns
        if result is None:
            transcript = "".join(self._transcript[1:]) + completion  # the episode's text after the prompt
            result = self.reward_fn.score_batch(
                self.task,
                [self.problem],
                [completion],
                [self._transcript[0]],
                [ids[:length]],
                transcripts=[transcript],
                supplied=[self.tool_session.answer_scores()],
                turns=[self._turn],
            )[0]
        self._turn += 1
        self._transcript.append(completion)
        fits = in_window or self.window.append(body)
        answers = self._turn - self.tool_session.turns
        terminated = result.is_success or answers >= self.max_turns
        if not terminated:
            verdict = Verdict(False, result.reasons.get("task", ""))
            message = self.task.feedback(self.problem, verdict)
            fits = self.window.append(self._encode_between(message, self._feedback_affix_ids)) and fits
            self._transcript.append(self.formatter.feedback(message))
        truncated = not terminated and (not fits or self.window.free <= self.max_new_tokens)
        tool_calls = self.tool_session.answer_records()
        info = turn_info(result, completion, body, length, self._turn, self.problem.difficulty, tool_calls)
        return self.window.observation(), float(result.total), bool(terminated), bool(truncated), info

    def _tool_turn(
        self, body: np.ndarray, length: int, completion: str, ids: np.ndarray, in_window: bool
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """Run a tool turn's calls and append their results (see the class docstring)."""
        turn, text = self.tool_session.play(completion)
        scoring = TurnInput(self.task, self.problem, self._transcript[0], completion,
                            "".join(self._transcript[1:]) + completion, self._turn, turn.records)  # fmt: skip
        self._turn += 1
        self._transcript.append(completion)
        fits = in_window or self.window.append(body)
        if text is not None:
            fits = self.window.append(self.codec.encode(text)) and fits
            self._transcript.append(text)
        truncated = text is None or not fits or self.window.free <= self.max_new_tokens
        scores = ToolSession.scores(turn)
        result = self.reward_fn.score_without_answer(TOOL_TURN_REASON, ids[:length], scores, scoring)
        info = turn_info(result, completion, body, length, self._turn, self.problem.difficulty, turn.records)
        return self.window.observation(), float(result.total), False, bool(truncated), info

    def render(self) -> str | None:
        """``"ansi"``: the conversation so far as text; ``"human"``: print it."""
        if self.render_mode in (None, "rgb_array"):
            gym.logger.warn("a text env renders with render_mode='ansi' (returns text) or 'human' (prints it)")
            return None
        text = "".join(self._transcript)
        if self._pending:  # token mode: the unfinished turn
            text += self.codec.decode(np.asarray(self._pending))
        if self.render_mode == "human":
            print(text)
            return None
        return text
