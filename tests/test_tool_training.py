"""Training and evaluating on episodes with tools: the loss gets no gradient from tool-result tokens (they are
context), multi-turn episodes are collected in batches across envs (one row per model turn), the cold start trains
on the two-turn gold, and held-out evaluation plays whole episodes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

import grpo_gym
from algorithms import GRPO
from algorithms.common.evaluation import evaluate_problems
from algorithms.common.generation.sampler import Completions
from algorithms.common.rollout.batch import rows_to_batch
from algorithms.common.rollout.rows import Rows, contexts_from_obs
from algorithms.grpo.update import LossSettings, minibatch_loss
from grpo_gym.gold import answer_text, tool_call_text
from tests.sizes import TINY

TOOL_ENV = {
    "template": "compact",
    "max_new_tokens": 112,
    "context_length": 512,
    "difficulty": 0.5,
    "tools": ["calculator"],
}


def make_env(n_envs: int = 1, **kwargs: Any) -> DummyVecEnv:
    return DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**{**TOOL_ENV, **kwargs}))] * n_envs)


def gold_reply(env: grpo_gym.R1ZeroEnv, problem: Any, context: str) -> str:
    """What a policy that has learned the tool would write next in ``context``."""
    calls, reasoning, answer = env.task.tool_solution(problem, env.tools.names)
    return answer_text(reasoning, answer) if "\nTool: " in context else tool_call_text(calls)


def test_tool_result_tokens_get_no_gradient_and_are_attended_to() -> None:
    """A hand-built trajectory (tool call, tool result, answer) through GRPO's loss: the logits at the positions that
    predict the tool result's tokens get exactly zero gradient (no loss, KL or entropy term reads them), while the
    tool result's input embeddings get gradient (later tokens attend to them)."""
    env = grpo_gym.R1ZeroEnv(**TOOL_ENV)
    model = GRPO(
        "TransformerPolicy", make_env(), n_groups=1, group_size=2, cold_start=False, policy_kwargs=TINY, seed=0
    )
    policy, codec = model.policy, env.codec
    obs, _ = env.reset(seed=3)
    rows = Rows()
    for turn in range(2):
        context = contexts_from_obs({k: v[None] for k, v in obs.items()}, policy.context_limit)
        action = env.encode_action(gold_reply(env, env.problem, codec.decode(context[0].numpy())))
        obs, reward, _, _, info = env.step(action)
        tokens = th.as_tensor(action)[None]
        mask = th.zeros_like(tokens, dtype=th.bool)
        mask[0, : info["completion_length"]] = True
        old = policy.log_probs(*rows_to_tensors(context, tokens, mask, policy.pad_token_id))[0].detach()
        rows.add([0], turn, context, (tokens, mask), old, [reward], [info])
    assert info["is_success"]
    message = codec.encode(f"\nTool: {env.problem.answer}\nAssistant: ")
    one = th.ones(1)
    batch = rows_to_batch(rows, [0, 1], one, one, th.zeros(1, dtype=th.long), policy.pad_token_id, th.device("cpu"))
    batch.ref_log_probs = batch.old_log_probs.clone()  # a KL term to the reference too
    assert not contains(batch.completion_ids[batch.completion_mask], message)  # never a completion token
    assert contains(batch.prompt_ids[1], message)  # the second turn's context

    captured: dict[str, Any] = {}

    def keep_inputs(_module: Any, args: tuple, kwargs: dict) -> None:
        captured["input_ids"] = kwargs["input_ids"]

    def keep_embeddings(_module: Any, _args: tuple, output: th.Tensor) -> None:
        output.retain_grad()
        captured["embeddings"] = output

    def logit_probe(_module: Any, _args: tuple, output: th.Tensor) -> th.Tensor:
        captured["probe"] = th.zeros_like(output, requires_grad=True)  # d loss / d logits lands here
        return output + captured["probe"]

    hooks = [
        policy.model.register_forward_pre_hook(keep_inputs, with_kwargs=True),
        policy.model.get_input_embeddings().register_forward_hook(keep_embeddings),
        policy.model.get_output_embeddings().register_forward_hook(logit_probe),
    ]
    settings = LossSettings(0.2, 0.2, ent_coef=0.01, beta=0.04, aggregation="token", vf_coef=0.0)
    loss, _, _ = minibatch_loss(policy, batch, settings)
    loss.backward()
    for hook in hooks:
        hook.remove()
    ids, logit_grad = captured["input_ids"], captured["probe"].grad.abs().sum(-1)  # (R, W) and (R, L), L <= W
    # the packed layout has logits at every position; the padded one only at the last L (those that predict the
    # completion), so a position p before them has no logit at all, which is no gradient too
    assert logit_grad.shape[0] == ids.shape[0] and logit_grad.shape[1] <= ids.shape[1]
    logit_grad = th.cat([th.zeros(ids.shape[0], ids.shape[1] - logit_grad.shape[1]), logit_grad], dim=1)
    embedding_grad = captured["embeddings"].grad.abs().sum(-1)  # (R, W)
    found = 0
    for row in range(ids.shape[0]):
        start = find(ids[row], message)
        if start is None:
            continue
        found += 1
        predicting = slice(start - 1, start + len(message) - 1)  # logits at p predict the token at p + 1
        assert th.all(logit_grad[row, predicting] == 0)
        assert th.all(embedding_grad[row, start : start + len(message)] > 0)
    assert found == 1 and logit_grad.sum() > 0  # the model's own tokens do get gradient


def remember_problems(model: GRPO) -> dict[str, Any]:
    """The problems ``model`` draws from now on, by prompt (its collector's ``draw_problems`` wrapped to record
    them)."""
    problems: dict[str, Any] = {}
    draw = model.rollouts.draw_problems

    def draw_and_remember(*args: Any, **kwargs: Any) -> list[Any]:
        drawn = draw(*args, **kwargs)
        problems.update({p.prompt: p for p in drawn})
        return drawn

    model.rollouts.draw_problems = draw_and_remember
    return problems


def rows_to_tensors(context: list[th.Tensor], tokens: th.Tensor, mask: th.Tensor, pad_id: int) -> tuple:
    from algorithms.common.rollout.batch import left_pad

    prompt_ids, prompt_mask = left_pad(context, pad_id)
    return prompt_ids, prompt_mask, tokens, mask


def find(row: th.Tensor, needle: np.ndarray) -> int | None:
    values, n = row.tolist(), len(needle)
    hits = [i for i in range(len(values) - n + 1) if values[i : i + n] == needle.tolist()]
    assert len(hits) <= 1
    return hits[0] if hits else None


def contains(row: th.Tensor, needle: np.ndarray) -> bool:
    return find(row.flatten(), needle) is not None


def scripted_sample(model: GRPO, env: grpo_gym.R1ZeroEnv, problems: dict[str, Any]):
    """``model.rollouts.sample`` replaced by a policy that uses the tool (log-probs from the real policy)."""

    def sample(prompts: list[th.Tensor], **_: Any) -> Completions:
        texts = []
        for prompt in prompts:
            context = env.codec.decode(prompt.numpy())
            question = context.split("User: ", 1)[1].split("\n", 1)[0]
            texts.append(gold_reply(env, problems[question], context))
        tokens = th.as_tensor(np.stack([env.encode_action(text) for text in texts]))
        mask = th.zeros_like(tokens, dtype=th.bool)
        for i, text in enumerate(texts):
            mask[i, : len(env.codec.encode(text)) + 1] = True
        ids, prompt_mask = rows_to_tensors(prompts, tokens, mask, model.policy.pad_token_id)[:2]
        log_probs = model.policy.log_probs(ids, prompt_mask, tokens, mask)[0].detach()
        return Completions(tokens, log_probs, mask, mask.sum(-1))

    return sample


def test_collection_batches_later_turns_across_envs_and_keeps_one_row_per_model_turn() -> None:
    vec = make_env(n_envs=4)
    model = GRPO("TransformerPolicy", vec, n_groups=2, group_size=4, cold_start=False, policy_kwargs=TINY, seed=0)
    env = vec.envs[0].unwrapped
    problems = remember_problems(model)
    batches: list[int] = []
    scripted = scripted_sample(model, env, problems)
    model.rollouts.sample = lambda prompts, **kw: (batches.append(len(prompts)), scripted(prompts, **kw))[1]
    rows_seen: list[Rows] = []
    build = model._build_batch
    model._build_batch = lambda rows, seconds: (rows_seen.append(rows), build(rows, seconds))[1]
    model.learn(8)
    (rows,) = rows_seen
    assert batches == [8, 4, 4]  # first turns in one batch; each chunk's answer turns in one batch
    assert sorted(zip(rows.episodes, rows.turns, strict=True)) == [(e, t) for e in range(8) for t in (0, 1)]
    assert model.num_timesteps == 16  # a completion per model turn
    assert all(info["is_success"] for info, t in zip(rows.infos, rows.turns, strict=True) if t == 1)
    assert all(len(info["tool_calls"]) == 1 for info, t in zip(rows.infos, rows.turns, strict=True) if t == 0)
    assert model.ep_success_buffer and all(model.ep_success_buffer)
    episodes = list(model.ep_info_buffer)
    assert len(episodes) == 8 and all(e["l"] == 2 for e in episodes)  # Monitor saw whole two-turn episodes
    returns = model._rollout.returns
    assert th.allclose(returns, th.full_like(returns, model.gamma * 1.0))  # the answer's reward, one turn later


def test_multi_turn_feedback_episodes_with_several_envs() -> None:
    env = DummyVecEnv(
        [lambda: Monitor(grpo_gym.R1ZeroEnv(template="compact", max_new_tokens=24, context_length=256, max_turns=2))]
        * 2
    )
    model = GRPO("TransformerPolicy", env, n_groups=2, group_size=2, cold_start=False, policy_kwargs=TINY, seed=0)
    model.learn(4)
    assert model.num_timesteps >= 4 and len(model.ep_info_buffer) == 4


def test_cold_start_and_learn_with_tools() -> None:
    model = GRPO(
        "TransformerPolicy",
        make_env(n_envs=2),
        n_groups=1,
        group_size=2,
        cold_start_kwargs={"steps": 2},
        policy_kwargs=TINY,
        seed=0,
    )
    model.learn(2)
    assert model._cold_start_done and model.num_timesteps >= 2


class ScriptedPolicy(th.nn.Module):
    """What evaluation needs of a policy, answering as a policy that learned the tool would."""

    def __init__(self, env: grpo_gym.R1ZeroEnv, problems: list[Any]) -> None:
        super().__init__()
        self.weight = th.nn.Parameter(th.zeros(1))
        self.env, self.problems = env, {p.prompt: p for p in problems}
        self.context_limit, self.pad_token_id = 400, env.codec.pad_id

    def generate(self, ids: th.Tensor, mask: th.Tensor, **_: Any) -> Completions:
        texts = []
        for row, row_mask in zip(ids, mask, strict=True):
            context = self.env.codec.decode(row[row_mask.bool()].numpy())
            question = context.split("User: ", 1)[1].split("\n", 1)[0]
            texts.append(gold_reply(self.env, self.problems[question], context))
        tokens = th.as_tensor(np.stack([self.env.encode_action(text) for text in texts]))
        lengths = th.as_tensor([len(self.env.codec.encode(text)) + 1 for text in texts])
        mask = th.arange(tokens.shape[1])[None] < lengths[:, None]
        return Completions(tokens, th.zeros(tokens.shape), mask, lengths)


@pytest.mark.parametrize("n_envs", [1, 3])
def test_evaluation_plays_whole_episodes_with_tools(n_envs: int) -> None:
    vec = make_env(n_envs=n_envs)
    env = vec.envs[0].unwrapped
    problems = env.eval_problems(5, 0.5)
    result = evaluate_problems(ScriptedPolicy(env, problems), vec, problems)
    assert result.success_rate == 1.0 and result.mean_reward == pytest.approx(1.0)
    calls = [len(env.codec.encode(gold_reply(env, p, ""))) + 1 for p in problems]
    answers = [len(env.codec.encode(gold_reply(env, p, "\nTool: "))) + 1 for p in problems]
    assert result.mean_length == pytest.approx(np.mean(np.add(calls, answers)))
    model = GRPO("TransformerPolicy", vec, n_groups=1, group_size=6, cold_start=False, policy_kwargs=TINY, seed=0)
    untrained = evaluate_problems(model.policy, vec, problems)  # a real policy: episodes end, whatever it writes
    assert 0.0 <= untrained.success_rate <= 1.0 and untrained.n_problems == 5


def test_lmppo_trains_on_tool_episodes() -> None:
    from algorithms import LMPPO

    model = LMPPO(
        "TransformerPolicy", make_env(n_envs=2), n_groups=1, group_size=2, cold_start=False, policy_kwargs=TINY
    )
    model.learn(2)
    assert model.num_timesteps >= 2


def test_an_episode_example_trains_what_its_turns_train() -> None:
    """The cold start's episode examples (tool call, tool result, answer in one row; each turn's EOS hidden from the
    tokens after it) give each model token the log-prob that the per-turn example with the rollout's context gives
    it, and their turns are the per-turn examples exactly."""
    from algorithms.common.cold_start import _example_log_probs
    from grpo_gym.gold import episode_turns, tool_episode, tool_examples

    env = grpo_gym.R1ZeroEnv(**TOOL_ENV)
    env.reset(seed=0)
    problems = [env.sample_problem() for _ in range(3)]
    episodes = [tool_episode(env, problem) for problem in problems]
    for problem, episode in zip(problems, episodes, strict=True):
        for (p, c), (q, d) in zip(episode_turns(episode), tool_examples(env, problem), strict=True):
            assert np.array_equal(p, q) and np.array_equal(c, d)
    model = GRPO(
        "TransformerPolicy",
        make_env(),
        n_groups=1,
        group_size=2,
        cold_start=False,
        policy_kwargs=TINY,
        seed=0,
        mixed_precision="no",
    )
    with th.no_grad():
        whole, trained = _example_log_probs(model.policy, episodes)
        turns = [turn for episode in episodes for turn in episode_turns(episode)]
        apart, mask = _example_log_probs(model.policy, turns)
    for i in range(len(episodes)):
        separate = th.cat([apart[2 * i + j][mask[2 * i + j]] for j in range(2)])
        assert th.allclose(whole[i][trained[i]], separate, atol=1e-5)
    assert int(trained.sum()) == int(mask.sum())  # the same tokens trained, the tool results not among them
