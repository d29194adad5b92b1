"""GRPO with the SB3 API: learn, TensorBoard tags, save/load, resume, seeds, callbacks, options, errors."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback, EvalCallback
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import grpo_gym
from algorithms import GRPO, UpdateDecay
from tests.sizes import ENV_KWARGS, TINY


def make_env(n_envs: int = 1, **kwargs) -> DummyVecEnv:
    return DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**{**ENV_KWARGS, **kwargs}))] * n_envs)


def make_model(env=None, **kwargs) -> GRPO:
    defaults = {
        "n_groups": 2,
        "group_size": 4,
        "cold_start_kwargs": {"steps": 2, "batch_size": 4},
        "seed": 0,
        "policy_kwargs": TINY,
    }
    return GRPO("TransformerPolicy", env or make_env(), **{**defaults, **kwargs})


def parameters(model: GRPO) -> list[th.Tensor]:
    return [p.detach().clone() for p in model.policy.parameters()]


def test_learn_writes_the_tensorboard_tags(tmp_path: Path) -> None:
    model = make_model(tensorboard_log=str(tmp_path))
    model.learn(16)
    assert model.num_timesteps == 16  # two iterations of 2 groups x 4 completions
    runs = sorted(tmp_path.iterdir())
    assert [r.name for r in runs] == ["GRPO_1"]
    events = EventAccumulator(str(runs[0]), size_guidance={"tensors": 0, "histograms": 0, "scalars": 0}).Reload()
    scalars = set(events.Tags()["scalars"])
    expected = {
        "rollout/ep_rew_mean",
        "rollout/success_rate",
        "rollout/completion_length",
        "rollout/frac_uniform_groups",
        "rollout/reward/syntax",
        "rollout/reward/consistency",
        "rollout/reward/task",
        "rollout/reward/length",
        "train/loss",
        "train/policy_loss",
        "train/kl",
        "train/entropy",
        "train/clip_fraction",
        "train/grad_norm",
        "train/skipped_steps",
        "train/learning_rate",
        "train/ent_coef",
        "time/fps",
        "time/tokens_per_second",
        "sft/loss",
    }
    assert expected <= scalars, expected - scalars
    assert "rollout/rewards" in events.Tags()["histograms"]
    assert any(tag.startswith("samples/completion") for tag in events.Tags()["tensors"])
    steps = [e.step for e in events.Scalars("train/loss")]
    assert steps == [8, 16]


def test_parameters_change_and_stay_finite() -> None:
    model = make_model(learning_rate=1e-3, beta=0.04)
    before = parameters(model)
    model.learn(8)
    after = parameters(model)
    assert any(not th.equal(a, b) for a, b in zip(before, after, strict=True))
    assert all(th.isfinite(p).all() for p in after)


def test_same_seed_same_parameters_after_two_iterations() -> None:
    first, second = make_model(seed=3), make_model(seed=3)
    first.learn(16)
    second.learn(16)
    for a, b in zip(parameters(first), parameters(second), strict=True):
        assert th.equal(a, b)
    third = make_model(seed=4)
    third.learn(16)
    assert any(not th.equal(a, b) for a, b in zip(parameters(first), parameters(third), strict=True))


def test_save_load_same_predictions_and_offline_rebuild(tmp_path: Path) -> None:
    env = make_env()
    model = make_model(env)
    model.learn(8)
    obs = env.reset()
    actions, _ = model.predict(obs, deterministic=True)
    model.save(tmp_path / "model.zip")
    loaded = GRPO.load(tmp_path / "model.zip", env=env)
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], actions)
    assert loaded._cold_start_done and not loaded.needs_cold_start()
    for a, b in zip(parameters(model), parameters(loaded), strict=True):
        assert th.equal(a, b)
    without_env = GRPO.load(tmp_path / "model.zip")  # no env: the architecture comes from the saved config
    np.testing.assert_array_equal(without_env.predict(obs, deterministic=True)[0], actions)
    loaded.learn(8)  # and it trains on


def test_save_keeps_heavy_objects_out_of_the_pickled_data(tmp_path: Path) -> None:
    import json
    import zipfile

    model = make_model(beta=0.04)
    model.save(tmp_path / "m.zip")
    with zipfile.ZipFile(tmp_path / "m.zip") as archive:
        names = archive.namelist()
        data = archive.read("data").decode()
    assert {"policy.pth", "policy.optimizer.pth", "ref_model.pth"} <= set(names)
    parsed = json.loads(data)
    assert not set(parsed) & {"ref_model", "tokenizer", "_rollout", "_generator", "policy"}
    assert set(parsed["env"]) == {"record", "n_envs"}  # the env's JSON record, not the env
    assert len(data) < 200_000  # no weights in the pickled part


def test_resume_continues_the_same_run(tmp_path: Path) -> None:
    env = make_env()
    model = make_model(env, tensorboard_log=str(tmp_path))
    model.learn(8)
    model.save(tmp_path / "model.zip")
    state = model.policy.optimizer.state_dict()["state"]
    loaded = GRPO.load(tmp_path / "model.zip", env=env, tensorboard_log=str(tmp_path))
    restored = loaded.policy.optimizer.state_dict()["state"]
    assert state.keys() == restored.keys() and len(state) > 0
    for key in state:
        assert th.equal(state[key]["exp_avg"], restored[key]["exp_avg"])
    loaded.learn(8, reset_num_timesteps=False)
    assert loaded.num_timesteps == 16
    assert [r.name for r in tmp_path.iterdir() if r.is_dir()] == ["GRPO_1"]
    steps = [e.step for e in EventAccumulator(str(tmp_path / "GRPO_1")).Reload().Scalars("train/loss")]
    assert steps == [8, 16]


class RecordingCallback(BaseCallback):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def _on_training_start(self) -> None:
        self.calls.append("training_start")

    def _on_rollout_start(self) -> None:
        self.calls.append("rollout_start")

    def _on_step(self) -> bool:
        assert {"rewards", "dones", "infos"} <= set(self.locals)
        self.calls.append("step")
        return True

    def _on_rollout_end(self) -> None:
        self.calls.append("rollout_end")

    def _on_training_end(self) -> None:
        self.calls.append("training_end")


def test_callbacks_fire_in_sb3_order_and_can_stop() -> None:
    callback = RecordingCallback()
    make_model(make_env(n_envs=2)).learn(16, callback=callback)
    rollout = ["rollout_start", *["step"] * 4, "rollout_end"]  # 8 completions stepped 2 envs at a time
    assert callback.calls == ["training_start", *rollout, *rollout, "training_end"]

    class Stop(BaseCallback):
        def _on_step(self) -> bool:
            return False

    model = make_model()
    model.learn(100, callback=Stop())
    assert model.num_timesteps == 1


def test_evaluate_policy_eval_and_checkpoint_callbacks(tmp_path: Path) -> None:
    env = make_env()
    model = make_model(env)
    mean, std = evaluate_policy(model, env, n_eval_episodes=3)
    assert 0.0 <= mean <= 1.0 and std >= 0.0
    eval_cb = EvalCallback(make_env(), n_eval_episodes=2, eval_freq=4, log_path=str(tmp_path), verbose=0)
    ckpt_cb = CheckpointCallback(save_freq=8, save_path=str(tmp_path / "ckpt"), name_prefix="grpo")
    model.learn(16, callback=[eval_cb, ckpt_cb])
    assert (tmp_path / "evaluations.npz").exists()
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["grpo_16_steps.zip", "grpo_8_steps.zip"]


def test_string_env_id_and_set_get_env() -> None:
    model = GRPO("TransformerPolicy", "R1Zero-v0", n_groups=1, group_size=2, cold_start=False, policy_kwargs=TINY)
    assert model.get_env().num_envs == 1
    model.set_env(make_env(context_length=4096, max_new_tokens=64, difficulty=0.5))
    assert model.get_env().get_attr("difficulty") == [0.5]
    with pytest.raises(ValueError, match="spaces do not match"):
        model.set_env(make_env())  # a 256-token window is another observation space


@pytest.mark.parametrize(
    "options",
    [
        {"advantage_scale": "batch"},
        {"advantage_scale": "none", "loss_aggregation": "constant"},
        {"loss_aggregation": "token", "clip_range_high": 0.28},
        {"dynamic_sampling": True, "max_resample_rounds": 0},  # uniform groups left out, none replaced
        {"advantage_baseline": "leave_one_out", "advantage_scale": "none"},  # RLOO
        {"n_epochs": 2, "batch_size": 3, "beta": 0.1},
        {"ent_coef": 0.0, "learning_rate": lambda progress: 1e-4 * progress},
    ],
)
def test_options_train(options: dict) -> None:
    model = make_model(**options)
    model.learn(16)
    assert model.num_timesteps == 16


def test_gspo_clips_the_sequence_ratio_by_clip_range_and_warns_when_it_is_too_wide() -> None:
    """One clip range for either ratio, as TRL's ``epsilon``: with ``importance_level="sequence"`` the loss clips
    the sequence ratio by ``clip_range`` / ``clip_range_high``; the token level's 0.2 left there rarely clips it,
    and a warning names the paper's values."""
    model = make_model(importance_level="sequence", clip_range=3e-4, clip_range_high=4e-4)
    settings = model._loss_settings()
    assert (settings.importance_level, settings.clip_low, settings.clip_high) == ("sequence", 3e-4, 4e-4)
    model.learn(8)
    paper = re.escape("GSPO's paper uses clip_range=3e-4, clip_range_high=4e-4")
    with pytest.warns(UserWarning, match=paper) as record:
        GRPO("TransformerPolicy", make_env(), importance_level="sequence", _init_setup_model=False)
    assert record[0].filename == __file__  # the user's line
    with pytest.warns(UserWarning, match="a clip range of 0.28 rarely clips it"):  # the upper side too
        GRPO("TransformerPolicy", make_env(), importance_level="sequence", clip_range=3e-4, clip_range_high=0.28,
             _init_setup_model=False)  # fmt: skip


def test_a_gspo_model_loaded_with_the_papers_clip_range_does_not_warn(tmp_path: Path) -> None:
    """load's overrides count: the saved arguments alone (a GSPO model with the token level's range) are not what
    the loaded model runs with, so only the values it runs with are checked together."""
    with pytest.warns(UserWarning, match="rarely clips it"):
        model = make_model(importance_level="sequence")
    model.save(tmp_path / "model.zip")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        loaded = GRPO.load(tmp_path / "model.zip", env=make_env(), clip_range=3e-4, clip_range_high=4e-4)
    assert (loaded.clip_range(1.0), loaded.clip_range_high(1.0)) == (3e-4, 4e-4)


class MyGRPO(GRPO):
    """A user's subclass: its runs are named after it, as SB3 names a run after the algorithm's class."""


def test_a_subclass_logs_its_cold_start_and_training_to_one_run_named_after_it(tmp_path: Path) -> None:
    model = MyGRPO("TransformerPolicy", make_env(), n_groups=2, group_size=4, policy_kwargs=TINY, seed=0,
                   cold_start_kwargs={"steps": 2, "batch_size": 4}, tensorboard_log=str(tmp_path))  # fmt: skip
    model.start_run()
    model.run_cold_start()
    model.learn(8, reset_num_timesteps=False)
    assert sorted(r.name for r in tmp_path.iterdir() if r.is_dir()) == ["MyGRPO_1"]


def test_entropy_schedule_counts_updates() -> None:
    model = make_model(ent_coef=UpdateDecay(0.01, 0.001, 4), n_epochs=2)
    model.learn(16)  # 2 iterations x 2 epochs = 4 updates: the last update saw 0.01 - 3/4 * 0.009
    assert model._n_updates == 4
    assert UpdateDecay(0.01, 0.001, 4)(3) == pytest.approx(0.00325)


def test_reference_only_when_beta_positive() -> None:
    assert make_model(beta=0.0).ref_model is None
    model = make_model(beta=0.04)
    assert model.ref_model is not None
    assert not any(p.requires_grad for p in model.ref_model.parameters())


def test_cold_start_is_auto_for_builtin_and_switchable() -> None:
    model = make_model(cold_start_kwargs={"steps": 3})
    assert model.needs_cold_start()
    model.learn(8)
    assert model._cold_start_done and not model.needs_cold_start()
    assert not make_model(cold_start=False).needs_cold_start()


def test_multi_turn_episodes() -> None:
    model = make_model(make_env(max_turns=2), gamma=0.95)
    model.learn(8)
    assert model.num_timesteps >= 8


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"advantage_scale": "rank"}, "advantage_scale"),
        ({"loss_aggregation": "mean"}, "loss_aggregation"),
        ({"group_size": 1}, "group_size"),
        ({"beta": -1.0}, "beta"),
        ({"env": make_env(n_envs=3)}, "multiple of the number of envs"),
        ({"env": make_env(action_mode="token")}, "action_mode='sequence'"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_model(**kwargs)


def test_vocabulary_mismatch_is_caught(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    small = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=50,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    small.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="smaller than the env tokenizer"):
        make_model(policy_kwargs={"model": str(tmp_path)})


def test_gym_make_env_is_wrapped() -> None:
    env = gym.make("R1Zero-v0", **ENV_KWARGS)
    model = GRPO("TransformerPolicy", env, n_groups=1, group_size=2, cold_start=False, policy_kwargs=TINY)
    model.learn(2)
    assert model.num_timesteps == 2


def test_reward_rises_on_an_easy_task(tmp_path: Path) -> None:
    """Two fixed problems, a brief cold start, then GRPO: the held-out reward on them must rise."""
    import json

    from algorithms.common.evaluation import evaluate_problems

    rows = [
        {"prompt": "What is 3+4?", "answer": "7", "solution": "3+4=7"},
        {"prompt": "What is 5+3?", "answer": "8", "solution": "5+3=8"},
    ]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    weights = {"syntax": 0.2, "consistency": 0.0, "task": 0.8}
    env = make_env(task="jsonl", task_kwargs={"path": str(tmp_path / "rows.jsonl")}, reward_weights=weights)
    small = {
        "model": "tiny",
        "model_kwargs": {
            "num_hidden_layers": 1,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
        },
    }
    model = make_model(
        env,
        n_groups=2,
        group_size=8,
        cold_start_kwargs={"steps": 60, "batch_size": 16, "learning_rate": 3e-3},
        learning_rate=1e-3,
        beta=0.0,
        ent_coef=0.0,
        policy_kwargs=small,
    )
    task = env.get_attr("task")[0]
    problems = [task.sample_seeded(0.1, i) for i in range(256)]
    model.learn(16)  # the cold start and one GRPO iteration
    before = evaluate_problems(model.policy, env, problems, seed=0)
    model.learn(16 * 40, reset_num_timesteps=False)
    after = evaluate_problems(model.policy, env, problems, seed=0)
    assert after.mean_reward > before.mean_reward + 0.05, (before, after)
    assert after.success_rate > before.success_rate


class RolloutSpy(BaseCallback):
    """Keeps each rollout's rows and problems (``collect_rollouts``' locals at ``on_rollout_end``)."""

    def __init__(self) -> None:
        super().__init__()
        self.rollouts: list[tuple[object, list]] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        self.rollouts.append((self.locals["rows"], list(self.locals["episode_problems"])))


def test_reward_functions_score_a_rollout_in_one_call_per_env(tmp_path: Path) -> None:
    calls: list[int] = []

    def counting(prompts, completions, completion_ids, answer, **kwargs):
        calls.append(len(completions))
        return [float(a in c) - 0.01 * len(ids) for c, a, ids in zip(completions, answer, completion_ids, strict=True)]

    async def odd(completions, **kwargs):  # None (not applicable) for completions of even length
        return [1.0 if len(c) % 2 else None for c in completions]

    env_kwargs = {"reward_funcs": {"counting": counting, "odd": odd}, "reward_weights": {"counting": -0.5}}
    spy = RolloutSpy()
    model = make_model(make_env(2, **env_kwargs), tensorboard_log=str(tmp_path))
    model.learn(16, callback=spy)  # 2 iterations of 2 groups x 4 completions, 4 per env
    assert calls == [4, 4, 4, 4]  # once per iteration per env, with all of that env's completions
    rescored = grpo_gym.R1ZeroEnv(**{**ENV_KWARGS, **env_kwargs})  # unbatched: one completion per call
    for rows, problems in spy.rollouts:
        for episode, tokens, reward, info in zip(rows.episodes, rows.tokens, rows.rewards, rows.infos, strict=True):
            rescored.reset(options={"problem": problems[episode]})
            _, alone, _, _, alone_info = rescored.step(tokens.numpy())
            assert alone_info["reward_components"] == info["reward_components"]
            assert alone == pytest.approx(reward)  # the VecEnv keeps rewards as float32
    events = EventAccumulator(str(tmp_path / "GRPO_1"), size_guidance={"scalars": 0}).Reload()
    for name in ("counting", "syntax", "length"):
        logged = [e.value for e in events.Scalars(f"rollout/reward/{name}")]
        assert logged == pytest.approx([np.mean([i["reward_components"][name] for i in rows.infos])
                                        for rows, _ in spy.rollouts], abs=1e-6)  # fmt: skip
    odd = [[i["reward_components"]["odd"] for i in rows.infos] for rows, _ in spy.rollouts]
    assert all(v in (None, 1.0) for values in odd for v in values)
    logged_steps = [e.step for e in events.Scalars("rollout/reward/odd")] if any(odd[0] + odd[1]) else []
    assert logged_steps == [8 * (k + 1) for k, values in enumerate(odd) if any(values)]  # Nones left out
