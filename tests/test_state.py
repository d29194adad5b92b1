"""Saving, loading and resuming (algorithms/common/saving/run_file.py, serialization.py): safe files, exact resume."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import cloudpickle
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.utils import LinearSchedule
from stable_baselines3.common.vec_env import DummyVecEnv

import grpo_gym
from algorithms import GRPO
from algorithms.common.saving.model_file import read_model_file
from tests.sizes import ENV_KWARGS, TINY

ROOT = Path(__file__).resolve().parents[1]


def make_env() -> DummyVecEnv:
    return DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**ENV_KWARGS))])


def make_model(env=None, **kwargs) -> GRPO:
    defaults = {
        "n_groups": 2,
        "group_size": 4,
        "cold_start_kwargs": {"steps": 2, "batch_size": 4},
        "seed": 0,
        "learning_rate": 1e-3,
        "mixed_precision": "no",
        "policy_kwargs": TINY,
    }
    return GRPO("TransformerPolicy", env or make_env(), **{**defaults, **kwargs})


def assert_same_training_state(a: GRPO, b: GRPO) -> None:
    for p, q in zip(a.policy.parameters(), b.policy.parameters(), strict=True):
        assert th.equal(p, q)
    first, second = a.policy.optimizer.state_dict(), b.policy.optimizer.state_dict()
    assert first["state"].keys() == second["state"].keys() and first["state"]
    for key in first["state"]:
        for name, value in first["state"][key].items():
            assert th.equal(value, second["state"][key][name]), (key, name)
    assert a.num_timesteps == b.num_timesteps and a._n_updates == b._n_updates


# ------------------------------------------------------------------------------------------------ safe loading
def craft(path: Path, source: Path, key: str, payload: object) -> None:
    """Copy ``source`` to ``path`` with ``data[arguments][key]`` replaced by a pickled ``payload``."""
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(path, "w") as crafted:
        for item in original.namelist():
            content = original.read(item)
            if item == "data":
                data = json.loads(content)
                data["arguments"][key] = {"__pickled__": base64.b64encode(cloudpickle.dumps(payload)).decode()}
                content = json.dumps(data).encode()
            crafted.writestr(item, content)


class Payload:
    """Unpickling this creates a file (the stand-in for running a shell command)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (Path(self.target).touch, ())


def test_a_crafted_zip_is_refused_and_its_payload_never_runs(tmp_path: Path) -> None:
    model = make_model(cold_start=False)
    model.save(tmp_path / "good.zip")
    target = tmp_path / "pwned"
    for key in ("learning_rate", "policy_kwargs", "clip_range"):
        craft(tmp_path / "bad.zip", tmp_path / "good.zip", key, Payload(str(target)))
        with pytest.raises(ValueError, match=rf"'{key}'.*unpickling"):
            GRPO.load(tmp_path / "bad.zip", env=make_env())
        with pytest.raises(ValueError, match="unpickling"):
            GRPO.load(tmp_path / "bad.zip")
        assert not target.exists()
    model.set_parameters(str(tmp_path / "bad.zip"))  # weights only: safe, and nothing runs
    assert not target.exists()


def test_a_saved_file_is_plain_json_with_weights(tmp_path: Path) -> None:
    model = make_model(learning_rate=LinearSchedule(1e-3, 0.0, 1.0), beta=0.04)
    model.learn(8)
    model.save(tmp_path / "m")  # .zip added, as SB3 does
    with zipfile.ZipFile(tmp_path / "m.zip") as archive:
        data = json.loads(archive.read("data"))
        names = set(archive.namelist())
    assert {"policy.pth", "policy.optimizer.pth", "ref_model.pth", "pytorch_variables.pth"} <= names
    assert "__pickled__" not in json.dumps(data)
    linear = {"__schedule__": "linear", "start": 1e-3, "end": 0.0, "end_fraction": 1.0}
    assert data["arguments"]["learning_rate"] == linear
    assert data["arguments"]["ent_coef"]["__schedule__"] == "update_decay"
    assert data["state"]["num_timesteps"] == 8
    loaded = GRPO.load(tmp_path / "m.zip", env=make_env())
    assert loaded.learning_rate(0.5) == pytest.approx(5e-4)


def test_an_own_schedule_needs_custom_objects_or_allow_pickle(tmp_path: Path) -> None:
    def schedule(progress: float) -> float:
        return 1e-3 * progress

    make_model(learning_rate=schedule, cold_start=False).save(tmp_path / "m.zip")
    with pytest.raises(ValueError, match=r"'learning_rate'.*custom_objects"):
        GRPO.load(tmp_path / "m.zip", env=make_env())
    assert GRPO.load(tmp_path / "m.zip", env=make_env(), custom_objects={"learning_rate": 2e-4}).learning_rate == 2e-4
    assert GRPO.load(tmp_path / "m.zip", env=make_env(), allow_pickle=True).learning_rate(1.0) == pytest.approx(1e-3)


def test_truncated_and_corrupt_files_are_named(tmp_path: Path) -> None:
    make_model(cold_start=False).save(tmp_path / "m.zip")
    content = (tmp_path / "m.zip").read_bytes()
    (tmp_path / "cut.zip").write_bytes(content[: len(content) // 2])
    with pytest.raises(ValueError, match=r"cut\.zip is truncated or corrupt"):
        GRPO.load(tmp_path / "cut.zip")
    (tmp_path / "text.zip").write_text("not a zip")
    with pytest.raises(ValueError, match=r"text\.zip is truncated or corrupt"):
        GRPO.load(tmp_path / "text.zip")
    with pytest.raises(ValueError, match="no model file"):
        GRPO.load(tmp_path / "missing.zip")
    with zipfile.ZipFile(tmp_path / "sb3.zip", "w") as archive:
        archive.writestr("data", json.dumps({"policy_class": {":serialized:": "gASV"}}))
    with pytest.raises(ValueError, match="not written by this version"):
        GRPO.load(tmp_path / "sb3.zip")


def test_bad_save_names_are_refused(tmp_path: Path) -> None:
    model = make_model(cold_start=False)
    with pytest.raises(ValueError, match="not a file name"):
        model.save(tmp_path / ".zip")
    with pytest.raises(ValueError, match="exclude"):
        model.save(tmp_path / "m.zip", exclude=["policy"])


SAVE_LOOP = """
import sys
sys.path.insert(0, {root!r})
from tests.test_state import make_model
model = make_model(cold_start=False)
print("ready", flush=True)
while True:
    model.save({path!r})
"""


def test_a_kill_during_saves_always_leaves_a_loadable_file(tmp_path: Path) -> None:
    path = tmp_path / "latest.zip"
    make_model(cold_start=False).save(path)
    script = SAVE_LOOP.format(root=str(ROOT), path=str(path))
    for delay in (0.05, 0.11, 0.17, 0.23, 0.31, 0.37, 0.43, 0.5):
        process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=ROOT)
        assert process.stdout.readline().strip() == b"ready"
        try:
            process.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        data, state_dicts, _ = read_model_file(path)
        assert data["algorithm"] == "GRPO" and "policy" in state_dicts
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [] or all(
        p.name.startswith(".latest.zip.") for p in tmp_path.iterdir() if p.name.startswith(".")
    )  # at most a leftover temporary of the killed save, never a damaged target
    GRPO.load(path, env=make_env())


# ------------------------------------------------------------------------------------------------ exact resume
def resumed(tmp_path: Path, n: int, replay: bool = False, **kwargs) -> tuple[GRPO, GRPO]:
    """An uninterrupted ``learn(2n)`` and ``learn(n); save; load; learn(n, reset_num_timesteps=False)``."""
    whole = make_model(**kwargs)
    whole.learn(2 * n)
    first = make_model(**kwargs)
    first.learn(n)
    first.save(tmp_path / "half.zip")
    if replay:
        first.save_replay_buffer(tmp_path / "half_replay.npz")
    second = GRPO.load(tmp_path / "half.zip", env=make_env())
    if replay:
        second.load_replay_buffer(tmp_path / "half_replay.npz")
    second.learn(n, reset_num_timesteps=False)
    return whole, second


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"controls_kwargs": {"replay_ratio": 0.25}},
        {"controls_kwargs": {"curriculum": True}},
        {
            "beta": 0.04,
            "ent_coef": 0.01,
            "controls_kwargs": {"competition": "adaptive", "diversity_guard": True},
        },
    ],
    ids=["plain", "replay", "curriculum", "controls"],
)
def test_resume_is_bit_identical(tmp_path: Path, settings: dict) -> None:
    whole, second = resumed(tmp_path, 16, replay="replay_ratio" in settings.get("controls_kwargs", {}), **settings)
    assert_same_training_state(whole, second)
    if "curriculum" in settings:
        assert whole._curriculum.curriculum.difficulty == second._curriculum.curriculum.difficulty


class SaveMidRollout(BaseCallback):
    """Save during the second rollout's collection, as CheckpointCallback does from on_step."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path, self.calls = path, 0

    def _on_step(self) -> bool:
        self.calls += 1
        if self.calls == 10:  # inside the second rollout (8 steps each)
            self.model.save(self.path)
        return True


def test_resume_is_bit_identical_with_refills_gspo_and_the_prompt_pool(tmp_path: Path) -> None:
    """Refills make an iteration's completions vary, so the second half runs to the whole run's count."""
    settings = {
        "importance_level": "sequence",
        "dynamic_sampling": True,
        "mask_truncated": True,
        "controls_kwargs": {"prompt_sampling": "learnability", "prompt_pool_size": 4, "curriculum": True},
    }
    whole = make_model(**settings)
    whole.learn(32)
    first = make_model(**settings)
    first.learn(16)
    first.save(tmp_path / "half.zip")
    second = GRPO.load(tmp_path / "half.zip", env=make_env())
    second.learn(whole.num_timesteps - first.num_timesteps, reset_num_timesteps=False)
    assert_same_training_state(whole, second)
    assert whole._prompt_pool.get_state() == second._prompt_pool.get_state() and whole._prompt_pool.size > 0


def test_a_save_mid_rollout_records_the_last_finished_iteration(tmp_path: Path) -> None:
    whole = make_model()
    whole.learn(24, callback=SaveMidRollout(tmp_path / "mid.zip"))
    data, _, _ = read_model_file(tmp_path / "mid.zip")
    assert data["state"]["num_timesteps"] == 8 and data["state"]["_iteration"] == 1
    second = GRPO.load(tmp_path / "mid.zip", env=make_env())
    second.learn(16, reset_num_timesteps=False)
    assert_same_training_state(whole, second)


def test_checkpoint_callback_files_resume(tmp_path: Path) -> None:
    model = make_model()
    model.learn(16, callback=CheckpointCallback(save_freq=5, save_path=str(tmp_path), name_prefix="ckpt"))
    saved = sorted(tmp_path.glob("ckpt_*.zip"), key=os.path.getmtime)
    assert saved
    data, _, _ = read_model_file(saved[-1])
    assert data["state"]["num_timesteps"] % 8 == 0  # an iteration boundary, whatever step the callback saved at


# ------------------------------------------------------------------------------------------------ model objects
def test_frozen_parameters_stay_frozen_and_out_of_the_file_data(tmp_path: Path) -> None:
    from algorithms.common.model.loading import load_model

    network = load_model("tiny", num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                         num_key_value_heads=1, seed=0)  # fmt: skip
    frozen = [name for name, p in network.named_parameters() if name.startswith("model.layers.0.")]
    for name, parameter in network.named_parameters():
        parameter.requires_grad_(name not in frozen)
    before = {name: p.detach().clone() for name, p in network.named_parameters() if name in frozen}
    model = make_model(cold_start=False, policy_kwargs={"model": network})
    assert sum(len(g["params"]) for g in model.policy.optimizer.param_groups) == len(list(network.parameters())) - len(
        frozen
    )
    model.learn(8)
    model.save(tmp_path / "m.zip")
    with zipfile.ZipFile(tmp_path / "m.zip") as archive:
        assert len(archive.read("data")) < 50_000  # the arguments and state, not a pickled model
    loaded = GRPO.load(tmp_path / "m.zip", env=make_env())
    assert loaded.policy.frozen_parameters == frozen
    assert sum(len(g["params"]) for g in loaded.policy.optimizer.param_groups) == len(
        list(loaded.policy.parameters())
    ) - len(frozen)
    loaded.learn(8, reset_num_timesteps=False)
    for name, parameter in loaded.policy.model.named_parameters():
        if name in frozen:
            assert th.equal(parameter, before[name]) and not parameter.requires_grad


def test_the_same_seed_gives_the_same_parameters_after_several_updates() -> None:
    """Needs torch's deterministic CPU kernels in the update (algorithms/common/runtime/determinism.py): without them
    two runs with the 359-token vocabulary drifted apart in the last bits after 3 updates."""
    first, second = make_model(), make_model()
    first.learn(40)
    second.learn(40)
    assert_same_training_state(first, second)
    assert not th.are_deterministic_algorithms_enabled()  # the setting is the caller's again after learn()


# ------------------------------------------------------------------------------------------------ the env record
def test_load_without_env_rebuilds_the_recorded_env_and_resumes_exactly(tmp_path: Path) -> None:
    straight = make_model()
    straight.learn(16)
    first = make_model()
    first.learn(8)
    first.save(tmp_path / "m.zip")
    data = read_model_file(tmp_path / "m.zip")[0]
    assert (
        data["env"]["n_envs"] == 1 and data["env"]["record"]["kwargs"]["max_new_tokens"] == ENV_KWARGS["max_new_tokens"]
    )
    resumed_model = GRPO.load(tmp_path / "m.zip")  # no env: the recorded one is rebuilt
    assert resumed_model.env is not None and resumed_model.env.num_envs == 1
    assert resumed_model.env.get_attr("max_new_tokens")[0] == ENV_KWARGS["max_new_tokens"]
    resumed_model.learn(8, reset_num_timesteps=False)
    assert_same_training_state(straight, resumed_model)


def exact_match(prompts, completions, **kwargs) -> list[float]:
    return [1.0 if "=" in text else 0.0 for text in completions]


def test_an_env_with_reward_funcs_needs_them_back_at_load(tmp_path: Path) -> None:
    env = DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**ENV_KWARGS, reward_funcs={"exact": exact_match}))])
    model = make_model(env, cold_start=False)
    model.save(tmp_path / "m.zip")
    no_env = r"reward_funcs=\{'exact': \.\.\.\}.*env_objects=.*the model has no env"
    with pytest.warns(UserWarning, match=no_env) as got:
        bare = GRPO.load(tmp_path / "m.zip")
    assert [w.filename for w in got if "was not rebuilt" in str(w.message)] == [__file__]  # the load(...) line
    assert bare.env is None and not bare.get_env()  # predicts, does not train
    with pytest.raises(AttributeError, match=r"no env to reset: the env .*m\.zip records .*env_objects="):
        bare.get_env().reset()  # a user's next line says what to pass, not "'NoneType' has no attribute 'reset'"
    with pytest.raises(ValueError, match=r"GRPO.learn needs an env: the env .*m\.zip records was not rebuilt .*"
                       r"reward_funcs=\{'exact': \.\.\.\}.*env_objects="):  # fmt: skip
        bare.learn(8)
    with pytest.warns(UserWarning, match=r"names \['exact'\] too \(\['exact_match'\] given\)"):
        as_list = GRPO.load(tmp_path / "m.zip", env_objects={"reward_funcs": [f"{__name__}:exact_match"]})
    assert as_list.env is None  # a list names the function "exact_match", not the recorded "exact"
    rebuilt = GRPO.load(tmp_path / "m.zip", env_objects={"reward_funcs": {"exact": exact_match}})
    assert rebuilt.env is not None
    assert rebuilt.env.env_method("describe")[0]["kwargs"]["reward_funcs"] == {"exact": "<must be passed>"}
    with pytest.raises(ValueError, match="without env="):
        GRPO.load(tmp_path / "m.zip", env=env, env_objects={"reward_funcs": {"exact": exact_match}})


def test_a_recorded_env_id_never_imports_a_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gymnasium imports the module of a ``"module:Env-v0"`` id: a record naming one is refused, the module unrun."""
    marker = tmp_path / "imported"
    (tmp_path / "evil_env_module.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    model = make_model(cold_start=False)
    model.save(tmp_path / "m.zip")
    with zipfile.ZipFile(tmp_path / "m.zip") as original, zipfile.ZipFile(tmp_path / "evil.zip", "w") as crafted:
        for item in original.namelist():
            content = original.read(item)
            if item == "data":
                data = json.loads(content)
                data["env"]["record"]["env_id"] = "evil_env_module:Evil-v0"
                content = json.dumps(data).encode()
            crafted.writestr(item, content)
    with pytest.warns(UserWarning, match="not a registered R1ZeroEnv id"):
        loaded = GRPO.load(tmp_path / "evil.zip")
    assert loaded.env is None and not marker.exists()
    assert GRPO.load(tmp_path / "m.zip", rebuild_env=False).env is None


def feedback_env() -> DummyVecEnv:
    kwargs = {**ENV_KWARGS, "max_new_tokens": 16, "max_turns": 3}
    return DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**kwargs))] * 4)


class SaveInALaterTurn(BaseCallback):
    """Save during the second rollout's second turn (its episodes half played), keeping the rollout's locals then."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path, self.rollouts = path, 0
        self.scope: dict = {}

    def _on_rollout_start(self) -> None:
        self.rollouts += 1

    def _on_step(self) -> bool:
        if self.rollouts == 2 and not self.scope and self.locals.get("turn") == 1:
            self.model.save(self.path)
            self.scope = dict(self.locals)
        return True


def test_a_save_mid_episode_with_the_turn_cache_resumes_exactly(tmp_path: Path) -> None:
    """Multi-turn episodes (up to three answers) whose later turns are sampled from the KV cache of the turn before:
    a save inside a later turn of the second rollout resumes to the uninterrupted run (the cache is a rollout's own,
    never saved: the resumed run plays that rollout again from its start)."""
    settings = {"cold_start": False, "turn_kwargs": {"cache": True}, "n_groups": 1}
    whole = make_model(feedback_env(), **settings)
    whole.learn(20)  # 4 episodes of up to 3 turns a rollout: two rollouts
    first = make_model(feedback_env(), **settings)
    callback = SaveInALaterTurn(tmp_path / "mid.zip")
    first.learn(20, callback=callback)
    assert callback.scope["cache"] is not None and callback.scope["live"]  # mid-episode, the cache held
    data, _, _ = read_model_file(tmp_path / "mid.zip")
    assert data["state"]["_iteration"] == 1
    second = GRPO.load(tmp_path / "mid.zip", env=feedback_env())
    second.learn(whole.num_timesteps - data["state"]["num_timesteps"], reset_num_timesteps=False)
    assert_same_training_state(whole, second)
