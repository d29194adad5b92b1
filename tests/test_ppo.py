"""LMPPO with the SB3 API: learn, TensorBoard tags, save/load, exact resume, callbacks, options, bad arguments."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import grpo_gym
from algorithms import GRPO, LMPPO
from algorithms.ppo import objective
from tests.sizes import ENV_KWARGS, TINY
from tests.test_state import assert_same_training_state


def make_env(n_envs: int = 1, **kwargs) -> DummyVecEnv:
    return DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**{**ENV_KWARGS, **kwargs}))] * n_envs)


def make_model(env=None, **kwargs) -> LMPPO:
    defaults = {
        "n_groups": 4,
        "n_epochs": 2,
        "batch_size": 2,
        "cold_start_kwargs": {"steps": 2, "batch_size": 4},
        "seed": 0,
        "learning_rate": 1e-3,
        "mixed_precision": "no",
        "policy_kwargs": TINY,
    }
    return LMPPO("TransformerPolicy", env or make_env(), **{**defaults, **kwargs})


def test_learn_writes_the_ppo_tensorboard_tags(tmp_path: Path) -> None:
    model = make_model(tensorboard_log=str(tmp_path))
    assert model.group_size == 1 and model.policy.value_net is not None  # one completion per prompt, a value head
    model.learn(8)
    assert model.num_timesteps == 8 and model._n_updates == 2 * 2 * 2  # 2 iterations x 2 epochs x 2 minibatches
    events = EventAccumulator(str(tmp_path / "LMPPO_1"), size_guidance={"scalars": 0}).Reload()
    expected = {
        "rollout/ep_rew_mean",
        "rollout/success_rate",
        "rollout/completion_length",
        "rollout/reward/task",
        "rollout/kl",
        "rollout/values",
        "train/loss",
        "train/policy_loss",
        "train/value_loss",
        "train/explained_variance",
        "train/approx_kl",
        "train/clip_fraction",
        "train/clip_fraction_vf",
        "train/entropy",
        "train/grad_norm",
        "train/learning_rate",
        "train/clip_range",
        "train/clip_range_vf",
        "train/kl_coef",
        "train/optimizer_steps",
        "time/fps",
        "sft/loss",
    }
    scalars = set(events.Tags()["scalars"])
    assert expected <= scalars, expected - scalars
    assert [e.step for e in events.Scalars("train/value_loss")] == [4, 8]
    assert all(np.isfinite(e.value) for e in events.Scalars("train/explained_variance"))


def test_the_rollout_holds_the_gae_of_the_env_reward_and_the_kl_penalty() -> None:
    model = make_model(normalize_advantage=False, kl_coef=0.1)
    kept: list = []

    class Keep(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            kept.append(self.locals["rows"])

    model.learn(4, callback=Keep())
    batch, mask = model._rollout, model._rollout.completion_mask
    assert batch.values.shape == batch.advantages.shape == batch.returns.shape == mask.shape
    assert batch.ref_log_probs is None  # the KL sits in the rewards
    assert bool((batch.values[~mask] == 0).all() and (batch.advantages[~mask] == 0).all())
    with th.no_grad():  # the reference is frozen: its log-probs now are those of the rollout
        kl = th.where(mask, batch.old_log_probs - model._reference_log_probs(batch), 0.0)
    rewards = objective.token_rewards(th.tensor(kept[-1].rewards), mask, kl, 0.1)
    advantages, returns = objective.gae(rewards, batch.values, mask, model.gamma, model.gae_lambda)
    th.testing.assert_close(batch.advantages, advantages)
    th.testing.assert_close(batch.returns, returns)


def test_kl_in_the_loss_keeps_the_reference_log_probs_in_the_batch() -> None:
    model = make_model(kl_placement="loss", kl_coef=0.1)
    model.learn(4)
    assert model._rollout.ref_log_probs is not None
    assert make_model(kl_coef=0.0).ref_model is None


def test_save_load_same_predictions_values_and_offline_rebuild(tmp_path: Path) -> None:
    env = make_env()
    model = make_model(env)
    model.learn(4)
    obs = env.reset()
    actions, _ = model.predict(obs, deterministic=True)
    model.save(tmp_path / "ppo.zip")
    loaded = LMPPO.load(tmp_path / "ppo.zip", env=env)
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], actions)
    assert th.equal(loaded.policy.value_net.weight, model.policy.value_net.weight)
    assert loaded.ref_model is not None and loaded._cold_start_done
    without_env = LMPPO.load(tmp_path / "ppo.zip")
    np.testing.assert_array_equal(without_env.predict(obs, deterministic=True)[0], actions)
    with pytest.raises(ValueError, match=r"load it with LMPPO\.load"):
        GRPO.load(tmp_path / "ppo.zip")
    loaded.learn(4, reset_num_timesteps=False)
    assert loaded.num_timesteps == 8


@pytest.mark.parametrize("settings", [{}, {"kl_placement": "loss", "ent_coef": 0.01}], ids=["reward-kl", "loss-kl"])
def test_resume_is_bit_identical(tmp_path: Path, settings: dict) -> None:
    whole = make_model(**settings)
    whole.learn(8)
    first = make_model(**settings)
    first.learn(4)
    first.save(tmp_path / "half.zip")
    second = LMPPO.load(tmp_path / "half.zip", env=make_env())
    second.learn(4, reset_num_timesteps=False)
    assert_same_training_state(whole, second)


def test_callbacks_checkpoints_and_stop(tmp_path: Path) -> None:
    model = make_model()
    model.learn(8, callback=CheckpointCallback(save_freq=4, save_path=str(tmp_path), name_prefix="ppo"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ppo_4_steps.zip", "ppo_8_steps.zip"]

    class Stop(BaseCallback):
        def _on_step(self) -> bool:
            return False

    stopped = make_model()
    stopped.learn(100, callback=Stop())
    assert stopped.num_timesteps == 1


def test_target_kl_stops_the_update_early() -> None:
    model = make_model(target_kl=1e-9, n_epochs=4, learning_rate=1e-2)
    model.learn(8)
    assert model._n_updates < 2 * 4 * 2  # the second rollout's later minibatches moved past 1.5 * target_kl
    assert model.logger.name_to_value.get("train/early_stop", 1.0) in (0.0, 1.0)


@pytest.mark.parametrize(
    "options",
    [
        {"group_size": 2, "n_groups": 2, "normalize_advantage": False},
        {"clip_range_vf": None, "batch_size": None, "gamma": 0.99, "gae_lambda": 1.0},
        {"kl_coef": 0.0, "ent_coef": 0.01, "learning_rate": lambda progress: 1e-3 * progress},
    ],
)
def test_options_train(options: dict) -> None:
    model = make_model(**options)
    before = [p.detach().clone() for p in model.policy.parameters()]
    model.learn(8)
    after = list(model.policy.parameters())
    assert any(not th.equal(a, b) for a, b in zip(before, after, strict=True))
    assert all(th.isfinite(p).all() for p in after)


def test_multi_turn_episodes() -> None:
    model = make_model(make_env(max_turns=2), gamma=0.95)
    model.learn(4)
    assert model.num_timesteps >= 4


def test_group_size_one_is_ppo_s_and_not_grpo_s() -> None:
    assert make_model(group_size=1).group_size == 1
    with pytest.raises(ValueError, match="group_size"):
        GRPO("TransformerPolicy", make_env(), n_groups=2, group_size=1, cold_start=False, policy_kwargs=TINY)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_epochs": 0}, "n_epochs"),
        ({"batch_size": 0}, "batch_size"),
        ({"clip_range": -0.1}, "clip_range"),
        ({"clip_range_vf": -1.0}, "clip_range_vf"),
        ({"vf_coef": -1.0}, "vf_coef"),
        ({"gae_lambda": 1.5}, "gae_lambda"),
        ({"gamma": 0.0}, "gamma"),
        ({"normalize_advantage": "yes"}, "normalize_advantage"),
        ({"kl_coef": -0.1}, "kl_coef"),
        ({"kl_placement": "reward_and_loss"}, "kl_placement"),
        ({"target_kl": 0.0}, "target_kl"),
        ({"ent_coef": float("nan")}, "ent_coef"),
        ({"group_size": 0}, "group_size"),
        ({"policy_kwargs": {**TINY, "value_head": False}}, "value_head"),
        ({"env": make_env(action_mode="token")}, "action_mode='sequence'"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_model(**kwargs)


def test_an_lmppo_zip_loads_for_serving(tmp_path) -> None:
    from algorithms.deploy.loading import load_policy

    model = make_model()
    model.save(tmp_path / "ppo.zip")
    policy, tokenizer = load_policy(tmp_path / "ppo.zip")
    assert policy.vocab_size == len(tokenizer)
    for mine, saved in zip(policy.parameters(), model.policy.parameters(), strict=True):
        assert th.equal(mine, saved)
