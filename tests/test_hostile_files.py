"""Crafted and damaged model files (algorithms/common/saving/model_file.py, run_file.py): sizes are checked before
anything is read, pickled weights are refused naming the entry, a damaged ``data`` names its key, and recorded
sizes have limits (issue 24)."""

from __future__ import annotations

import errno
import io
import json
import os
import zipfile
from pathlib import Path

import pytest
import torch as th
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

import grpo_gym
from algorithms import GRPO
from algorithms.common.saving import model_file
from algorithms.common.saving.run_file import MAX_RECORDED_ENVS, recorded_env_kwargs
from grpo_gym.env import MAX_CONTEXT_LENGTH
from grpo_gym.validation import ArgumentError
from tests.sizes import ENV_KWARGS, TINY


def make_env() -> DummyVecEnv:
    return DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**ENV_KWARGS))])


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    settings = {"n_groups": 2, "group_size": 2, "cold_start": False, "seed": 0, "mixed_precision": "no"}
    model = GRPO("TransformerPolicy", make_env(), policy_kwargs=TINY, **settings)
    path = tmp_path_factory.mktemp("saved") / "good.zip"
    model.save(path)
    return path


def rewrite(source: Path, target: Path, change) -> Path:
    """Copy the zip ``source`` to ``target`` with ``change(name, content) -> content | None`` (None: left out)."""
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as crafted:
        for name in original.namelist():
            content = change(name, original.read(name))
            if content is not None:
                crafted.writestr(name, content)
    return target


def with_tensors(entry: str, change):
    """A ``rewrite`` change that applies ``change(state dict) -> state dict`` to the tensors of the zip's ``entry``
    (``"policy.pth"``, ``"ref_model.pth"``)."""

    def edit(name: str, content: bytes) -> bytes:
        if name != entry:
            return content
        buffer = io.BytesIO()
        th.save(change(th.load(io.BytesIO(content), weights_only=True)), buffer)
        return buffer.getvalue()

    return edit


def with_data(source: Path, target: Path, edit) -> Path:
    def change(name: str, content: bytes) -> bytes:
        if name != "data":
            return content
        data = json.loads(content)
        edit(data)
        return json.dumps(data).encode()

    return rewrite(source, target, change)


class Touch:
    """Unpickling this would create a file (the stand-in for running a command)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (Path(self.target).touch, ())


def test_a_pickled_weights_entry_is_refused_naming_the_entry(saved: Path, tmp_path: Path) -> None:
    target = tmp_path / "pwned"

    def change(name: str, content: bytes) -> bytes:
        if name != "policy.pth":
            return content
        buffer = io.BytesIO()
        th.save({"weight": Touch(str(target))}, buffer)
        return buffer.getvalue()

    bad = rewrite(saved, tmp_path / "bad.zip", change)
    for load in (
        lambda: GRPO.load(bad),
        lambda: GRPO.load(bad, env=make_env()),
        lambda: model_file.read_model_file(bad),
    ):
        with pytest.raises(ValueError, match=r"bad\.zip: entry 'policy\.pth' holds pickled objects.*never unpickles"):
            load()
    assert not target.exists()


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_model_file_with_a_nan_or_inf_weight_is_refused_naming_it(saved: Path, tmp_path: Path, value: float) -> None:
    """Training or predicting from diverged weights gives nothing but NaN: load says so, naming the tensor."""

    def change(name: str, content: bytes) -> bytes:
        if name != "policy.pth":
            return content
        weights = th.load(io.BytesIO(content), weights_only=True)
        key = next(k for k in weights if k.endswith("mlp.down_proj.weight"))
        weights[key].view(-1)[3] = value
        buffer = io.BytesIO()
        th.save(weights, buffer)
        return buffer.getvalue()

    bad = rewrite(saved, tmp_path / "diverged.zip", change)
    message = r"diverged\.zip' has 1 NaN or infinite values in '.*mlp\.down_proj\.weight'"
    for load in (lambda: GRPO.load(bad), lambda: GRPO.load(bad, env=make_env())):
        with pytest.raises(ValueError, match=message):
            load()


def test_a_data_bomb_is_refused_before_it_is_read(saved: Path, tmp_path: Path) -> None:
    def change(name: str, content: bytes) -> bytes:  # 70 MB of JSON that deflates to about 70 KB
        return content if name != "data" else content[:-1] + b"," + b'"pad": "' + b" " * (70 * 2**20) + b'"}'

    bomb = rewrite(saved, tmp_path / "bomb.zip", change)
    assert bomb.stat().st_size < 2**20
    with pytest.raises(ValueError, match=r"'data' entry expands to 73,4\d\d,\d\d\d bytes"):
        GRPO.load(bomb)


def test_weights_larger_than_memory_are_refused_before_reading(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_file, "memory_bytes", lambda: 1000)
    with pytest.raises(ValueError, match=r"more than this machine's memory \(1,000 bytes\); refused before reading"):
        GRPO.load(saved)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda data: data.pop("policy_class"), "'policy_class' must be a str, found missing"),
        (lambda data: data.update(arguments=[1, 2]), "'arguments' must be a dict, found a list"),
        (lambda data: data.update(state="x"), "'state' must be a dict, found a str"),
        (lambda data: data["state"].pop("problem_rng"), r"run state lacks \['problem_rng'\]"),
        (lambda data: data.update(env=3), "'env' must be a dict, found a int"),
    ],
)
def test_a_damaged_data_entry_names_its_key(saved: Path, tmp_path: Path, edit, message: str) -> None:
    bad = with_data(saved, tmp_path / "bad.zip", edit)
    with pytest.raises(ValueError, match=message):
        GRPO.load(bad, env=make_env())


def test_a_recorded_env_count_has_a_limit(saved: Path, tmp_path: Path) -> None:
    bad = with_data(saved, tmp_path / "many.zip", lambda data: data["env"].update(n_envs=200_000))
    with pytest.raises(ValueError, match=rf"n_envs=200000; it must be an integer in \[1, {MAX_RECORDED_ENVS}\]"):
        recorded_env_kwargs(bad)
    with pytest.warns(UserWarning, match="n_envs=200000"):
        model = GRPO.load(bad)  # the model loads (to predict, export, serve) without building any env
    assert model.env is None and not model.get_env()


def test_a_recorded_env_argument_r1zeroenv_does_not_take_is_refused_naming_it(saved: Path, tmp_path: Path) -> None:
    bad = with_data(saved, tmp_path / "odd.zip", lambda data: data["env"]["record"]["kwargs"].update(shiny=1))
    with pytest.raises(
        ValueError, match=r"odd\.zip: the env record names arguments R1ZeroEnv does not take: \['shiny'\]"
    ):
        recorded_env_kwargs(bad)
    with pytest.warns(UserWarning, match=r"\['shiny'\]"):
        assert not GRPO.load(bad).get_env()


def test_a_recorded_env_that_does_not_fit_the_model_names_the_file(saved: Path, tmp_path: Path) -> None:
    """A record edited to another window: SB3's bare "Observation spaces do not match" named neither file nor fix."""
    bad = with_data(
        saved, tmp_path / "wide.zip", lambda data: data["env"]["record"]["kwargs"].update(context_length=512)
    )
    with pytest.raises(ValueError, match=r"wide\.zip: Observation spaces do not match.*rebuilt from its record does"):
        GRPO.load(bad)
    wide = DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**{**ENV_KWARGS, "context_length": 512}))])
    with pytest.raises(ValueError, match=r"good\.zip: Observation spaces do not match.*the env given does not fit"):
        GRPO.load(saved, env=wide)


@pytest.mark.parametrize(("key", "value"), [("context_length", 10**12), ("max_turns", 10**9)])
def test_env_sizes_have_limits(key: str, value: int) -> None:
    with pytest.raises(ArgumentError, match=key):
        grpo_gym.R1ZeroEnv(**{**ENV_KWARGS, key: value})
    assert MAX_CONTEXT_LENGTH == 2**20


def test_a_full_disk_names_the_file_and_the_disk_and_replaces_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from algorithms.common.saving import atomic

    target = tmp_path / "model.zip"
    target.write_bytes(b"the previous file")

    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(OSError, match=rf"no space left to write '{target}' on the disk holding '{tmp_path}'"):
        with atomic.atomic_write(target) as handle:
            handle.write(b"new")
    assert target.read_bytes() == b"the previous file" and os.listdir(tmp_path) == ["model.zip"]


def test_a_checkpoint_that_cannot_be_written_names_itself_and_the_one_kept(
    saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from algorithms.common.saving.checkpoints import latest_checkpoint, write_checkpoint

    model = GRPO.load(saved, env=make_env())
    first = write_checkpoint(model, tmp_path, run={"total_timesteps": 8})

    def full(*_args, **_kwargs) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(model, "save", full)
    model._iteration += 1
    with pytest.raises(
        OSError, match=rf"checkpoint .*0000001' was not written .*previous checkpoint '{first}' is intact"
    ):
        write_checkpoint(model, tmp_path, run={"total_timesteps": 8})
    assert latest_checkpoint(tmp_path) == first and len(os.listdir(tmp_path)) == 1


@pytest.mark.parametrize("save_path", ["", ".zip", "   ", "/proc/m.zip", "{tmp}/file/m.zip", "{tmp}/"])
def test_sft_refuses_a_save_path_it_cannot_write_before_the_cold_start(
    tmp_path: Path, capsys: pytest.CaptureFixture, save_path: str
) -> None:
    """``grpo-gym sft`` checks ``--save-path`` as ``train`` does: an empty one saved nothing and exited 0, and a
    name it could not write failed only after the whole cold start, losing it."""
    from algorithms.cli import main
    from tests.test_cli import write_config

    (tmp_path / "file").write_text("x")
    config = write_config(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["sft", "--config", str(config), "--save-path", save_path.format(tmp=tmp_path)])
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert err.startswith("grpo-gym sft: error: --save-path") and "Traceback" not in err
    assert "cold start" not in out + err


def test_sft_says_where_the_model_went(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from algorithms.cli import main
    from tests.test_cli import write_config

    (tmp_path / "run").mkdir()  # SB3's rule: beside a folder of that name, the model goes to run.zip
    assert main(["sft", "--config", str(write_config(tmp_path)), "--save-path", str(tmp_path / "run")]) == 0
    assert f"saved to {tmp_path / 'run.zip'}" in capsys.readouterr().out
    assert GRPO.load(tmp_path / "run.zip")._cold_start_done
