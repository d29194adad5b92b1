"""A NaN or an infinity in the weights or the optimizer's state stops training at the iteration it appeared in, and
nothing is written from that state (algorithms/common/model/finite_state.py): not a checkpoint, not the ``--save-path``
file, not a ``save()``; the rotation never deletes the last good checkpoint for a bad one; ``load`` refuses an
optimizer state with non-finite moments or settings out of range, naming the file and the entry."""

from __future__ import annotations

import hashlib
import io
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch as th

from algorithms import GRPO
from algorithms.cli import main
from algorithms.common.model.finite_state import NonFiniteStateError, find_nonfinite
from algorithms.common.saving.checkpoints import checkpoints
from tests.sizes import TINY
from tests.test_hostile_files import make_env, rewrite, with_data
from tests.test_resume import write_config


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` by its path and the SHA-256 of its bytes."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def with_optimizer(source: Path, target: Path, change) -> Path:
    """Copy the model zip ``source`` to ``target`` with ``change(moments)`` applied to each parameter's Adam state."""

    def edit(name: str, content: bytes) -> bytes:
        if name != "policy.optimizer.pth":
            return content
        state = th.load(io.BytesIO(content), weights_only=True)
        for moments in state["state"].values():
            change(moments)
        buffer = io.BytesIO()
        th.save(state, buffer)
        return buffer.getvalue()

    return rewrite(source, target, edit)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A run of 4 iterations, a checkpoint at each iteration boundary (the newest 2 kept: after iterations 2 and 3),
    its --save-path file; resuming trains iteration 4 again from the newest checkpoint."""
    folder = tmp_path_factory.mktemp("run")
    config = write_config(folder, n_timesteps=32)
    run = ["train", "--config", str(config), "--checkpoint-every", "1", "--save-path", str(folder / "m.zip")]
    assert main([*run, "--no-progress-bar", "-params", "eval_problems:2"]) == 0
    return folder, [*run, "--resume", "--no-progress-bar", "-params", "eval_problems:2"]


def copied(stopped: tuple[Path, list[str]], tmp_path: Path) -> tuple[Path, list[str]]:
    source, argv = stopped
    shutil.copytree(source, tmp_path, dirs_exist_ok=True)
    return tmp_path, [arg.replace(str(source), str(tmp_path)) for arg in argv]


def tamper(checkpoint: Path, change) -> None:
    """Replace the checkpoint's model.zip by ``change(source, target)``'s copy of it."""
    original = checkpoint / "model.zip"
    crafted = change(original, checkpoint / "crafted.zip")
    crafted.replace(original)


def stop_error(argv: list[str], capsys: pytest.CaptureFixture, code: int) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == code and "Traceback" not in err, err
    return err


def huge_first_moment(moments: dict[str, Any]) -> None:
    """A finite first moment near float32's largest: the next Adam step overflows every weight it touches."""
    moments["exp_avg"].fill_(3e38)


def test_a_run_that_diverges_stops_at_that_iteration_and_writes_nothing(
    stopped, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Through a file: a checkpoint whose Adam first moments (finite: load takes them) make the next update overflow
    every weight. Before: the run went on with NaN weights, wrote them as checkpoints and as the --save-path file,
    and the rotation deleted the last good checkpoint."""
    folder, argv = copied(stopped, tmp_path)
    directory = folder / "m_checkpoints"
    older, newest = checkpoints(directory)
    tamper(newest, lambda source, target: with_optimizer(source, target, huge_first_moment))
    before = fingerprint(folder)
    err = stop_error(argv, capsys, code=1)
    assert "training stopped at iteration 4" in err and "NaN or infinite" in err and "learning_rate" in err
    assert fingerprint(folder) == before  # the save, both checkpoints: byte for byte; no new checkpoint
    assert checkpoints(directory) == [older, newest]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda s, t: with_optimizer(s, t, lambda moments: moments["exp_avg_sq"].fill_(float("nan"))), "exp_avg_sq"),
        (lambda s, t: with_data(s, t, lambda d: d["arguments"].update(learning_rate=1e39)), "learning_rate must be"),
    ],
    ids=["nan-moment", "learning-rate-1e39"],
)
def test_a_checkpoint_that_would_diverge_or_crash_is_refused_before_any_work(
    stopped, tmp_path: Path, capsys: pytest.CaptureFixture, change, words: str
) -> None:
    """Before: NaN moments loaded, the first update turned every weight NaN and every save kept them; a learning rate
    of 1e39 loaded and the first optimizer step crashed ("value cannot be converted to type float")."""
    folder, argv = copied(stopped, tmp_path)
    newest = checkpoints(folder / "m_checkpoints")[-1]
    tamper(newest, change)
    before = fingerprint(folder)
    err = stop_error(argv, capsys, code=2)
    assert str(newest / "model.zip") in err and words in err and "use another save" in err
    assert fingerprint(folder) == before


def test_a_learning_rate_schedule_that_turns_nan_stops_learn_and_save_refuses(tmp_path: Path) -> None:
    """Through the Python API: a schedule finite at both ends (what the constructor checks) and for two iterations,
    NaN from the third. Checkpoints every iteration: the newest stays the good one of iteration 2, and neither it
    nor the file saved before changes afterwards."""
    from algorithms.common.saving.checkpoints import IterationCheckpoint

    model = GRPO(
        "TransformerPolicy", make_env(), policy_kwargs=TINY, n_groups=2, group_size=2, cold_start=False, seed=0,
        mixed_precision="no", learning_rate=lambda progress: 1e-3 if progress >= 0.5 or progress == 0 else math.nan,
    )  # fmt: skip
    path = tmp_path / "good.zip"
    model.save(path)
    before = path.read_bytes()
    (tmp_path / "checkpoints").mkdir()
    checkpoint = IterationCheckpoint(tmp_path / "checkpoints", every=1, run={"total_timesteps": 16})
    with pytest.raises(NonFiniteStateError, match=r"training stopped at iteration 3: parameter '.*' \(\d+ of \d+"):
        model.learn(16, callback=checkpoint)
    newest = checkpoints(tmp_path / "checkpoints")[-1]
    assert newest.name == "iteration_0000002"
    written = fingerprint(tmp_path / "checkpoints")
    with pytest.raises(NonFiniteStateError, match="refusing to write"):
        model.save(path)
    with pytest.raises(NonFiniteStateError, match="refusing to write"):
        checkpoint.save()
    assert path.read_bytes() == before and fingerprint(tmp_path / "checkpoints") == written
    GRPO.load(newest / "model.zip", env=make_env(), custom_objects={"learning_rate": 1e-3})  # finite: load checks


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda moments: moments["exp_avg"].fill_(float("inf")), "NaN or infinite values in 'exp_avg'"),
        (lambda moments: moments.update(exp_avg=th.zeros(3)), "of shape \\(3,\\)"),
    ],
    ids=["infinite-moment", "moment-shape"],
)
def test_load_refuses_damaged_optimizer_moments(tmp_path: Path, change, words: str) -> None:
    model = GRPO(
        "TransformerPolicy", make_env(), policy_kwargs=TINY, n_groups=2, group_size=2, cold_start=False, seed=0
    )
    model.learn(4)  # the optimizer has moments
    model.save(tmp_path / "good.zip")
    crafted = with_optimizer(tmp_path / "good.zip", tmp_path / "bad.zip", change)
    with pytest.raises(ValueError, match=words) as refusal:
        GRPO.load(crafted, env=make_env())
    assert str(crafted) in str(refusal.value) and "policy.optimizer.pth" in str(refusal.value)


def test_eval_and_serve_leave_a_damaged_optimizer_state_unread(stopped, tmp_path: Path, capsys) -> None:
    """``grpo-gym eval`` and the server never use the optimizer: a file whose optimizer state ``load`` refuses is
    still evaluated (``read_optimizer=False``); training from it is still refused."""
    folder, _ = stopped
    crafted = with_optimizer(folder / "m.zip", tmp_path / "bad.zip", lambda moments: moments["exp_avg"].fill_(1e400))
    with pytest.raises(ValueError, match="NaN or infinite values in 'exp_avg'"):
        GRPO.load(crafted, env=make_env())
    model = GRPO.load(crafted, env=make_env(), read_optimizer=False)
    assert all(th.isfinite(value).all() for value in model.policy.state_dict().values())
    capsys.readouterr()
    assert main(["eval", str(crafted), "--difficulty", "0.1", "--n", "2", "--greedy"]) == 0
    assert "bad" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("group", "words"),
    [
        ({"betas": [0.9, 2.0]}, r"betas=\[0.9, 2.0\] in group 0: they must be two numbers in \[0, 1\)"),
        ({"lr": float("nan")}, "lr=nan in group 0: it must be a learning rate >= 0"),
        ({"eps": 0.0}, "eps=0.0 in group 0"),
        ({"params": [0]}, "parameter groups of sizes \\[1\\]"),
    ],
)
def test_load_refuses_optimizer_settings_out_of_range(tmp_path: Path, group: dict[str, Any], words: str) -> None:
    model = GRPO(
        "TransformerPolicy", make_env(), policy_kwargs=TINY, n_groups=2, group_size=2, cold_start=False, seed=0
    )
    model.save(tmp_path / "good.zip")

    def edit(name: str, content: bytes) -> bytes:
        if name != "policy.optimizer.pth":
            return content
        state = th.load(io.BytesIO(content), weights_only=True)
        state["param_groups"][0].update(group)
        buffer = io.BytesIO()
        th.save(state, buffer)
        return buffer.getvalue()

    crafted = rewrite(tmp_path / "good.zip", tmp_path / "bad.zip", edit)
    with pytest.raises(ValueError, match=words):
        GRPO.load(crafted, env=make_env())


def test_find_nonfinite_names_the_tensor_and_counts() -> None:
    layer = th.nn.Linear(3, 2)
    optimizer = th.optim.AdamW(layer.parameters())
    assert find_nonfinite(layer, optimizer) is None
    layer(th.ones(1, 3)).sum().backward()
    optimizer.step()
    optimizer.state[layer.bias]["exp_avg_sq"][1] = float("inf")
    assert find_nonfinite(layer, optimizer) == "the optimizer's 'exp_avg_sq' of 'bias' (1 of 2 values NaN or infinite)"
    with th.no_grad():
        layer.weight[0, 0] = float("nan")
    assert find_nonfinite(layer) == "parameter 'weight' (1 of 6 values NaN or infinite)"
