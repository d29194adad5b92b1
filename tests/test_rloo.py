"""RLOO (algorithms/rloo/): its advantages against a hand calculation, its loss by hand, exact resume, the KL term, and
the command line's train / eval / serve with ``--algo rloo``: the proof that an algorithm is its loss and its
advantages on the shared loop and update step."""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import httpx
import pytest
import torch as th
from stable_baselines3.common.vec_env import DummyVecEnv

import grpo_gym
from algorithms import ALGORITHMS, RLOO
from algorithms.cli import main
from algorithms.common.losses import PolicyOutputs
from algorithms.common.rollout.batch import RolloutBatch
from algorithms.rloo.rloo import rloo_loss
from tests.sizes import ENV_KWARGS, TINY_KWARGS


def length_reward(prompts, completions, **_) -> list[float]:
    """A reward that differs between the completions of a group: their length, scaled."""
    return [len(completion) / 100 for completion in completions]


def make_model(**kwargs) -> RLOO:
    env = DummyVecEnv([lambda: grpo_gym.R1ZeroEnv(**ENV_KWARGS, reward_funcs=[length_reward])])
    settings = {"n_groups": 2, "group_size": 3, "cold_start": False, "seed": 0, "learning_rate": 1e-3}
    return RLOO("TransformerPolicy", env, policy_kwargs={"model_kwargs": TINY_KWARGS}, **{**settings, **kwargs})


def test_the_advantages_are_each_return_minus_the_mean_of_the_others() -> None:
    model = make_model()
    model.learn(6)
    batch = model._rollout
    returns = batch.returns.view(2, 3).tolist()
    expected = [[r - (sum(group) - r) / 2 for r in group] for group in returns]
    assert th.allclose(batch.advantages.view(2, 3), th.tensor(expected), atol=1e-6)
    assert len(set(batch.returns.tolist())) > 1  # a real check: the returns differ


def test_the_loss_by_hand() -> None:
    mask = th.tensor([[True, True, False], [True, False, False]])
    batch = RolloutBatch(
        prompt_ids=th.zeros(2, 1, dtype=th.long), prompt_mask=th.ones(2, 1, dtype=th.long),
        completion_ids=th.zeros(2, 3, dtype=th.long), completion_mask=mask, old_log_probs=th.zeros(2, 3),
        advantages=th.tensor([1.0, -2.0]), returns=th.zeros(2), groups=th.zeros(2, dtype=th.long),
    )  # fmt: skip
    log_probs = th.tensor([[-0.5, -1.0, 9.0], [-2.0, 9.0, 9.0]])
    loss, stats = rloo_loss(batch, PolicyOutputs(log_probs))
    assert loss.item() == pytest.approx(-(1.0 * (-0.5) + 1.0 * (-1.0) + (-2.0) * (-2.0)) / 3)  # mean over 3 tokens
    batch.ref_log_probs = th.tensor([[-0.5, -2.0, 0.0], [-1.0, 0.0, 0.0]])
    with_kl, stats = rloo_loss(batch, PolicyOutputs(log_probs), beta=0.5)
    kl = [math.exp(r - p) - (r - p) - 1 for p, r in ((-0.5, -0.5), (-1.0, -2.0), (-2.0, -1.0))]
    assert stats["kl"].item() == pytest.approx(sum(kl) / 3) and with_kl.item() == pytest.approx(
        loss.item() + 0.5 * sum(kl) / 3
    )


def test_resume_is_exact_and_the_kl_keeps_a_reference(tmp_path: Path) -> None:
    whole = make_model(beta=0.1)
    whole.learn(6 * 4)
    first = make_model(beta=0.1)
    first.learn(6 * 2)
    first.save(tmp_path / "half.zip")
    second = RLOO.load(tmp_path / "half.zip", env=make_model().env)
    assert second.ref_model is not None and second.beta == 0.1
    second.learn(6 * 2, reset_num_timesteps=False)
    assert all(th.equal(a, b) for a, b in zip(whole.policy.parameters(), second.policy.parameters(), strict=True))
    assert not all(
        th.equal(a, b) for a, b in zip(whole.policy.parameters(), make_model().policy.parameters(), strict=True)
    )  # it learned


def test_g_of_one_is_refused_naming_why() -> None:
    with pytest.raises(ValueError, match="group_size"):
        make_model(group_size=1)


def test_the_command_line_trains_evaluates_and_serves_it(tmp_path: Path) -> None:
    from algorithms.deploy.loading import load_policy
    from algorithms.deploy.server import ServerSettings, create_app
    from tests.test_server import Running

    assert ALGORITHMS["rloo"] is RLOO
    saved = tmp_path / "r.zip"
    train = ["train", "--algo", "rloo", "-n", "8", "--save-path", str(saved), "--no-progress-bar",
             "-params", "n_groups:2", "group_size:4", "cold_start_kwargs:{'steps': 2}", "eval_problems:2"]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(train) == 0
    assert "RLOO: 8 completions" in out.getvalue() and RLOO.load(saved).num_timesteps == 8
    with contextlib.redirect_stdout(io.StringIO()) as table:
        assert main(["eval", str(saved), "--n", "2", "--difficulty", "0.1"]) == 0  # the class the zip records
    assert table.getvalue().splitlines()[1].split()[:3] == ["r", "0.10", "2"]
    policy, tokenizer = load_policy(saved)
    with Running(create_app(policy, tokenizer, "r", ServerSettings(max_wait_ms=0, max_tokens_limit=8))) as url:
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": "1+1=", "max_tokens": 4}, timeout=60)
    assert answer.status_code == 200 and answer.json()["choices"][0]["text"] is not None
