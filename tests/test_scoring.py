"""Scoring ahead: ``R1ZeroEnv.score_ahead`` scores a batch once, ``step`` returns each pair's result (the same result
as scoring alone), across processes too."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import SubprocVecEnv

import grpo_gym
from grpo_gym.scoring import ScoreAhead, problem_key
from tests.sizes import ENV_KWARGS

CALLS: list[int] = []


def counting(prompts, completions, answer, **kwargs):
    CALLS.append(len(completions))
    return [float(a in c) for c, a in zip(completions, answer, strict=True)]


def texts_for(env: grpo_gym.R1ZeroEnv, problem: grpo_gym.Problem) -> list[str]:
    reasoning, answer = env.task.solution(problem)
    gold = f"<think>{reasoning}</think><answer>{answer}</answer>"
    return [gold, gold, "<think>no</think><answer>0</answer>", "x" * 200]  # twice the same; one clipped


def test_score_ahead_scores_once_and_step_returns_the_same_results() -> None:
    env = grpo_gym.R1ZeroEnv(**ENV_KWARGS, reward_funcs={"counting": counting})
    alone = grpo_gym.R1ZeroEnv(**ENV_KWARGS, reward_funcs={"counting": counting})
    problems = [env.sample_problem(seed=s) for s in (3, 4)]
    pairs = [(p, env.encode_action(t)) for p in problems for t in texts_for(env, p)]
    CALLS.clear()
    env.score_ahead([p for p, _ in pairs], [a for _, a in pairs])
    assert CALLS == [8]
    for problem, action in pairs:
        env.reset(options={"problem": pickle.loads(pickle.dumps(problem))})  # a copy, as a subprocess gets
        got = env.step(action)
        alone.reset(options={"problem": problem})
        want = alone.step(action)
        assert (got[1], got[4]) == (want[1], want[4])
    assert CALLS == [8] + [1] * 8  # the env scored nothing itself; the unbatched one 8 times
    assert len(env._ahead) == 0
    env.reset(options={"problem": problems[0]})
    env.step(pairs[0][1])  # nothing left: scored alone
    assert CALLS[-1] == 1 and len(CALLS) == 10


def test_score_ahead_checks_its_arguments() -> None:
    env = grpo_gym.R1ZeroEnv(**ENV_KWARGS)
    problem = env.sample_problem(seed=0)
    with pytest.raises(ValueError, match="1 problems but 2 actions"):
        env.score_ahead([problem], [env.encode_action("a")] * 2)
    with pytest.raises(ValueError, match="Problem objects"):
        env.score_ahead(["What is 1+1?"], [env.encode_action("a")])
    with pytest.raises(ValueError, match="shape"):
        env.score_ahead([problem], [np.zeros(3, dtype=np.int64)])
    with pytest.raises(ValueError, match="action_mode='sequence'"):
        grpo_gym.R1ZeroEnv(**ENV_KWARGS, action_mode="token").score_ahead([problem], [np.zeros(3)])


def test_score_ahead_keys_on_content_and_queues_duplicates() -> None:
    ahead = ScoreAhead()
    env = grpo_gym.R1ZeroEnv(**ENV_KWARGS)
    problem = env.sample_problem(seed=1)
    action = env.encode_action("same")
    ahead.store([problem, problem], [action, action], ["first", "second"])
    copy = pickle.loads(pickle.dumps(problem))
    assert problem_key(copy) == problem_key(problem)
    assert ahead.pop(env.sample_problem(seed=2), action) is None
    assert (ahead.pop(copy, action), ahead.pop(problem, action), ahead.pop(problem, action)) == (
        "first",
        "second",
        None,
    )


def test_score_ahead_through_a_subprocess_vec_env() -> None:
    venv = make_vec_env("grpo_gym:R1Zero-v0", n_envs=2, env_kwargs=ENV_KWARGS, vec_env_cls=SubprocVecEnv)
    try:
        scorer = grpo_gym.R1ZeroEnv(**ENV_KWARGS)
        problems = [scorer.sample_problem(seed=s) for s in (5, 6)]
        actions = [scorer.encode_action(texts_for(scorer, p)[0]) for p in problems]
        for i in range(2):
            venv.env_method("score_ahead", [problems[i]], [actions[i]], indices=[i])
        venv.set_options([{"problem": p} for p in problems])
        venv.reset()
        _, rewards, _, infos = venv.step(np.stack(actions))
        assert rewards.tolist() == [1.0, 1.0] and all(info["is_success"] for info in infos)
        assert [len(ahead) for ahead in venv.get_attr("_ahead")] == [0, 0]  # each pair found its stored result
    finally:
        venv.close()
