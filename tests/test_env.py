"""R1ZeroEnv: spaces, reset/step, rewards in info, multi-turn, truncation, bad input, checkers, vec envs."""

from __future__ import annotations

import pickle
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

import grpo_gym
from grpo_gym import R1ZeroEnv
from grpo_gym.tasks import Problem


def encode_completion(env: R1ZeroEnv, text: str, eos: bool = True) -> np.ndarray:
    """The sequence-mode action for ``text``: its ids, EOS, then padding."""
    ids = list(env.codec.encode(text)) + ([env.codec.eos_id] if eos else [])
    assert len(ids) <= env.max_new_tokens, "test completion longer than max_new_tokens"
    return np.array(ids + [env.codec.pad_id] * (env.max_new_tokens - len(ids)), dtype=np.int64)


def gold_text(env: R1ZeroEnv) -> str:
    reasoning, answer = env.task.solution(env.problem)
    return f"<think>{reasoning}</think><answer>{answer}</answer>"


@pytest.fixture
def env() -> R1ZeroEnv:
    return R1ZeroEnv(context_length=512, max_new_tokens=96, template="compact")


def test_registration_is_idempotent_and_both_ids_work() -> None:
    import importlib

    importlib.reload(grpo_gym)  # registering twice must not raise or warn about re-registration
    env = gym.make("R1Zero-v0", context_length=256, max_new_tokens=32)
    assert isinstance(env.unwrapped, R1ZeroEnv)
    env2 = gym.make("grpo_gym:R1Zero-v0", context_length=256, max_new_tokens=32)
    assert isinstance(env2.unwrapped, R1ZeroEnv)


def test_make_without_import_in_fresh_process() -> None:
    code = "import gymnasium as gym; e = gym.make('grpo_gym:R1Zero-v0'); print(e.observation_space['input_ids'].shape)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(4096,)"


def test_import_does_not_pull_torch() -> None:
    code = "import grpo_gym, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_default_spaces_and_template() -> None:
    env = gym.make("R1Zero-v0")
    obs, info = env.reset(seed=0)
    assert env.observation_space["input_ids"].shape == (4096,)
    assert isinstance(env.action_space, gym.spaces.MultiDiscrete) and env.action_space.shape == (64,)
    assert obs["input_ids"].dtype == np.int64 and obs["attention_mask"].dtype == np.int64
    assert "<think>" in info["prompt"] and "<answer>" in info["prompt"] and info["prompt"].endswith("Assistant: ")
    assert info["problem"].prompt in info["prompt"]
    n = int(obs["attention_mask"].sum())
    # left padded: the mask is zeros then ones, and the tokens decode to the prompt
    assert obs["attention_mask"][-n:].all() and not obs["attention_mask"][:-n].any()
    assert env.unwrapped.codec.decode(obs["input_ids"][-n:]) == info["prompt"]


def test_gold_completion_gets_full_reward(env: R1ZeroEnv) -> None:
    env.reset(seed=1)
    _, reward, terminated, truncated, info = env.step(encode_completion(env, gold_text(env)))
    assert info["is_success"] is True
    assert info["reward_components"] == {"syntax": 1.0, "consistency": 1.0, "task": 1.0}
    assert reward == pytest.approx(1.0)
    assert terminated and not truncated
    assert info["completion_length"] == len(env.codec.encode(gold_text(env))) + 1  # EOS counts


def test_wrong_answer_gets_partial_reward_with_reasons(env: R1ZeroEnv) -> None:
    env.reset(seed=2)
    reasoning, answer = env.task.solution(env.problem)
    wrong = str(int(answer) + 1)
    text = f"<think>{reasoning}</think><answer>{wrong}</answer>"
    _, reward, terminated, _, info = env.step(encode_completion(env, text))
    assert info["is_success"] is False
    assert info["reward_components"]["syntax"] == 1.0 and info["reward_components"]["task"] == 0.0
    assert info["reward_reasons"]["task"]
    assert reward == pytest.approx(0.3 + 0.4 * info["reward_components"]["consistency"])
    assert terminated


def test_reward_weights_at_construction_and_run_time(env: R1ZeroEnv) -> None:
    env2 = R1ZeroEnv(context_length=512, max_new_tokens=96, template="compact", reward_weights={"task": 1.0})
    env2.reset(seed=3)
    reasoning, answer = env2.task.solution(env2.problem)
    text = f"<think>{reasoning}</think><answer>{answer}</answer>"
    _, reward, *_ = env2.step(encode_completion(env2, text))
    assert reward == pytest.approx(1.0)  # clipped: 0.3 + 0.4 + 1.0 = 1.7 -> 1.0
    env.set_reward_weights({"syntax": 1.0, "consistency": 0.0, "task": 0.0})
    env.reset(seed=3)
    _, reward, *_ = env.step(encode_completion(env, "<think>x</think><answer>y</answer>"))
    assert reward == pytest.approx(1.0)
    with pytest.raises(ValueError, match="syntax"):
        env.set_reward_weights({"style": 1.0})


def test_text_after_eos_is_ignored(env: R1ZeroEnv) -> None:
    env.reset(seed=4)
    action = encode_completion(env, gold_text(env))
    first = env.step(action)
    garbage = action.copy()
    n = int(np.flatnonzero(action == env.codec.eos_id)[0])
    garbage[n + 1 :] = env.codec.encode("Z" * (len(action) - n - 1))
    env.reset(seed=4)
    second = env.step(garbage)
    assert first[1] == second[1] and first[4]["completion"] == second[4]["completion"]


def test_same_seed_same_problems() -> None:
    a = R1ZeroEnv(context_length=256, max_new_tokens=32, template="compact")
    b = R1ZeroEnv(context_length=256, max_new_tokens=32, template="compact")
    problems_a = [a.reset(seed=7)[1]["problem"]] + [a.reset()[1]["problem"] for _ in range(5)]
    problems_b = [b.reset(seed=7)[1]["problem"]] + [b.reset()[1]["problem"] for _ in range(5)]
    assert problems_a == problems_b
    assert len({p.prompt for p in problems_a}) > 1


def test_problem_pinning_difficulty_and_pickling(env: R1ZeroEnv) -> None:
    problem = env.sample_problem(difficulty=0.9)
    assert problem.difficulty == 0.9
    clone = pickle.loads(pickle.dumps(problem))
    assert clone == problem
    _, info = env.reset(options={"problem": clone})
    assert info["problem"] is clone
    env.reset(options={"difficulty": 0.6})
    assert env.difficulty == 0.6 and env.problem.difficulty == 0.6
    env.set_difficulty(0.1)
    assert env.reset()[1]["problem"].difficulty == 0.1
    # the problem remembers its seed: the task remakes it
    remade = env.task.sample(problem.difficulty, np.random.default_rng(problem.seed))
    assert (remade.prompt, remade.answer) == (problem.prompt, problem.answer)


@pytest.mark.parametrize("bad", [0.0, 0.05, 1.01, 2, float("nan"), "hard"])
def test_difficulty_out_of_range(env: R1ZeroEnv, bad: object) -> None:
    with pytest.raises(ValueError, match="difficulty"):
        env.set_difficulty(bad)
    with pytest.raises(ValueError, match="difficulty"):
        env.reset(options={"difficulty": bad})
    with pytest.raises(ValueError, match="difficulty"):
        R1ZeroEnv(difficulty=bad)


def test_bad_actions(env: R1ZeroEnv) -> None:
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(5, dtype=np.int64))
    with pytest.raises(ValueError, match="vocabulary"):
        env.step(np.full(env.max_new_tokens, env.codec.vocab_size, dtype=np.int64))
    with pytest.raises(ValueError, match="vocabulary"):
        env.step(np.full(env.max_new_tokens, -1, dtype=np.int64))
    with pytest.raises(ValueError, match="integers"):
        env.step(np.zeros(env.max_new_tokens, dtype=np.float32))
    token_env = R1ZeroEnv(context_length=256, max_new_tokens=16, action_mode="token")
    token_env.reset(seed=0)
    for bad in (token_env.codec.vocab_size, -3, [1, 2], 1.5):
        with pytest.raises(ValueError, match="token"):
            token_env.step(bad)
    with pytest.raises(RuntimeError, match="reset"):
        R1ZeroEnv(context_length=256, max_new_tokens=16).step(np.zeros(16, dtype=np.int64))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"action_mode": "chunk"},
        {"max_turns": 0},
        {"max_new_tokens": 4096},
        {"template": "no field"},
        {"render_mode": "rgb"},
        {"task": "chess"},
    ],
)
def test_bad_constructor_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        R1ZeroEnv(**kwargs)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "<think>a</think><answer>1</answer><answer>2</answer>",
        "<think><think>x</think></think><answer>3</answer>",
        "<think>x<answer>5</answer></think><answer>5</answer>",
        "<think>unclosed <answer>5",
        "__import__('os').system('echo hi')",
    ],
)
def test_model_output_is_data(env: R1ZeroEnv, text: str) -> None:
    env.reset(seed=5)
    _, reward, *_, info = env.step(encode_completion(env, text[: env.max_new_tokens - 1]))
    assert not info["is_success"]
    assert info["reward_components"]["syntax"] == 0.0 and info["reward_components"]["task"] == 0.0
    assert -1.0 <= reward <= 0.4 and info["reward_reasons"]["syntax"]


def test_multi_turn_feedback_then_success() -> None:
    env = R1ZeroEnv(context_length=1024, max_new_tokens=64, max_turns=3, template="compact")
    obs0, _ = env.reset(seed=11)
    _, answer = env.task.solution(env.problem)
    wrong = encode_completion(env, f"<think>guess</think><answer>{int(answer) + 5}</answer>")
    obs1, r1, term1, trunc1, info1 = env.step(wrong)
    assert not term1 and not trunc1 and info1["turn"] == 1 and not info1["is_success"]
    assert obs1["attention_mask"].sum() > obs0["attention_mask"].sum()
    conversation = env.unwrapped.codec.decode(obs1["input_ids"][obs1["attention_mask"] == 1])
    assert "not correct" in conversation and conversation.endswith("Assistant: ")
    _, r2, term2, trunc2, info2 = env.step(encode_completion(env, gold_text(env)))
    assert term2 and not trunc2 and info2["is_success"] and info2["turn"] == 2 and r2 > r1


def test_turn_budget_ends_episode() -> None:
    env = R1ZeroEnv(context_length=1024, max_new_tokens=32, max_turns=2, template="compact")
    env.reset(seed=0)
    bad = encode_completion(env, "<answer>x</answer>")
    assert env.step(bad)[2] is False
    assert env.step(bad)[2] is True


def test_window_full_truncates_and_never_overflows() -> None:
    env = R1ZeroEnv(context_length=96, max_new_tokens=32, max_turns=50, template="compact")
    obs, _ = env.reset(seed=0)
    bad = encode_completion(env, "<answer>no</answer>" + "." * 8)
    for _ in range(50):
        obs, _, terminated, truncated, _ = env.step(bad)
        assert obs["input_ids"].shape == (96,) and obs["attention_mask"].sum() <= 96
        if truncated:
            break
    assert truncated and not terminated
    assert env.window.free <= env.max_new_tokens


def test_long_prompt_is_cut_from_the_left_with_a_warning() -> None:
    env = R1ZeroEnv(context_length=48, max_new_tokens=8)  # the r1zero template alone is ~400 tokens
    with pytest.warns(UserWarning, match="context_length"):
        obs, info = env.reset(seed=0)
    assert info["prompt_truncated"] and obs["attention_mask"].sum() == 48
    assert env.codec.decode(obs["input_ids"]).endswith("Assistant: ")


def test_token_mode_episode() -> None:
    env = R1ZeroEnv(context_length=512, max_new_tokens=96, action_mode="token", template="compact")
    obs, _ = env.reset(seed=3)
    text = gold_text(env)
    ids = [*env.codec.encode(text), env.codec.eos_id]
    start = int(obs["attention_mask"].sum())
    for i, token in enumerate(ids):
        obs, reward, terminated, _, info = env.step(token)
        if i < len(ids) - 1:
            assert reward == 0.0 and not terminated
            assert int(obs["attention_mask"].sum()) == start + i + 1 and obs["input_ids"][-1] == token
    assert terminated and info["is_success"] and reward == pytest.approx(1.0)


def test_token_mode_stops_at_max_new_tokens() -> None:
    env = R1ZeroEnv(context_length=512, max_new_tokens=5, action_mode="token")
    env.reset(seed=0)
    steps = 0
    terminated = False
    while not terminated:
        *_, terminated, _, info = env.step(int(env.codec.encode("a")[0]))
        steps += 1
    assert steps == 5 and info["completion_clipped"] and info["completion"] == "aaaaa"


def test_render_modes(capsys: pytest.CaptureFixture) -> None:
    env = R1ZeroEnv(context_length=512, max_new_tokens=96, render_mode="ansi", template="compact")
    env.reset(seed=0)
    env.step(encode_completion(env, gold_text(env)))
    text = env.render()
    assert env.problem.prompt in text and gold_text(env) in text
    human = R1ZeroEnv(context_length=512, max_new_tokens=16, render_mode="human", template="compact")
    human.reset(seed=0)
    assert human.render() is None
    assert human.problem.prompt in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["sequence", "token"])
def test_env_checkers(mode: str) -> None:
    kwargs = {"context_length": 1024, "max_new_tokens": 32, "action_mode": mode}
    gym_check_env(R1ZeroEnv(**kwargs), skip_render_check=True)
    sb3_check_env(R1ZeroEnv(**kwargs), warn=True)


def test_vec_envs_subprocess_and_same_seed() -> None:
    kwargs = {"context_length": 256, "max_new_tokens": 32, "template": "compact"}
    # SubprocVecEnv's workers start fresh interpreters: the module-qualified id imports grpo_gym there
    sub = make_vec_env("grpo_gym:R1Zero-v0", n_envs=2, seed=5, env_kwargs=kwargs, vec_env_cls=SubprocVecEnv)
    dummy = make_vec_env("R1Zero-v0", n_envs=2, seed=5, env_kwargs=kwargs, vec_env_cls=DummyVecEnv)
    try:
        obs_sub, obs_dummy = sub.reset(), dummy.reset()
        np.testing.assert_array_equal(obs_sub["input_ids"], obs_dummy["input_ids"])
        actions = np.stack([sub.action_space.sample() for _ in range(2)])
        _, rewards_sub, dones_sub, infos_sub = sub.step(actions)
        _, rewards_dummy, _, _ = dummy.step(actions)
        np.testing.assert_array_equal(rewards_sub, rewards_dummy)
        assert dones_sub.all() and "reward_components" in infos_sub[0]
        sub.env_method("set_difficulty", 0.8)
        assert sub.get_attr("difficulty") == [0.8, 0.8]
        problem = Problem(prompt="What is 1+1?", answer="2", task="arithmetic", difficulty=0.1)
        sub.set_options({"problem": problem})
        sub.reset()
        assert [p.answer for p in sub.get_attr("problem")] == ["2", "2"]
    finally:
        sub.close()
