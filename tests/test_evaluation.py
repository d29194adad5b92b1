"""Held-out evaluation: a fixed problem set, seeded sampling, scores that agree with the env, the table."""

from __future__ import annotations

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.vec_env import DummyVecEnv

import grpo_gym
from algorithms import TransformerPolicy
from algorithms.common.evaluation import (
    HELD_OUT_SEED,
    EvalResult,
    evaluate_difficulties,
    evaluate_problems,
    format_table,
    held_out_problems,
    pass_at_k,
)
from algorithms.common.generation.sampler import Completions
from tests.sizes import ENV_KWARGS, TINY_KWARGS


def make_env(**kwargs) -> DummyVecEnv:
    return DummyVecEnv([lambda: grpo_gym.R1ZeroEnv(**{**ENV_KWARGS, **kwargs})])


def make_policy(env: DummyVecEnv, **kwargs) -> TransformerPolicy:
    return TransformerPolicy(
        env.observation_space,
        env.action_space,
        lambda _: 1e-3,
        **{"model": "tiny", "model_kwargs": TINY_KWARGS, "seed": 0, "eos_token_id": 1, "pad_token_id": 0, **kwargs},
    )


def describe(problems: list) -> list[tuple[str, str, int]]:
    return [(p.prompt, p.answer, p.seed) for p in problems]


def completion_ids(core: grpo_gym.R1ZeroEnv, text: str) -> np.ndarray:
    """A sequence-mode action: ``text`` then EOS, padded to ``max_new_tokens``."""
    ids = np.append(core.codec.encode(text), core.codec.eos_id)
    assert len(ids) <= core.max_new_tokens, text
    action = np.full(core.max_new_tokens, core.codec.pad_id, dtype=np.int64)
    action[: len(ids)] = ids
    return action


def scripted_generate(actions: np.ndarray):
    """A stand-in for ``policy.generate`` that returns the given actions (pad after EOS) as completions."""

    def generate(input_ids, attention_mask, generator=None, greedy=False, max_new_tokens=None) -> Completions:
        assert input_ids.shape[0] == len(actions)
        tokens = th.as_tensor(actions)
        ends = (tokens == 1).long().argmax(dim=1)  # the EOS position
        mask = th.arange(tokens.shape[1])[None] <= ends[:, None]
        return Completions(tokens, th.zeros(tokens.shape), mask, mask.sum(-1))

    return generate


def test_held_out_problems_are_fixed_per_seed() -> None:
    env = make_env()
    first = held_out_problems(env, 8, 0.5)
    assert describe(held_out_problems(env, 8, 0.5)) == describe(first)
    assert describe(held_out_problems(make_env(), 8, 0.5)) == describe(first)  # another env, the same set
    assert [p.seed for p in first] == [HELD_OUT_SEED + i for i in range(8)]
    assert all(p.difficulty == 0.5 for p in first)
    other = held_out_problems(env, 8, 0.5, seed=1)
    assert [p.seed for p in other] == [HELD_OUT_SEED + 8 + i for i in range(8)]
    assert describe(other) != describe(first)
    assert len({p.prompt for p in first} | {p.prompt for p in other}) > 8  # not the same problems reordered


def test_held_out_problems_are_not_the_training_draws() -> None:
    env = make_env(difficulty=1.0)
    env.seed(0)
    env.reset()
    training = [env.env_method("sample_problem", indices=[0])[0].prompt for _ in range(16)]
    held_out = [p.prompt for p in held_out_problems(env, 16, 1.0)]
    assert not set(training) & set(held_out)
    # drawing held-out problems leaves the env's own generator alone
    env.seed(0)
    env.reset()
    held_out_problems(env, 16, 1.0)
    assert [env.env_method("sample_problem", indices=[0])[0].prompt for _ in range(16)] == training


def test_same_seed_same_result() -> None:
    env = make_env()
    policy = make_policy(env)
    problems = held_out_problems(env, 6, 0.1)
    first = evaluate_problems(policy, env, problems, seed=0)
    assert evaluate_problems(policy, env, problems, seed=0) == first
    assert isinstance(first, EvalResult)
    assert first.n_problems == 6 and first.difficulty == 0.1
    assert 0.0 <= first.success_rate <= 1.0 and -1.0 <= first.mean_reward <= 1.0
    assert 1.0 <= first.mean_length <= ENV_KWARGS["max_new_tokens"]


def test_evaluation_agrees_with_scoring_the_completions_through_the_env() -> None:
    env = make_env()
    policy = make_policy(env)
    problems = held_out_problems(env, 8, 0.1)
    sampled: list[Completions] = []
    original = policy.generate

    def spy(*args, **kwargs) -> Completions:
        sampled.append(original(*args, **kwargs))
        return sampled[-1]

    policy.generate = spy
    result = evaluate_problems(policy, env, problems, seed=3)
    assert len(sampled) == 1  # one batch for all problems
    scorer = grpo_gym.R1ZeroEnv(**ENV_KWARGS)
    rewards, successes = [], []
    for problem, action in zip(problems, sampled[0].tokens.numpy(), strict=True):
        scorer.reset(options={"problem": problem})
        _, reward, _, _, info = scorer.step(action)
        rewards.append(reward)
        successes.append(info["is_success"])
    assert result.mean_reward == pytest.approx(np.mean(rewards))
    assert result.success_rate == pytest.approx(np.mean(successes))
    assert result.mean_length == pytest.approx(sampled[0].lengths.float().mean().item())


def test_gold_completions_score_full_marks(monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env()
    core = env.envs[0]
    policy = make_policy(env)
    problems = held_out_problems(env, 5, 0.1)
    texts = [f"<think>{r}</think><answer>{a}</answer>" for r, a in map(core.task.solution, problems)]
    actions = np.stack([completion_ids(core, text) for text in texts])
    monkeypatch.setattr(policy, "generate", scripted_generate(actions))
    result = evaluate_problems(policy, env, problems)
    assert result.success_rate == 1.0 and result.mean_reward == pytest.approx(1.0)
    expected_length = np.mean([len(core.codec.encode(t)) + 1 for t in texts])  # EOS included
    assert result.mean_length == pytest.approx(expected_length)


def test_half_gold_half_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env()
    core = env.envs[0]
    policy = make_policy(env)
    problems = held_out_problems(env, 4, 0.1)
    rows = []
    for i, problem in enumerate(problems):
        reasoning, answer = core.task.solution(problem)
        rows.append(completion_ids(core, f"<think>{reasoning}</think><answer>{answer}</answer>" if i % 2 else ""))
    monkeypatch.setattr(policy, "generate", scripted_generate(np.stack(rows)))
    result = evaluate_problems(policy, env, problems)
    # an empty completion (EOS at once) earns 0 on every component: (0 + 1 + 0 + 1) / 4
    assert result.success_rate == 0.5 and result.mean_reward == pytest.approx(0.5)


def test_prompts_are_cut_to_the_policy_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env()
    policy = make_policy(env, memory_length=ENV_KWARGS["max_new_tokens"] + 5)
    problems = held_out_problems(env, 3, 0.1)
    widths = []
    original = policy.generate

    def spy(input_ids, attention_mask, **kwargs) -> Completions:
        widths.append(int(attention_mask.sum(dim=1).max()))
        return original(input_ids, attention_mask, **kwargs)

    monkeypatch.setattr(policy, "generate", spy)
    evaluate_problems(policy, env, problems)
    assert widths == [5]


def test_evaluate_difficulties_one_result_per_level() -> None:
    env = make_env()
    policy = make_policy(env)
    results = evaluate_difficulties(policy, env, [0.1, 0.4], 3, seed=0, greedy=True)
    assert [r.difficulty for r in results] == [0.1, 0.4]
    assert [r.n_problems for r in results] == [3, 3]
    # each level equals evaluate_problems on that level's held-out set
    assert results[1] == evaluate_problems(policy, env, held_out_problems(env, 3, 0.4), seed=0, greedy=True)


def test_format_table() -> None:
    rows = {
        "before GRPO": [EvalResult(0.1, 4, 0.5, 0.65, 12.25), EvalResult(0.3, 4, 0.0, -0.1, 24.0)],
        "after GRPO": [EvalResult(0.1, 4, 1.0, 1.0, 11.0)],
    }
    lines = format_table(rows).splitlines()
    assert len(lines) == 1 + 3  # a header, then one line per (label, difficulty)
    assert lines[0].split() == ["policy", "difficulty", "problems", "success", "reward", "length"]
    assert lines[1].split() == ["before", "GRPO", "0.10", "4", "50.0%", "0.650", "12.2"]
    assert lines[2].split() == ["before", "GRPO", "0.30", "4", "0.0%", "-0.100", "24.0"]
    assert lines[3].split() == ["after", "GRPO", "0.10", "4", "100.0%", "1.000", "11.0"]
    assert len({len(line) for line in lines}) == 1  # aligned columns
    assert format_table({}).splitlines() == lines[:1]


def test_pass_at_k_of_a_grid() -> None:
    grid = np.array([[0, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]])
    assert pass_at_k(grid) == (pytest.approx(5 / 12), 0.75)
    assert pass_at_k(grid[:, :1]) == (0.25, 0.25)  # one sample: pass@1 is the success
    with pytest.raises(ValueError, match="grid"):
        pass_at_k(np.zeros(3))


def test_pass_at_k_on_a_planted_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy solves nothing; the first sample solves problem 0, the second problems 0 and 2, the third none: greedy
    0%, sampled success 3 of 12, pass@3 2 of 4."""
    env = make_env()
    core = env.envs[0]
    policy = make_policy(env)
    problems = held_out_problems(env, 4, 0.1)
    gold = [
        completion_ids(core, "<think>{}</think><answer>{}</answer>".format(*core.task.solution(p))) for p in problems
    ]
    empty = completion_ids(core, "")
    planted = [[], [0], [0, 2], []]  # per call: the problems answered right (greedy first)
    calls: list[bool] = []

    def generate(input_ids, attention_mask, generator=None, greedy=False, **_) -> Completions:
        right = planted[len(calls)]
        calls.append(greedy)
        rows = np.stack([gold[i] if i in right else empty for i in range(len(problems))])
        return scripted_generate(rows)(input_ids, attention_mask)

    monkeypatch.setattr(policy, "generate", generate)
    result = evaluate_problems(policy, env, problems, seed=0, samples=3)
    assert calls == [True, False, False, False]  # one greedy batch, then K sampled batches of the problems
    assert (result.success_rate, result.sampled_success, result.pass_at_k, result.samples) == (0.0, 0.25, 0.5, 3)


def test_pass_at_k_is_no_lower_than_pass_at_1_and_greedy_is_the_greedy_result() -> None:
    env = make_env()
    policy = make_policy(env)
    problems = held_out_problems(env, 6, 0.1)
    result = evaluate_problems(policy, env, problems, seed=0, samples=4)
    assert result.samples == 4 and result.pass_at_k >= result.sampled_success
    greedy = evaluate_problems(policy, env, problems, seed=0, greedy=True)
    assert (result.success_rate, result.mean_reward, result.mean_length) == (
        greedy.success_rate, greedy.mean_reward, greedy.mean_length,
    )  # fmt: skip
    assert evaluate_problems(policy, env, problems, seed=0, samples=4) == result  # seeded
    with pytest.raises(ValueError, match="samples"):
        evaluate_problems(policy, env, problems, samples=-1)


def test_format_table_with_pass_at_k() -> None:
    rows = {"before": [EvalResult(0.3, 4, 0.25, 0.5, 10.0, samples=8, sampled_success=0.375, pass_at_k=0.75)]}
    lines = format_table(rows).splitlines()
    assert lines[0].split() == ["policy", "difficulty", "problems", "greedy", "sampled", "pass@8", "reward", "length"]
    assert lines[1].split() == ["before", "0.30", "4", "25.0%", "37.5%", "75.0%", "0.500", "10.0"]


def test_no_problems_is_a_clear_error() -> None:
    env = make_env()
    with pytest.raises(ValueError, match="at least one"):
        evaluate_problems(make_policy(env), env, [])


def test_a_held_out_file_is_what_the_evaluation_scores(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    train, held_out = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    train.write_text("\n".join(json.dumps({"prompt": f"{i}+1?", "answer": str(i + 1)}) for i in range(20)))
    held_out.write_text("\n".join(json.dumps({"prompt": f"{i}*2?", "answer": str(2 * i)}) for i in range(6)))
    env = make_env(task="jsonl", task_kwargs={"path": str(train), "eval_data": str(held_out)})
    problems = held_out_problems(env, 100, 0.3)
    assert [p.prompt for p in problems] == [f"{i}*2?" for i in range(6)]  # every eval row, none of the training
    assert held_out_problems(env, 3, 0.3) == held_out_problems(env, 3, 0.3)  # a fixed subset per seed
    core = env.envs[0]
    policy = make_policy(env)
    actions = np.stack([completion_ids(core, f"<think>x</think><answer>{p.answer}</answer>") for p in problems])
    actions[:2] = np.stack([completion_ids(core, "<think>x</think><answer>-1</answer>")] * 2)
    monkeypatch.setattr(policy, "generate", scripted_generate(actions))
    result = evaluate_difficulties(policy, env, [0.3], 100)[0]
    assert (result.n_problems, result.success_rate, result.source) == (6, pytest.approx(4 / 6), "eval split")
    assert format_table({"after": [result]}).splitlines()[0].split()[-1] == "source"
    assert format_table({"after": [result]}).splitlines()[1].split()[-2:] == ["eval", "split"]

    without = make_env(task="jsonl", task_kwargs={"path": str(train)})
    with pytest.warns(UserWarning, match="no eval split"):
        drawn = held_out_problems(without, 4, 0.3)
    assert all(p.prompt.endswith("+1?") for p in drawn)
    monkeypatch.setattr(policy, "generate", scripted_generate(actions[:4]))
    assert evaluate_problems(policy, without, drawn).source == "training rows"
