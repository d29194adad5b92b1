"""The rollout engine chosen by the algorithm's arguments (algorithms.common.generation.engines.setup), without vLLM:
``rollout_engine="hf"`` trains GRPO and LMPPO with the weights pushed and timed after every update and the TIS
correction on; the engine is not in the file, a load rebuilds it, ``close_engine`` and ``with`` end it; bad settings
are refused naming the fix; ``grpo-gym train``'s engine flags, ``--resume`` taking them, and an engine that cannot
start ending the command with the fix and no traceback. The real vLLM engines in training:
tests/test_vllm_training.py."""

from __future__ import annotations

import contextlib
import io
import zipfile
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from algorithms import GRPO
from algorithms.cli import main
from algorithms.common.generation.engines.base import EngineError
from algorithms.common.generation.engines.hf import HFGenerateEngine
from algorithms.common.generation.engines.setup import EngineSpec, cpu_kv_bytes, max_model_len
from algorithms.common.saving.checkpoints import latest_checkpoint
from algorithms.common.saving.run_file import read_saved_run
from tests.test_cli import write_config
from tests.test_grpo import make_env, make_model
from tests.test_ppo import make_model as make_ppo

try:
    import vllm  # noqa: F401

    HAS_VLLM = True
except Exception:  # not installed, or a broken install
    HAS_VLLM = False


def scalars(folder: Path, tag: str) -> list[float]:
    run = next(p for p in sorted(folder.iterdir()) if p.is_dir())
    events = EventAccumulator(str(run), size_guidance={"scalars": 0}).Reload()
    return [event.value for event in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []


def test_hf_engine_trains_grpo_with_a_timed_push_after_every_update(tmp_path: Path) -> None:
    model = make_model(rollout_engine="hf", tensorboard_log=str(tmp_path / "tb"))
    assert isinstance(model.policy.rollout_engine, HFGenerateEngine) and model._sampler_correction == "tis"
    model.learn(16)
    syncs, kl = scalars(tmp_path / "tb", "time/weight_sync_seconds"), scalars(tmp_path / "tb", "train/sampler_kl")
    assert len(syncs) == 2 and all(s >= 0 for s in syncs)  # one push per update, logged with its iteration
    assert len(kl) == 2 and all(abs(v) < 1e-6 for v in kl)  # generate's logits are the update's, float32
    model.save(tmp_path / "m.zip")
    with zipfile.ZipFile(tmp_path / "m.zip") as archive:
        assert not any("engine" in name for name in archive.namelist())  # the arguments only, no engine object
    loaded = GRPO.load(tmp_path / "m.zip", env=make_env())
    assert isinstance(loaded.policy.rollout_engine, HFGenerateEngine) and loaded.rollout_engine == "hf"
    assert GRPO.load(tmp_path / "m.zip", env=make_env(), rollout_engine="builtin").policy.rollout_engine is None
    with loaded:
        loaded.learn(8, reset_num_timesteps=False)
    assert loaded.policy.rollout_engine is None  # leaving the block closed it: the policy's own sampler again
    model.close_engine()
    assert model.policy.rollout_engine is None and model.push_weights() is None


def test_builtin_has_no_engine_and_lmppo_takes_hf(tmp_path: Path) -> None:
    model = make_model(tensorboard_log=str(tmp_path / "tb"), mixed_precision="no")
    assert model.policy.rollout_engine is None and model._sampler_correction is None
    model.learn(8)
    assert scalars(tmp_path / "tb", "time/weight_sync_seconds") == []
    ppo = make_ppo(rollout_engine="hf", cold_start=False, tensorboard_log=str(tmp_path / "ppo"))
    assert isinstance(ppo.policy.rollout_engine, HFGenerateEngine) and ppo._sampler_correction == "tis"
    ppo.learn(8)
    assert len(scalars(tmp_path / "ppo", "time/weight_sync_seconds")) == ppo.iteration >= 1
    assert ppo._rollout.sampler_weights is not None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rollout_engine": "sglang"}, r"rollout_engine .*'builtin', 'hf', 'vllm'"),
        ({"rollout_engine_kwargs": {"mode": "remote"}}, r"rollout_engine_kwargs\['mode'\] .*'colocate', 'server'"),
        (
            {"rollout_engine_kwargs": {"server_base_url": "127.0.0.1:8000"}},
            r"rollout_engine_kwargs\['server_base_url'\] must be a URL such as 'http://",
        ),
        ({"rollout_engine_kwargs": {"server_port": 70000}}, "server_port"),
        (
            {"rollout_engine_kwargs": {"llm_kwargs": ["tensor_parallel_size"]}},
            "rollout_engine_kwargs\\['llm_kwargs'\\] must be a dict of keyword arguments",
        ),
        (
            {"rollout_engine_kwargs": {"lora_sync": "full"}},
            r"rollout_engine_kwargs\['lora_sync'\] .*'merged', 'adapters'",
        ),
        ({"rollout_engine": "hf", "sharding": "fsdp"}, r"not with sharding='fsdp'.*use sharding=None"),
        (
            {"rollout_engine": "vllm", "rollout_engine_kwargs": {"enable_sleep_mode": True}},
            "needs a CUDA device; leave it False on a CPU",
        ),
    ],
)
def test_bad_engine_settings_name_the_fix(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_model(**kwargs)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here: the missing-vLLM message cannot be seen")
def test_vllm_colocated_without_vllm_says_how_to_install() -> None:
    with pytest.raises(EngineError, match=r"needs the vllm package .*pip install vllm.*bash \.ci/install_vllm\.sh"):
        make_model(rollout_engine="vllm")


def test_the_spec_and_the_engine_sizes() -> None:
    model = make_model(
        rollout_engine="hf",
        rollout_engine_kwargs={"server_host": "10.0.0.2", "server_port": 8001},
    )
    spec = EngineSpec.of(model)
    assert spec.server_url == "http://10.0.0.2:8001" and spec.engine == "hf" and spec.llm_kwargs == {}
    assert EngineSpec(base_url="http://h:1/").server_url == "http://h:1"
    assert max_model_len(model.policy) == 256 + 24  # the env's window and max_new_tokens, under memory_length
    network = model.policy.model
    assert cpu_kv_bytes(network, rows=8, tokens=280) == 16 << 20  # tiny: the floor
    assert cpu_kv_bytes(network, rows=10**9, tokens=280) == 1 << 30  # capped


# ---------------------------------------------------------------------------------------------- the command line
def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = int(stop.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_train_flags_and_resume_take_the_engine(tmp_path: Path) -> None:
    config, folder = write_config(tmp_path), tmp_path / "ck"
    base = ["train", "--config", str(config), "--checkpoint-dir", str(folder), "--checkpoint-every", "1"]
    code, out, err = run_cli([*base, "--rollout-engine", "hf", "--save-path", str(tmp_path / "m.zip")])
    assert code == 0, err
    saved = read_saved_run(latest_checkpoint(folder) / "model.zip").arguments
    assert (saved["rollout_engine"], saved["sampler_correction"]) == ("hf", "auto")  # the flag's, recorded
    code, out, err = run_cli(
        [*base, "--resume", "--rollout-engine", "builtin", "-params", "rollout_engine_kwargs:{'mode': 'server'}"]
    )
    assert code == 0, err
    assert (
        "-params taken: rollout_engine_kwargs" in out
    )  # how it samples may change on --resume, what it learns may not


def test_an_engine_that_cannot_start_ends_the_command_with_the_fix(tmp_path: Path) -> None:
    config, folder = write_config(tmp_path), tmp_path / "ck"
    argv = ["train", "--config", str(config), "--checkpoint-dir", str(folder), "--rollout-engine", "vllm",
            "--vllm-mode", "server", "--vllm-server-base-url", "http://127.0.0.1:9", "-params",
            "rollout_engine_kwargs:{'server_timeout': 1.0}"]  # fmt: skip
    code, _, err = run_cli(argv)
    assert code == 1 and "Traceback" not in err
    assert "no vLLM server answers at http://127.0.0.1:9" in err and "grpo-gym vllm-serve" in err
    assert not folder.exists()  # refused at setup: no empty checkpoint folder left behind


def test_a_zoo_config_names_the_engine(tmp_path: Path) -> None:
    """rl-zoo3 YAML keys: the engine's arguments are constructor arguments like any other."""
    import yaml

    from algorithms.cli import _grpo_keys
    from algorithms.common.hyperparams import check_keys, load_hyperparams

    keys = {
        "rollout_engine": "hf",
        "rollout_engine_kwargs": {
            "mode": "server",
            "server_base_url": "http://127.0.0.1:8000",
            "lora_sync": "adapters",
        },
        "sampler_correction": "mask",
    }
    path = tmp_path / "grpo.yml"
    path.write_text(yaml.safe_dump({"R1Zero-v0": {"n_timesteps": 8, "policy": "TransformerPolicy", **keys}}))
    config = load_hyperparams(path, "R1Zero-v0")
    check_keys(config, _grpo_keys(), str(path))
    model = make_model(**{key: config[key] for key in keys})
    assert model.rollout_engine == "hf" and model._sampler_correction == "mask"


def test_served_vllm_on_several_processes_is_refused_naming_the_fix() -> None:
    import torch

    from algorithms.common.generation.engines.setup import check_spec

    with pytest.raises(ValueError, match=r"2 processes: .*Use rollout_engine_kwargs=\{'mode': 'colocate'\}"):
        check_spec(EngineSpec(engine="vllm", vllm_mode="server"), None, torch.device("cpu"), world_size=2)
    check_spec(EngineSpec(engine="vllm"), None, torch.device("cpu"), world_size=2)  # colocated: one per rank
