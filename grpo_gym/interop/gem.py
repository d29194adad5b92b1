"""GEM both ways: GEM's environments as envs GRPO trains on, and ``R1Zero-v0`` in GEM's registry.

GEM (``gem-llm``, ``pip install 'grpo-gym[gem]'``) envs take text and give text: ``reset(seed)`` returns
``(observation, info)``, ``step(action: str)`` Gymnasium's five-tuple; ``gem.make("game:GuessTheNumber-v0-easy")``
builds one by name, and its tools are wrappers around an env (``ToolEnvWrapper``: a step whose text calls a tool
returns the tool's output as the next observation).

- **Train on theirs**: :func:`gem_env` makes a GEM env (by name, or one you built and wrapped, tool wrappers and all)
  the env GRPO trains on: :class:`GemTextEnv` turns it into a Gymnasium env, :class:`~grpo_gym.wrappers.LMEnvWrapper`
  renders its observations to the prompt (``User: <observation>``, the later ones as user turns) and sends the
  completion as its action (``action_parser``; the text by default). GEM's reward, ``terminated`` and
  ``truncated`` pass through (a reward that is not a real number, or a flag that is not a bool, is the GEM env's
  bug, raised naming it and the value), and so does ``info``; ``is_success`` is GEM's ``info["correct"]`` where the env
  gives it, else an episode that ended with GEM's success reward (1). A GEM tool wrapper plays its tool turns
  itself, as steps. A step after the episode ended, or before ``reset``, is refused before it reaches the GEM env
  (:class:`~grpo_gym.episode_order.ResetNeeded`). GEM seeds Python's and numpy's global generators at each seeded
  reset; the seed it gets is the episode's modulo 2**32 (numpy's range).
- **Serve ours**: importing this module registers ``"grpo_gym:R1Zero-v0"`` (:data:`GEM_ID`) with GEM, so
  ``gem.make("grpo_gym:R1Zero-v0", task="countdown")`` and ``gem.make_vec`` build :class:`R1ZeroGemEnv`.
"""

from __future__ import annotations

import difflib
from typing import Any

import gymnasium as gym

try:
    import gem
    from gem.core import Env as GemEnv
    from gem.envs.registration import ENV_REGISTRY
    from gem.utils.constants import TERMINAL_STATE, LanguageGameReward
except ImportError as error:  # pragma: no cover - the extra is not installed
    raise ImportError(f"grpo_gym.interop.gem needs GEM ({error}): pip install 'grpo-gym[gem]'") from error

from grpo_gym.episode_order import EpisodeOrder
from grpo_gym.interop.r1zero_text import R1ZeroText, text_env
from grpo_gym.rewards.values import received_number, returned_flag
from grpo_gym.validation import ArgumentError
from grpo_gym.wrappers import LMEnvWrapper

GEM_ID = "grpo_gym:R1Zero-v0"
"""``R1Zero-v0``'s id in GEM's registry (GEM's ``"<family>:<name>"`` form)."""
GEM_DEFAULTS = {"template": "{prompt}", "use_chat_template": False}
"""R1ZeroGemEnv's defaults over R1ZeroEnv's: the question alone, as GEM's envs give theirs (``template="r1zero"``
shows the R1-Zero instructions), and the token budgets of an env served as text."""


class GemTextEnv(gym.Env):
    """A GEM env as a Gymnasium env with text observations and text actions (module docstring).

    :param env: a GEM id (made with ``gem.make(env, **make_kwargs)``) or a GEM env
    :param make_kwargs: ``gem.make``'s keyword arguments (e.g. ``dataset=...`` for a math env)
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012

    def __init__(self, env: str | GemEnv, **make_kwargs: Any) -> None:
        if isinstance(env, str):
            if env not in ENV_REGISTRY:
                close = difflib.get_close_matches(env, list(ENV_REGISTRY), n=4, cutoff=0.6)
                hint = f"did you mean {', '.join(close)}?" if close else "gem.print_envs() lists them"
                raise ArgumentError(f"GEM has no env {env!r}; {hint}")
            env = gem.make(env, **make_kwargs)
        elif make_kwargs:
            raise ArgumentError("make_kwargs are gem.make's: give them with a GEM id, not with a GEM env")
        if not isinstance(env, GemEnv):
            raise ArgumentError(f"env must be a GEM id or a gem.Env, got {type(env).__name__}")
        self.gem_env = env
        self.env_id = getattr(env, "env_id", type(env.unwrapped).__name__)
        #: whether an episode is in progress, its steps and how it ended (a step is refused outside one)
        self.order = EpisodeOrder(type(self).__name__)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """GEM's reset, with ``seed`` (modulo 2**32) when given."""
        super().reset(seed=seed)
        obs, info = self.gem_env.reset(seed=None if seed is None else int(seed) % 2**32)
        self.order.start()
        return obs, dict(info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """GEM's step; ``info["is_success"]`` added (module docstring)."""
        self.order.check()
        obs, reward, terminated, truncated, info = self.gem_env.step(action)
        what = f"the step of the GEM env {self.env_id!r}"
        contract = "a GEM env's step returns (observation, reward: float, terminated: bool, truncated: bool, info)"
        reward = received_number(what, reward, contract)  # inf or NaN pass: LMEnvWrapper scores them 0, with the reason
        terminated = returned_flag(f"{what}: terminated", terminated, contract)
        truncated = returned_flag(f"{what}: truncated", truncated, contract)
        info = dict(info)
        if "is_success" not in info:
            correct = info.get("correct")
            won = (terminated or truncated) and reward >= LanguageGameReward.success_reward
            info["is_success"] = bool(correct) if isinstance(correct, bool) else won
        self.order.stepped(terminated, truncated)
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        """Close the GEM env when it can be closed (a math env's worker pool)."""
        close = getattr(self.gem_env, "close", None)
        if callable(close):
            close()


def gem_env(env: str | GemEnv, make_kwargs: dict[str, Any] | None = None, **wrapper_kwargs: Any) -> LMEnvWrapper:
    """A GEM env as the env GRPO trains on (module docstring).

    :param env: a GEM id, or a GEM env (wrapped in GEM's ``ToolEnvWrapper`` or others as you like)
    :param make_kwargs: ``gem.make``'s keyword arguments, with an id
    :param wrapper_kwargs: :class:`~grpo_gym.wrappers.LMEnvWrapper`'s arguments (``max_new_tokens``,
        ``context_length``, ``max_turns``, ``action_parser``, ``template``, ``tokenizer``, ...)
    """
    return LMEnvWrapper(GemTextEnv(env, **(make_kwargs or {})), **wrapper_kwargs)


class R1ZeroGemEnv(GemEnv):
    """``R1Zero-v0`` as a GEM env: text in, text out (``gem.make("grpo_gym:R1Zero-v0", **env_kwargs)``).

    ``reset(seed)`` returns the prompt (under the env's template: by default the question alone, after the tools'
    block when there are tools) and the env's ``info`` (``question``, ``problem``, ...). ``step(completion)`` scores
    the completion: the next observation is the bare message the model reads (the task's feedback after a wrong
    answer in a multi-turn episode, the tool results after a tool turn, ``info["use_tool"]`` then), or GEM's
    terminal marker once the episode ended; the reward, ``terminated``, ``truncated`` and ``info`` are the env's.
    A step after the episode ended raises :class:`~grpo_gym.episode_order.ResetNeeded` (it is not scored again).

    :param seed: the seed of the first reset when it is given none (GEM's ``make_vec`` passes one per env)
    :param env_kwargs: ``R1ZeroEnv``'s arguments, over :data:`GEM_DEFAULTS` and the text budgets
    """

    def __init__(self, seed: int | None = None, **env_kwargs: Any) -> None:
        super().__init__()
        self.text = R1ZeroText(text_env({**GEM_DEFAULTS, **env_kwargs}))
        self.env_kwargs = env_kwargs
        self._first_seed = seed

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode from ``seed`` (the same seed, the same problem)."""
        if seed is None:
            seed, self._first_seed = self._first_seed, None
        question, prompt, info = self.text.reset(seed=seed)
        return prompt, {**info, "question": question}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Score the completion ``action`` (see the class docstring)."""
        turn = self.text.step(action)
        ended = turn.terminated or turn.truncated
        return (TERMINAL_STATE if ended else turn.message), turn.reward, turn.terminated, turn.truncated, {
            **turn.info, "use_tool": turn.tool_turn,
        }  # fmt: skip

    def sample_random_action(self) -> str:
        """A well-formed answer with a random number (GEM's convention for a random action)."""
        number = int(self.text.env.np_random.integers(0, 100))
        return f"<think>a guess</think><answer>{number}</answer>"

    def spawn(self, same_state: bool = False, **kwargs: Any) -> R1ZeroGemEnv:
        """A new env with the same arguments (``kwargs`` override them); ``same_state`` is not supported."""
        if same_state:
            raise NotImplementedError("R1ZeroGemEnv.spawn(same_state=True): use get_state/set_state of its .text.env")
        return R1ZeroGemEnv(**{**self.env_kwargs, **kwargs})


if GEM_ID not in ENV_REGISTRY:
    gem.register(GEM_ID, f"{__name__}:R1ZeroGemEnv")
