"""Hostile round five (issue 60), "a finished episode is scored again": every door refuses a step after the episode
ended (Gymnasium's order enforcing, extended past the end), saying what happened and the fix, and the vector envs
reset ended episodes themselves. Before: each of these steps was scored (1.0 again for a solved problem; a right
answer after a wrong one that had ended the episode scored as a success)."""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import grpo_gym  # noqa: F401  (registers R1Zero-v0)
from grpo_gym import R1ZeroEnv
from grpo_gym.episode_order import ResetNeeded
from grpo_gym.wrappers import LMEnvWrapper

ENDED = r"after the episode ended \({how}\) at step {step}: .*call reset\(\) to start a new episode before step\(\)"
WRONG = "<think>a guess</think><answer>-999</answer>"


def gold(env: Any) -> str:
    """The right completion of the problem ``env`` (an R1ZeroEnv, possibly wrapped) plays."""
    core = env.unwrapped
    reasoning, answer = core.task.solution(core.problem)
    return f"<think>{reasoning}</think><answer>{answer}</answer>"


def act(env: Any, text: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
    return env.step(env.unwrapped.encode_action(text))


# the tools preset's env (zoo_configs/grpo.yml, R1Zero-v0-tools), a multi-turn one and one whose window ends it
TOOLS = {"template": "compact", "tools": ["calculator"], "max_new_tokens": 112, "context_length": 512}
CUT = {"template": "compact", "max_turns": 5, "context_length": 80, "max_new_tokens": 30}


@pytest.mark.parametrize(
    ("kwargs", "first", "how"),
    [
        ({}, "gold", "terminated"),  # a client farming the reward of one solved problem
        ({}, "wrong", "terminated"),  # retry until right: the wrong answer ended the episode
        ({"max_turns": 2}, "gold", "terminated"),
        (TOOLS, "gold", "terminated"),
        (CUT, "wrong", "truncated"),
    ],
    ids=["solved-then-again", "wrong-then-right", "multi-turn", "tools-preset", "truncated"],
)
def test_the_gymnasium_env_refuses_a_step_after_the_episode_ended(kwargs: dict, first: str, how: str) -> None:
    env = gym.make("R1Zero-v0", **kwargs)
    env.reset(seed=0)
    _, _, terminated, truncated, _ = act(env, gold(env) if first == "gold" else WRONG)
    assert (terminated, truncated) == (how == "terminated", how == "truncated")
    with pytest.raises(gym.error.ResetNeeded, match="R1ZeroEnv.step.. " + ENDED.format(how=how, step=1)):
        act(env, gold(env))
    with pytest.raises(RuntimeError):  # ResetNeeded is a RuntimeError too, as the step before a reset was
        act(env, gold(env))
    env.reset(seed=0)
    assert act(env, gold(env))[1] == 1.0  # a reset starts a new episode, scored as ever


def test_a_step_before_reset_and_token_mode_name_the_fix() -> None:
    env = R1ZeroEnv(action_mode="token", max_new_tokens=4)
    with pytest.raises(ResetNeeded, match=r"R1ZeroEnv.step\(\) before reset\(\): call reset\(\)"):
        env.step(0)
    env.reset(seed=0)
    steps = 0
    done = False
    while not done:
        _, _, terminated, truncated, _ = env.step(env.codec.eos_id if steps == 3 else 5)
        steps, done = steps + 1, terminated or truncated
    with pytest.raises(ResetNeeded, match=ENDED.format(how="terminated", step=steps)):
        env.step(5)


def test_a_saved_state_keeps_the_end_of_its_episode() -> None:
    env = R1ZeroEnv()
    env.reset(seed=0)
    act(env, gold(env))
    state = env.get_state()
    assert (state["episode"]["steps"], state["episode"]["ended"]) == (1, "terminated")
    restored = R1ZeroEnv()
    restored.set_state(state)
    with pytest.raises(ResetNeeded, match=ENDED.format(how="terminated", step=1)):
        act(restored, gold(restored))
    with pytest.raises(ValueError, match=r"state\['episode'\]\['ended'\] must be None, 'terminated' or 'truncated'"):
        restored.set_state({**state, "episode": {**state["episode"], "ended": "over"}})
    fresh = R1ZeroEnv()
    fresh.set_state(R1ZeroEnv().get_state())  # saved before a reset: no episode to step
    with pytest.raises(ResetNeeded, match="before reset"):
        act(fresh, WRONG)


class GuessSeven(gym.Env):
    """A text game: one guess, right when it is 7; counts the steps it was given."""

    observation_space = gym.spaces.Text(64)
    action_space = gym.spaces.Text(64)

    def __init__(self) -> None:
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        return "Guess a digit.", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.steps += 1
        right = action.strip() == "7"
        return "right" if right else "wrong", float(right), True, False, {"is_success": right}


def test_the_text_env_wrapper_refuses_before_its_env_is_stepped() -> None:
    game = GuessSeven()
    env = LMEnvWrapper(game, max_turns=1)
    env.reset(seed=0)
    env.step(env.encode_action("3"))
    with pytest.raises(ResetNeeded, match="LMEnvWrapper.step.. " + ENDED.format(how="terminated", step=1)):
        env.step(env.encode_action("7"))
    assert game.steps == 1  # the game never saw the second guess
    env.reset(seed=0)
    assert env.step(env.encode_action("7"))[1] == 1.0


def test_gem_doors_refuse_a_step_after_the_episode_ended() -> None:
    pytest.importorskip("gem")
    from grpo_gym.interop.gem import GemTextEnv, R1ZeroGemEnv

    ours = R1ZeroGemEnv()
    ours.reset(seed=0)
    ours.step(WRONG)
    with pytest.raises(ResetNeeded, match=ENDED.format(how="terminated", step=1)):
        ours.step(gold(ours.text.env))
    theirs = GemTextEnv("game:GuessTheNumber-v0-easy")  # GEM's own env would play on after done (reward 0)
    theirs.reset(seed=0)
    number = theirs.gem_env.unwrapped.game_number
    assert theirs.step(f"\\boxed{{{number}}}")[2]
    with pytest.raises(ResetNeeded, match="GemTextEnv.step.. " + ENDED.format(how="terminated", step=1)):
        theirs.step(f"\\boxed{{{number}}}")


def test_vector_envs_reset_ended_episodes_themselves() -> None:
    """Gymnasium's vector env (autoreset on the next step), SB3's DummyVecEnv and GEM's make_vec never step an ended
    episode: three steps of one-turn episodes play three episodes."""
    from stable_baselines3.common.env_util import make_vec_env

    vector = gym.make_vec("R1Zero-v0", num_envs=2, vectorization_mode="sync")
    vector.reset(seed=0)
    action = np.stack([vector.unwrapped.envs[0].unwrapped.encode_action(WRONG)] * 2)
    for _ in range(3):
        vector.step(action)
    sb3 = make_vec_env("R1Zero-v0", n_envs=2, seed=0)
    sb3.reset()
    for _ in range(3):
        assert sb3.step(action)[2].all()
    gem = pytest.importorskip("gem")
    from grpo_gym.interop.gem import GEM_ID

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gem_vector = gem.make_vec([GEM_ID] * 2, seed=1)
    gem_vector.reset(seed=1)
    for _ in range(3):
        assert gem_vector.step([WRONG] * 2)[2].all()


def test_openenv_doors_refuse_a_step_after_done() -> None:
    """WebSocket: the server answers with an error naming the fix and the session goes on; a tool call after done is
    refused too (before: it ran and reopened the episode, done False). Plain HTTP (a factory sharing one env): 400.
    Our client env refuses before sending."""
    pytest.importorskip("openenv")
    import httpx
    from openenv.core import GenericEnvClient

    from grpo_gym.interop.openenv import OpenEnvTextEnv, openenv_env
    from grpo_gym.interop.openenv_server import create_r1zero_app
    from tests.test_openenv import serving

    kwargs = {"task": "arithmetic", "difficulty": 0.1, "tools": ["calculator"]}
    answer = {}
    for seed in (3, 4):
        env = R1ZeroEnv(**kwargs)
        env.reset(seed=seed)
        answer[seed] = gold(env)
    refused = "Server error: R1ZeroEnv.step.. " + ENDED.format(how="terminated", step=1)
    with serving(create_r1zero_app(kwargs, max_concurrent_envs=4)) as url:
        with GenericEnvClient(base_url=url).sync() as client:
            client.reset(seed=3)
            assert client.step({"completion": answer[3]}).reward == 1.0
            with pytest.raises(RuntimeError, match=refused):
                client.step({"completion": answer[3]})
            call = {"type": "call_tool", "tool_name": "calculator", "arguments": {"expression": "2+3"}}
            with pytest.raises(RuntimeError, match=refused):
                client.step(call)
            client.reset(seed=4)
            assert client.step({"completion": WRONG}).done
            with pytest.raises(RuntimeError, match=refused):
                client.step({"completion": answer[4]})
            client.reset(seed=3)  # the session goes on
            assert client.step({"completion": answer[3]}).reward == 1.0
        session = OpenEnvTextEnv(url)
        session.reset(seed=3)
        session.step({"completion": answer[3]})
        with pytest.raises(ResetNeeded, match="OpenEnvTextEnv.step.. " + ENDED.format(how="terminated", step=1)):
            session.step({"completion": answer[3]})
        with pytest.raises(ResetNeeded, match=r"OpenEnvTextEnv.step\(\) after the episode ended"):
            session.call_tool("calculator", {"expression": "2+3"})
        session.reset(seed=3)  # not sent, so the session is still open
        assert session.step({"completion": answer[3]})[1] == 1.0
        session.close()
        wrapped = openenv_env(url, max_new_tokens=64, context_length=1024)
        wrapped.reset(seed=3)
        wrapped.step(wrapped.encode_action(answer[3]))
        with pytest.raises(ResetNeeded, match="LMEnvWrapper.step.. " + ENDED.format(how="terminated", step=1)):
            wrapped.step(wrapped.encode_action(answer[3]))
        wrapped.close()
    shared = R1ZeroEnv(task="arithmetic", difficulty=0.1)
    with serving(create_r1zero_app(env_factory=lambda: shared)) as url:
        assert httpx.post(f"{url}/reset", json={"seed": 3}, timeout=30).status_code == 200
        shared_answer = gold(shared)
        first = httpx.post(f"{url}/step", json={"action": {"completion": shared_answer}}, timeout=30)
        assert first.status_code == 200 and first.json()["reward"] == 1.0
        again = httpx.post(f"{url}/step", json={"action": {"completion": shared_answer}}, timeout=30)
        assert again.status_code == 400, again.text
        assert "after the episode ended (terminated) at step 1" in again.json()["detail"]
        assert "call reset()" in again.json()["detail"]
