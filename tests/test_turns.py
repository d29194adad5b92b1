"""Rewards and credit per turn in multi-turn episodes: reward functions marked ``per_turn`` score tool turns,
``turn_credit="reward_to_go"`` trains each turn on its own discounted reward-to-go against the group's episode-level
baseline, and a rollout logs its tool and turn statistics."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch as th

import grpo_gym
from algorithms import GRPO
from algorithms.common.advantages import group_advantages
from algorithms.common.generation.sampler import Completions
from algorithms.common.rollout.rows import Rows, turn_returns, turn_statistics
from algorithms.grpo.advantages import turn_advantages, turn_weights
from grpo_gym import per_turn
from grpo_gym.gold import answer_text, tool_call_text
from grpo_gym.validation import ArgumentError
from tests.sizes import TINY
from tests.test_tool_training import TOOL_ENV, make_env, remember_problems, rows_to_tensors


def tool_env(**kwargs: Any) -> grpo_gym.R1ZeroEnv:
    return grpo_gym.R1ZeroEnv(**{**TOOL_ENV, **kwargs})


def gold_turns(env: grpo_gym.R1ZeroEnv) -> tuple[str, str]:
    calls, reasoning, answer = env.task.tool_solution(env.problem, env.tools.names)
    return tool_call_text(calls), answer_text(reasoning, answer)


def play(env: grpo_gym.R1ZeroEnv, text: str) -> tuple[Any, float, bool, bool, dict]:
    return env.step(env.encode_action(text))


def test_per_turn_reward_functions_score_tool_turns_and_the_others_answers_only() -> None:
    seen: list[dict[str, Any]] = []
    answers: list[list[int]] = []

    @per_turn
    def tool_ran(prompts, completions, turn, turn_completions, tool_calls, **kwargs) -> list[float]:
        seen.append({"turn": list(turn), "text": list(turn_completions), "calls": tool_calls, "all": completions})
        return [(0.5 if all("error" not in c for c in calls) else -0.5) if calls else 0.0 for calls in tool_calls]

    def answer_only(prompts, completions, turn, **kwargs) -> list[float]:
        answers.append(list(turn))
        return [1.0] * len(completions)

    env = tool_env(reward_funcs={"tool_ran": tool_ran, "answer_only": answer_only})
    env.reset(seed=3)
    first, final = gold_turns(env)
    _, _, _, _, info = play(env, first)
    components = info["reward_components"]
    assert components["tool_ran"] == 0.5 and components["answer_only"] is None and answers == []
    (record,) = seen
    assert record["turn"] == [0] and record["text"] == [first] and record["all"] == [first]
    assert [c["name"] for c in record["calls"][0]] == ["calculator"] and "result" in record["calls"][0][0]
    _, _, terminated, _, info = play(env, final)
    assert terminated and info["is_success"] and answers == [[1]]  # the answer is the episode's second model turn
    assert seen[-1]["turn"] == [1] and seen[-1]["text"] == [final] and seen[-1]["calls"] == [[]]
    assert seen[-1]["all"][0].startswith(first) and seen[-1]["all"][0].endswith(final)  # the whole transcript
    assert info["reward_components"]["tool_ran"] == 0.0
    env.reset(seed=4)
    bad = tool_call_text([{"name": "abacus", "arguments": {}}])
    assert play(env, bad)[4]["reward_components"]["tool_ran"] == -0.5  # a call that failed, on its own turn
    with pytest.raises(ArgumentError, match="per_turn: cannot mark"):
        per_turn(len)  # a builtin takes no attributes


def rows_of(rewards: list[list[float]]) -> Rows:
    """Rows of episodes with the given per-turn rewards (contexts and tokens left empty: not read here)."""
    rows = Rows()
    for episode, turns in enumerate(rewards):
        for turn, reward in enumerate(turns):
            rows.episodes.append(episode)
            rows.turns.append(turn)
            rows.rewards.append(reward)
            rows.infos.append({})
    return rows


def test_reward_to_go_advantages_follow_the_formula() -> None:
    rewards = [[0.5, 1.0], [0.0, 1.0], [0.5, 0.0], [0.0], [0.2, 0.0, 1.0], [0.0, 0.0]]  # two groups of three
    rows, gamma = rows_of(rewards), 0.9
    to_go = turn_returns(rows, len(rewards), gamma)[rows.episodes, rows.turns]  # (N,)
    expected = [sum(gamma**k * r for k, r in enumerate(turns[t:])) for turns in rewards for t in range(len(turns))]
    assert th.allclose(to_go, th.tensor(expected))
    first = th.tensor([sum(gamma**k * r for k, r in enumerate(turns)) for turns in rewards])  # G_{i,0}
    returns = first.view(2, 3)
    advantages = group_advantages(returns).flatten()
    weights = turn_weights(returns).repeat_interleave(3)
    row_episodes = th.tensor(rows.episodes)
    got = turn_advantages(advantages, first, to_go, row_episodes, weights)
    mean, std = returns.mean(dim=1), returns.std(dim=1) + 1e-4  # (2,)
    group = row_episodes // 3
    assert th.allclose(got, (to_go - mean[group]) / std[group], atol=1e-6)  # (G_{i,t} - mean_g G_{j,0}) / s_g
    final_only = rows_of([[0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0]])  # one reward at the end, gamma = 1
    ones = turn_returns(final_only, 3, 1.0)[final_only.episodes, final_only.turns]
    episode = th.tensor([1.0, 0.0, 1.0])
    scores = group_advantages(episode[None]).flatten()
    same = turn_advantages(scores, episode, ones, th.tensor(final_only.episodes), turn_weights(episode[None]).expand(3))
    assert th.equal(same, scores[th.tensor(final_only.episodes)])  # the episode credit exactly


def test_turn_weights_never_divide_by_a_vanishing_spread() -> None:
    returns = th.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.5]])
    weights = turn_weights(returns)
    assert weights[0] == 0.0 and weights[1] == pytest.approx(1 / (returns[1].std().item() + 1e-4))
    assert th.equal(turn_weights(returns, "none"), th.ones(2)) and th.equal(
        turn_weights(returns, relative=False), th.ones(2)
    )
    assert th.equal(turn_weights(th.ones(2, 3), "batch"), th.zeros(2))
    assert th.equal(turn_weights(returns[:, :1]), th.zeros(2))  # groups of one: no baseline, no signal


def scripted(model: GRPO, env: grpo_gym.R1ZeroEnv, problems: dict[str, Any]):
    """``model.rollouts.sample`` replaced by a policy that always calls the tool and then answers right in every other
    episode of a batch (so each group of four has two successes), log-probs from the real policy."""

    def sample(prompts: list[th.Tensor], **_: Any) -> Completions:
        texts = []
        for i, prompt in enumerate(prompts):
            context = env.codec.decode(prompt.numpy())
            problem = problems[context.split("User: ", 1)[1].split("\n", 1)[0]]
            calls, reasoning, answer = env.task.tool_solution(problem, env.tools.names)
            wrong = answer_text("no idea", str(int(problem.answer) + 1))
            later = "\nTool: " in context
            texts.append((answer_text(reasoning, answer) if i % 2 == 0 else wrong) if later else tool_call_text(calls))
        tokens = th.as_tensor(np.stack([env.encode_action(text) for text in texts]))
        mask = th.zeros_like(tokens, dtype=th.bool)
        for i, text in enumerate(texts):
            mask[i, : len(env.codec.encode(text)) + 1] = True
        ids, prompt_mask = rows_to_tensors(prompts, tokens, mask, model.policy.pad_token_id)[:2]
        log_probs = model.policy.log_probs(ids, prompt_mask, tokens, mask)[0].detach()
        return Completions(tokens, log_probs, mask, mask.sum(-1))

    return sample


@per_turn
def call_bonus(prompts, completions, tool_calls, **kwargs) -> list[float]:
    return [0.25 if calls else 0.0 for calls in tool_calls]


@pytest.mark.parametrize("credit", ["episode", "reward_to_go"])
def test_grpo_trains_each_turn_on_the_credit_chosen_and_logs_the_turns(credit: str) -> None:
    vec = make_env(n_envs=4, reward_funcs={"call_bonus": call_bonus})
    model = GRPO("TransformerPolicy", vec, n_groups=2, group_size=4, cold_start=False, policy_kwargs=TINY, seed=0,
                 gamma=0.9, turn_kwargs={"credit": credit})  # fmt: skip
    env = vec.envs[0].unwrapped
    problems = remember_problems(model)
    model.rollouts.sample = scripted(model, env, problems)
    seen: list[tuple[Rows, dict[str, float], Any]] = []
    build = model._build_batch

    def build_and_keep(rows: Rows, seconds: float) -> Any:
        logged = dict(model.logger.name_to_value)  # what the rollout logged before its batch
        batch = build(rows, seconds)
        seen.append((rows, logged, batch))
        return batch

    model._build_batch = build_and_keep
    model.learn(16)
    rows, logged, batch = seen[0]
    assert len(batch.advantages) == len(rows.episodes) == 16  # two turns per episode, no group left out
    rewards = [[0.0, 0.0] for _ in range(8)]
    for e, t, r in zip(rows.episodes, rows.turns, rows.rewards, strict=True):
        rewards[e][t] = r
    assert all(r[0] > 0 for r in rewards)  # the bonus scored every tool turn
    first = th.tensor([r[0] + 0.9 * r[1] for r in rewards])  # G_{i,0}
    mean, std = first.view(2, 4).mean(dim=1), first.view(2, 4).std(dim=1) + 1e-4  # per group
    group = th.tensor(rows.episodes) // 4
    pairs = zip(rows.episodes, rows.turns, strict=True)
    to_go = th.tensor([rewards[e][t] + (0.9 * rewards[e][1] if t == 0 else 0.0) for e, t in pairs])  # G_{i,t}
    episode_credit = (first[th.tensor(rows.episodes)] - mean[group]) / std[group]
    expected = episode_credit if credit == "episode" else (to_go - mean[group]) / std[group]
    if credit == "reward_to_go":
        assert not th.allclose(expected, episode_credit)  # the per-turn bonus moves the tool turns' credit
    assert th.allclose(batch.advantages.cpu(), expected, atol=1e-5)
    assert logged["rollout/tool_call_rate"] == 0.5 and logged["rollout/tool_error_rate"] == 0.0
    assert logged["rollout/turns_per_episode"] == 2.0
    assert logged["rollout/success_by_turns/2"] == pytest.approx(0.5)
    assert turn_statistics(rows_of([[1.0], [0.0]])) is None  # one-turn episodes without tools: nothing logged


def test_turn_credit_is_checked() -> None:
    with pytest.raises(ValueError, match=r"turn_kwargs\['credit'\] must be one of"):
        GRPO(
            "TransformerPolicy",
            make_env(),
            n_groups=1,
            group_size=2,
            policy_kwargs=TINY,
            turn_kwargs={"credit": "per_turn"},
        )
