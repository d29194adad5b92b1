"""R1ZeroEnv: spaces, reset/step, rewards in info, multi-turn, truncation, bad input, checkers, vec envs."""

from __future__ import annotations

import dataclasses
import json
import pickle
import subprocess
import sys
import warnings
from typing import Any

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
    assert info["reward_components"] == {"syntax": 1.0, "consistency": 1.0, "task": 1.0, "length": 0.0}
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
    with pytest.warns(RuntimeWarning, match=r"\(1\.7\) was clipped to \[-1, 1\]"):
        _, reward, *_ = env2.step(encode_completion(env2, text))
    assert reward == pytest.approx(1.0)  # clipped: 0.3 + 0.4 + 1.0 = 1.7 -> 1.0 (the built-ins alone: the seed's clip)
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


# ---------------------------------------------------------------- reward errors


class FlakyVerifier(grpo_gym.tasks.ArithmeticTask):
    """An arithmetic task whose verifier raises on every call, as a buggy user task might."""

    def verify(self, problem: Problem, answer: str) -> grpo_gym.Verdict:
        raise RuntimeError("verifier bug")


def test_reward_errors_reach_info_and_warn_once_per_env() -> None:
    env = R1ZeroEnv(task=FlakyVerifier(), context_length=256, max_new_tokens=96, template="compact")
    env.reset(seed=0)
    action = encode_completion(env, gold_text(env))
    with pytest.warns(RuntimeWarning, match="RuntimeError: verifier bug"):
        _, reward, terminated, _, info = env.step(action)
    assert info["reward_errors"] == {"task": "RuntimeError: verifier bug"}
    assert info["reward_reasons"]["task"] == "error: RuntimeError: verifier bug"
    assert info["reward_components"]["task"] == 0.0 and not info["is_success"] and terminated
    assert reward == pytest.approx(0.3 + 0.4 * info["reward_components"]["consistency"])
    env.reset(seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per env: the second error is counted, not warned
        info = env.step(encode_completion(env, gold_text(env)))[4]
    assert info["reward_errors"] and env.reward_fn.error_counts["task"] == 2
    fine = R1ZeroEnv(context_length=256, max_new_tokens=96, template="compact")
    fine.reset(seed=0)
    assert fine.step(encode_completion(fine, gold_text(fine)))[4]["reward_errors"] == {}


def test_on_reward_error_raise_propagates_from_step() -> None:
    env = R1ZeroEnv(
        task=FlakyVerifier(), context_length=256, max_new_tokens=96, template="compact", on_reward_error="raise"
    )
    env.reset(seed=0)
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="verifier bug"):
        env.step(encode_completion(env, gold_text(env)))


# ---------------------------------------------------------------- get_state / set_state


def draw(env: R1ZeroEnv, n: int) -> list[Problem]:
    return [env.reset()[1]["problem"] for _ in range(n)]


def test_set_state_continues_with_the_same_problems() -> None:
    kwargs = {"context_length": 256, "max_new_tokens": 32, "template": "compact"}
    env = R1ZeroEnv(**kwargs)
    env.reset(seed=3)
    draw(env, 4)
    env.set_difficulty(0.7)
    env.set_reward_weights({"task": 0.5})
    state = json.loads(json.dumps(env.get_state()))  # plain JSON data
    expected = draw(env, 6)
    fresh = R1ZeroEnv(**kwargs)
    fresh.set_state(state)
    assert (fresh.difficulty, fresh.reward_fn.weights["task"]) == (0.7, 0.5)
    assert draw(fresh, 6) == expected
    # the problem in progress is restored too
    fresh.set_state(state)
    assert fresh.problem == state_problem(env, state)


def state_problem(env: R1ZeroEnv, state: dict) -> Problem:
    from grpo_gym.env_state import restore_problem

    return restore_problem(env.task, state["episode"]["problem"])


@pytest.mark.parametrize("mode", ["sequence", "token"])
def test_set_state_mid_episode_continues_exactly(mode: str) -> None:
    kwargs = {"context_length": 512, "max_new_tokens": 48, "max_turns": 3, "template": "compact", "action_mode": mode}
    env = R1ZeroEnv(**kwargs)
    env.reset(seed=5)
    wrong = encode_completion(env, "<think>guess</think><answer>-1</answer>")
    if mode == "sequence":
        env.step(wrong)  # a wrong answer: feedback appended, the episode goes on
    else:
        for token in wrong[:5]:
            env.step(int(token))  # an unfinished turn
    state = env.get_state()
    fresh = R1ZeroEnv(**kwargs)
    fresh.set_state(json.loads(json.dumps(state)))
    if mode == "sequence":
        a, b = env.step(encode_completion(env, gold_text(env))), fresh.step(encode_completion(fresh, gold_text(fresh)))
    else:
        for token in wrong[5:]:
            a, b = env.step(int(token)), fresh.step(int(token))
            if a[2] or a[3]:
                break
    np.testing.assert_array_equal(a[0]["input_ids"], b[0]["input_ids"])
    assert a[1:4] == b[1:4] and a[4]["completion"] == b[4]["completion"]
    assert draw(env, 3) == draw(fresh, 3)


def test_state_through_a_vec_env_and_pinned_problems() -> None:
    kwargs = {"context_length": 256, "max_new_tokens": 32, "template": "compact"}
    venv = make_vec_env("R1Zero-v0", n_envs=2, seed=1, env_kwargs=kwargs, vec_env_cls=DummyVecEnv)
    venv.reset()
    pinned = Problem(prompt="What is 1+1?", answer="2", task="arithmetic", difficulty=0.1, metadata={"k": [1]})
    venv.env_method("reset", options={"problem": pinned}, indices=[1])
    states = venv.env_method("get_state")
    assert states[1]["episode"]["problem"] == {"fields": dataclasses.asdict(pinned)}
    other = make_vec_env("R1Zero-v0", n_envs=2, seed=99, env_kwargs=kwargs, vec_env_cls=DummyVecEnv)
    for i, state in enumerate(states):
        other.env_method("set_state", state, indices=[i])
    assert other.get_attr("problem")[1] == pinned
    assert [draw(e.unwrapped, 3) for e in venv.envs] == [draw(e.unwrapped, 3) for e in other.envs]


def test_set_state_refuses_a_state_of_another_env_and_changes_nothing() -> None:
    env = R1ZeroEnv(context_length=256, max_new_tokens=32, template="compact")
    env.reset(seed=0)
    state = env.get_state()
    other = R1ZeroEnv(context_length=512, max_new_tokens=32, template="compact")
    other.reset(seed=1)
    before = other.get_state()
    with pytest.raises(ValueError, match="context_length: saved 256, this env 512"):
        other.set_state(state)
    with pytest.raises(ValueError, match="not an R1ZeroEnv state"):
        other.set_state({"format": "something else"})
    broken = json.loads(json.dumps(before))
    broken["np_random"]["bit_generator"] = "os.system"
    with pytest.raises(ValueError, match="unknown bit generator"):
        other.set_state(broken)
    broken = json.loads(json.dumps(before))
    broken["episode"]["window"] = [10**6]
    with pytest.raises(ValueError, match="window ids"):
        other.set_state(broken)
    assert other.get_state() == before


# ---------------------------------------------------------------- long prompts: O(context_length) per reset


def small_bpe() -> Any:
    """A byte-level BPE tokenizer (GPT-2 style pre-tokenization), trained here on a few sentences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(["What is 12+34? Where is the fox? The lazy dog sleeps."] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


@pytest.mark.parametrize("tokenizer", ["builtin", "bpe"])
def test_multi_megabyte_jsonl_prompt_costs_only_the_window(tmp_path, monkeypatch, tokenizer: str) -> None:
    line = "Where is the fox? 12+34 é日本 <think>\n"
    prompt = line * 120_000 + "So: what is 2+2?"  # ~4.8 MB in one jsonl row
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"prompt": prompt, "answer": "4"}) + "\n", encoding="utf-8")
    env = R1ZeroEnv(
        task="jsonl",
        task_kwargs={"path": path},
        tokenizer=small_bpe() if tokenizer == "bpe" else None,
        context_length=384,
        max_new_tokens=32,
        template="compact",
    )
    encoded: list[int] = []
    encode = env.codec.encode
    monkeypatch.setattr(env.codec, "encode", lambda text: encoded.append(len(text)) or encode(text))
    with pytest.warns(UserWarning, match="context_length"):
        obs, info = env.reset(seed=0)
    assert info["prompt_truncated"] and obs["attention_mask"].all()
    assert sum(encoded) <= 3 * 4 * (384 + 16)  # characters read: a bounded multiple of the window
    # The reference: the whole templated prompt encoded, newest 384 tokens kept. Both tokenizers start a new
    # token after every "\n" (the built-in one splits every character; byte-level BPE pre-tokenizes "\n" apart
    # from the letter after it), so encoding the text from a line start on gives the full encoding's tail.
    text = env.formatter.prompt(prompt)
    start = text.rindex("\n", 0, len(text) - 50_000) + 1
    np.testing.assert_array_equal(obs["input_ids"], encode(text[start:])[-384:])
    assert env.encode_example(prompt, "x")[0].tolist() == obs["input_ids"].tolist()


# ---------------------------------------------------------------- actions by hand, gold stand-ins
def test_encode_and_decode_action_round_trip() -> None:
    env = R1ZeroEnv(context_length=128, max_new_tokens=16, template="compact")
    action = env.encode_action("<think>1</think>")
    assert action.shape == (16,) and action.dtype == np.int64 and env.action_space.contains(action)
    assert action[3] == env.codec.eos_id and (action[4:] == env.codec.pad_id).all()  # a tag is one token
    assert env.decode_action(action) == "<think>1</think>"
    clipped = env.encode_action("x" * 40)  # longer than the budget: cut, no EOS
    assert env.codec.eos_id not in clipped and env.decode_action(clipped) == "x" * 16
    env.reset(seed=0)
    assert env.step(clipped)[4]["completion_clipped"] is True
    with pytest.raises(ValueError, match="completion text"):
        env.encode_action(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shape"):
        env.decode_action(np.zeros(3, dtype=np.int64))


def test_gold_examples_without_reasoning_get_a_well_formed_stand_in(tmp_path) -> None:
    from grpo_gym.rewards import parse_completion

    rows = [{"prompt": "Capital of France?", "answer": "Paris"}, {"prompt": "2+2?", "answer": "4", "solution": "2+2=4"}]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    env = R1ZeroEnv(task="jsonl", task_kwargs={"path": str(path)}, context_length=256, max_new_tokens=64)
    env.reset(seed=0)
    examples = env.gold_examples(40)
    texts = [env.codec.decode(completion[:-1]) for _, completion in examples]
    assert all(parse_completion(text).well_formed for text in texts)
    assert "<think>The answer is Paris.</think><answer>Paris</answer>" in texts
    assert "<think>2+2=4</think><answer>4</answer>" in texts
    assert env.gold_stand_ins == sum("The answer is" in t for t in texts) > 0
