"""LMEnvWrapper: a Gymnasium env with text observations and text actions (a guessing game written here) becomes an
env GRPO trains on and evaluation plays; bad completions are information, never crashes; the checkers pass."""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

from algorithms import GRPO
from algorithms.common.evaluation import evaluate_problems
from algorithms.common.generation.sampler import Completions
from grpo_gym.wrappers import LMEnvWrapper
from tests.sizes import TINY


class GuessDigit(gym.Env):
    """Guess a hidden digit from 1 to 9 in at most 4 tries; the env answers "Higher." or "Lower."."""

    observation_space = spaces.Text(max_length=64)
    action_space = spaces.Text(max_length=8, charset="0123456789")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self.secret, self.tries = int(self.np_random.integers(1, 10)), 0
        return "Guess a digit from 1 to 9.", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        guess = int(action)
        self.tries += 1
        if guess == self.secret:
            return "Correct.", 1.0, True, False, {"is_success": True}
        hint = "Higher." if guess < self.secret else "Lower."
        return hint, 0.0, False, self.tries >= 4, {"is_success": False}


def parse_digit(text: str) -> str:
    """The completion as a guess: one digit, or a ValueError the model reads."""
    text = text.strip()
    if len(text) != 1 or not text.isdigit():
        raise ValueError(f"answer with one digit, not {text[:20]!r}")
    return text


def wrapped(**kwargs: Any) -> LMEnvWrapper:
    options = {"action_parser": parse_digit, "max_new_tokens": 8, "context_length": 256, **kwargs}
    return LMEnvWrapper(GuessDigit(), **options)


def context_text(env: LMEnvWrapper) -> str:
    return env.codec.decode(env.window.tokens())


def next_guess(context: str) -> str:
    """Binary search over the hints in ``context``."""
    low, high = 1, 9
    for guess, hint in re.findall(r"Assistant: (\d)\nUser: (Higher|Lower)\.", context):
        low, high = (int(guess) + 1, high) if hint == "Higher" else (low, int(guess) - 1)
    return str((low + high) // 2)


def test_a_text_game_is_played_through_token_actions() -> None:
    env = wrapped()
    problem = env.sample_problem(seed=7)
    obs, info = env.reset(options={"problem": problem})
    assert info["prompt"] == "User: Guess a digit from 1 to 9.\nAssistant: "
    assert obs["input_ids"].shape == (256,) and obs["attention_mask"].sum() == len(info["prompt"])
    rewards, terminated, truncated, turns = [], False, False, 0
    while not (terminated or truncated):
        obs, reward, terminated, truncated, info = env.step(env.encode_action(next_guess(context_text(env))))
        rewards.append(reward)
        turns += 1
    assert terminated and info["is_success"] and rewards[-1] == 1.0 and turns <= 4
    assert "\nUser: Higher.\nAssistant: " in context_text(env) or "\nUser: Lower.\nAssistant: " in context_text(env)
    secret = env.unwrapped.secret
    env.reset(options={"problem": problem})  # the same problem, the same episode
    assert env.unwrapped.secret == secret
    secrets = set()
    for seed in range(20):
        env.reset(options={"problem": env.sample_problem(seed=seed)})
        secrets.add(env.unwrapped.secret)
    assert len(secrets) > 1


def test_refused_completions_are_read_by_the_model_and_the_turn_budget_truncates() -> None:
    env = wrapped(invalid_action_reward=-0.5, max_turns=3)
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(env.encode_action("five"))
    assert (reward, terminated, truncated) == (-0.5, False, False)
    assert info["action_error"] == "ValueError: answer with one digit, not 'five'" and env.unwrapped.tries == 0
    assert context_text(env).endswith(
        "five\nUser: Invalid action: ValueError: answer with one digit, not 'five'\nAssistant: "
    )
    env.step(env.encode_action("x"))
    _, _, terminated, truncated, _ = env.step(env.encode_action("y"))
    assert truncated and not terminated


@pytest.mark.filterwarnings("ignore:.*different from the unwrapped version")
def test_checkers_pass_on_the_wrapper() -> None:
    gym_check_env(wrapped(), skip_render_check=True)
    sb3_check_env(wrapped(), warn=True)


class BinarySearchPolicy(th.nn.Module):
    """What evaluation needs of a policy: it plays the game perfectly."""

    def __init__(self, env: LMEnvWrapper) -> None:
        super().__init__()
        self.weight = th.nn.Parameter(th.zeros(1))
        self.env, self.context_limit, self.pad_token_id = env, 200, env.codec.pad_id

    def generate(self, ids: th.Tensor, mask: th.Tensor, **_: Any) -> Completions:
        texts = [next_guess(self.env.codec.decode(row[m.bool()].numpy())) for row, m in zip(ids, mask, strict=True)]
        tokens = th.as_tensor(np.stack([self.env.encode_action(text) for text in texts]))
        lengths = th.full((len(texts),), 2)
        return Completions(tokens, th.zeros(tokens.shape), th.arange(tokens.shape[1])[None] < 2, lengths)


@pytest.mark.parametrize("n_envs", [1, 2])
def test_grpo_trains_and_evaluation_plays_the_wrapped_game(n_envs: int) -> None:
    vec = DummyVecEnv([lambda: Monitor(wrapped())] * n_envs)
    model = GRPO("TransformerPolicy", vec, n_groups=2, group_size=2, cold_start=False, policy_kwargs=TINY, seed=0)
    model.learn(4)
    assert model.num_timesteps >= 4 and len(model.ep_info_buffer) == 4  # whole episodes, however many turns
    problems = vec.env_method("eval_problems", 6, 0.5, indices=[0])[0]
    perfect = evaluate_problems(BinarySearchPolicy(vec.envs[0].env), vec, problems)
    assert perfect.success_rate == 1.0 and perfect.mean_reward == 1.0 and perfect.source == "new seeds"
    untrained = evaluate_problems(model.policy, vec, problems)
    assert 0.0 <= untrained.success_rate <= 1.0


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def test_tool_turns_run_in_the_wrapper_and_do_not_step_the_wrapped_env() -> None:
    env = wrapped(tools=[add], max_new_tokens=80, context_length=512, max_tool_calls=1, max_turns=2)
    _, info = env.reset(options={"problem": env.sample_problem(seed=7)})
    assert info["prompt"].startswith("Tools: add(a, b)\nUser: Guess a digit")
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    _, reward, terminated, truncated, info = env.step(env.encode_action(call))
    assert (reward, terminated, truncated) == (0.0, False, False) and env.unwrapped.tries == 0
    assert info["tool_calls"][0]["result"] == "5" and context_text(env).endswith("</tool_call>\nTool: 5\nAssistant: ")
    _, _, _, truncated, info = env.step(env.encode_action("x"))  # an answer: refused by the parser, a turn of 2
    assert not truncated and info["action_error"]
    _, _, terminated, truncated, info = env.step(env.encode_action(call))  # the budget was spent: the episode ends
    assert truncated and not terminated and "too many tool calls" in info["tool_calls"][0]["error"]
