"""GEM both ways, with the real gem-llm (no mocks): GRPO trains on two of GEM's envs (Guess the Number, and its math env
with its own grader on a small in-memory dataset: no download) with GEM's tool wrapper kept, and R1Zero-v0 is made by
GEM's registry (``gem.make("grpo_gym:R1Zero-v0")``, ``gem.make_vec``) and read through GEM's own observation wrapper."""

from __future__ import annotations

import re
from typing import Any

import pytest

pytest.importorskip("gem")

import gem
from gem.tools.base_tool import BaseTool
from gem.tools.tool_env_wrapper import ToolEnvWrapper
from gem.utils.constants import TERMINAL_STATE
from gem.wrappers.wrapper_factory import WRAPPER_FACTORY
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

from algorithms import GRPO
from grpo_gym import R1ZeroEnv
from grpo_gym.interop.gem import GEM_ID, GemTextEnv, R1ZeroGemEnv, gem_env
from grpo_gym.validation import ArgumentError
from tests.sizes import TINY


def train(make: Any, n_envs: int = 2) -> GRPO:
    """A few GRPO iterations (K=1 x G=2) on ``make()``'s env: at least two, each of two whole episodes."""
    venv = DummyVecEnv([lambda: Monitor(make())] * n_envs)
    model = GRPO("TransformerPolicy", venv, n_groups=1, group_size=2, cold_start=False, policy_kwargs=TINY, seed=0)
    model.learn(5)  # an iteration plays 2 episodes of at most 2 turns: 4 completions
    assert model.num_timesteps >= 5 and len(model.ep_info_buffer) >= 4
    return model


def guess_the_number(max_turns: int = 2) -> Any:
    return gem_env("game:GuessTheNumber-v0-easy", max_new_tokens=12, context_length=1024, max_turns=max_turns)


def test_gems_guess_the_number_is_played_and_trained_on() -> None:
    env = guess_the_number(max_turns=4)
    problem = env.sample_problem(seed=5)
    _, info = env.reset(options={"problem": problem})
    assert info["prompt"].startswith("User: You are playing Guess The Number.")
    secret = env.unwrapped.gem_env.game_number
    env.reset(options={"problem": problem})  # the same seed, the same game
    assert env.unwrapped.gem_env.game_number == secret
    wrong = 1 if secret != 1 else 2
    _, reward, terminated, _, info = env.step(env.encode_action(f"\\boxed{{{wrong}}}"))
    assert not terminated and not info["is_success"]
    context = env.codec.decode(env.window.tokens())
    assert re.search(r"\nUser: At turn 1, you guessed \d+, and the target number is (higher|lower)", context)
    _, reward, terminated, _, info = env.step(env.encode_action(f"\\boxed{{{secret}}}"))
    assert terminated and reward == 1.0 and info["is_success"]
    train(guess_the_number)


def math_env() -> Any:
    from datasets import Dataset

    rows = Dataset.from_dict({"problem": ["What is 2+3?", "What is 4+4?"], "answer": ["5", "8"]})
    return gem_env("math:GSM8K", make_kwargs={"dataset": rows, "use_mp": False}, max_new_tokens=12, context_length=128)


def test_gems_math_env_grades_with_its_own_grader_and_is_trained_on() -> None:
    env = math_env()
    _, info = env.reset(options={"problem": env.sample_problem(seed=0)})
    answer = {"What is 2+3?": "5", "What is 4+4?": "8"}[info["prompt"].split("User: ")[1].split("\n")[0]]
    _, reward, terminated, truncated, info = env.step(env.encode_action(f"\\boxed{{{answer}}}"))
    assert reward == 1.0 and info["is_success"] and (terminated or truncated)
    env.reset(options={"problem": env.sample_problem(seed=0)})
    assert env.step(env.encode_action("\\boxed{7}"))[1] == 0.0
    train(math_env)


class Reverse(BaseTool):
    """A GEM tool: ``<reverse>text</reverse>`` returns the text reversed."""

    tool_type = "reverse"

    def instruction_string(self) -> str:
        return "Write <reverse>text</reverse> to read the text reversed."

    def execute_action(self, action: str) -> tuple[bool, bool, str, str]:
        found = re.search(r"<reverse>(.*?)</reverse>", action)
        if not found:
            return False, True, "", action
        return True, False, f"Reversed: {found.group(1)[::-1]}", action[: found.end()]


def test_gems_tool_wrapper_is_kept_and_trained_through() -> None:
    def make() -> Any:
        wrapped = ToolEnvWrapper(gem.make("game:GuessTheNumber-v0-easy"), tools=[Reverse()], max_tool_uses=2)
        return gem_env(wrapped, max_new_tokens=32, context_length=1024, max_turns=2)

    env = make()
    _, info = env.reset(seed=0)
    assert "Write <reverse>text</reverse>" in info["prompt"]  # GEM's wrapper adds its tools' instructions
    _, _, terminated, _, info = env.step(env.encode_action("<reverse>abc</reverse>"))
    assert not terminated and info["use_tool"] and info["tool_use_counter"] == 1
    assert env.codec.decode(env.window.tokens()).endswith("\nUser: Reversed: cba\nAssistant: ")
    train(make)


def test_r1zero_is_in_gems_registry_and_plays_as_gem_envs_do() -> None:
    env = gem.make(GEM_ID, task="arithmetic", difficulty=0.1, max_turns=2, tools=["calculator"])
    assert isinstance(env, R1ZeroGemEnv)
    obs, info = env.reset(seed=4)
    assert obs.endswith(info["question"]) and "calculator" in obs and env.reset(seed=4)[0] == obs
    obs, reward, terminated, truncated, info = env.step(
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
    )
    assert (obs, terminated, truncated, info["use_tool"]) == ("5", False, False, True)
    obs, reward, terminated, _, info = env.step("<think>no</think><answer>-1</answer>")
    assert obs.startswith("That is not correct") and not terminated and not info["use_tool"]
    reference = R1ZeroEnv(task="arithmetic", difficulty=0.1)
    reference.reset(seed=4)
    reasoning, answer = reference.task.solution(reference.problem)
    obs, reward, terminated, _, info = env.step(f"<think>{reasoning}</think><answer>{answer}</answer>")
    assert obs == TERMINAL_STATE and terminated and info["is_success"] and reward == 1.0
    concat = WRAPPER_FACTORY["concat"](gem.make(GEM_ID))  # GEM's own observation wrapper over ours
    first, info = concat.reset(seed=4)
    assert first == info["question"] + "\n"  # (the tools' block is shown only when there are tools)
    vector = gem.make_vec([GEM_ID] * 2, seed=1)
    observations, _ = vector.reset()
    assert len(observations) == 2 and all(isinstance(o, str) for o in observations)


def test_bad_gem_arguments_name_the_fix() -> None:
    with pytest.raises(ArgumentError, match=r"no env 'game:GuessTheNumber-v9'; did you mean .*GuessTheNumber-v0-easy"):
        GemTextEnv("game:GuessTheNumber-v9")
    with pytest.raises(ArgumentError, match=r"with a GEM id"):
        GemTextEnv(gem.make("game:GuessTheNumber-v0-easy"), max_turns=3)
    with pytest.raises(ArgumentError, match=r"GEM id or a gem\.Env"):
        GemTextEnv(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_turns"):
        gem.make(GEM_ID, max_turns=0)
