"""Group parallelism (several processes) with real processes: torchrun, 2 gloo ranks, the tiny model."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import torch

from algorithms import GRPO
from tests.distributed_job import run
from tests.test_grpo import make_env
from tests.two_ranks import run_on_two_ranks

JOB = Path(__file__).with_name("distributed_job.py")


def torchrun(out: Path, mode: str, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_on_two_ranks(JOB, out, mode, *extra, timeout=timeout)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("two_ranks")
    done = torchrun(out, "train")
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_two_processes_train_the_weights_of_one(two_ranks: Path, tmp_path: Path):
    """Each rank trains one of the K=2 groups; the summed gradients give the single-process weights (float32,
    pinned by the job: ``auto`` may pick bf16 on a CPU with native bf16)."""
    single = run(tmp_path).policy.state_dict()
    assert_same_weights(two_ranks, single, atol=2e-5, rtol=1e-4)


def test_two_processes_train_the_weights_of_one_in_bf16(tmp_path: Path):
    """The same in bf16 (emulated on a CPU without native bf16), with bf16's tolerances."""
    done = torchrun(tmp_path, "train", "mixed_precision=bf16")
    assert done.returncode == 0, done.stdout + done.stderr
    (tmp_path / "one").mkdir()
    single = run(tmp_path / "one", mixed_precision="bf16").policy.state_dict()
    # bf16 rounds the two ranks' half-gradients apart from the whole one: where a gradient is near 0, Adam's
    # normalised step (about lr = 1e-3 per update) can take another sign. So: nearly every weight within bf16's
    # tolerance, and none further than Adam's bound over the job's two updates.
    for rank in (0, 1):
        weights = torch.load(tmp_path / f"params_{rank}.pt")
        for name, value in single.items():
            error = (weights[name] - value).abs()
            assert (error > 5e-4 + 1e-3 * value.abs()).float().mean() < 1e-3, name
            assert error.max() <= 2 * 1e-3 + 1e-6, name


def test_two_processes_refill_and_sample_prompts_as_one(tmp_path: Path):
    """Dynamic sampling (every rank draws the same rounds), the prompt pool, GSPO and mask_truncated: the job's
    weights are the single process's."""
    options = {
        "dynamic_sampling": True,
        "controls_kwargs": {"prompt_sampling": "learnability", "prompt_pool_size": 4},
        "importance_level": "sequence",
        "clip_range": 3e-4,
        "clip_range_high": 4e-4,
        "mask_truncated": True,
    }
    done = torchrun(tmp_path, "train", *(f"{key}={value}" for key, value in options.items()), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (tmp_path / "one").mkdir()
    single = run(tmp_path / "one", **options)
    assert_same_weights(tmp_path, single.policy.state_dict(), atol=2e-5, rtol=1e-4)


def test_two_processes_overlap_sampling_and_updates_as_one(tmp_path: Path):
    """max_staleness=1 under torchrun: each rank's producer samples its own group with the scheduled version; the
    job's weights are those of one process with the same schedule."""
    done = torchrun(tmp_path, "train", "max_staleness=1", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (tmp_path / "one").mkdir()
    single = run(tmp_path / "one", max_staleness=1)
    assert_same_weights(tmp_path, single.policy.state_dict(), atol=2e-5, rtol=1e-4)


def assert_same_weights(folder: Path, single: dict[str, torch.Tensor], atol: float, rtol: float) -> None:
    for rank in (0, 1):
        weights = torch.load(folder / f"params_{rank}.pt")
        assert weights.keys() == single.keys()
        for name, value in single.items():
            torch.testing.assert_close(weights[name], value, atol=atol, rtol=rtol, msg=name)


def test_only_rank_zero_logs_and_saves(two_ranks: Path):
    runs = sorted(p.name for p in (two_ranks / "tb").iterdir())
    assert runs == ["GRPO_1"]
    assert len(list((two_ranks / "tb" / "GRPO_1").iterdir())) == 1  # one events file
    assert (two_ranks / "model.zip").is_file()


def test_a_checkpoint_loads_on_one_process(two_ranks: Path):
    model = GRPO.load(two_ranks / "model.zip", env=make_env())
    saved = torch.load(two_ranks / "params_0.pt")
    for name, value in model.policy.state_dict().items():
        torch.testing.assert_close(value, saved[name], atol=0, rtol=0)
    model.learn(8)  # and trains on, alone


@pytest.mark.parametrize("mode", ["die", "hang"])
def test_a_failed_rank_ends_the_job_with_an_error(tmp_path: Path, mode: str):
    start = time.perf_counter()
    done = torchrun(tmp_path, mode, timeout=400)  # generous: a loaded machine starts processes slowly
    elapsed = time.perf_counter() - start
    assert done.returncode != 0
    assert "ChildFailedError" in done.stderr or "failed" in done.stderr.lower(), done.stderr[-2000:]
    assert elapsed < 120  # the job's timeout is 10 s; no silent hang


@pytest.mark.parametrize("compression", ["fp16", "powersgd"])
def test_compression_runs(tmp_path: Path, compression: str):
    done = torchrun(tmp_path, "train", f"gradient_compression={compression}")
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = (torch.load(tmp_path / f"params_{rank}.pt") for rank in (0, 1))
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0)  # every rank applies the same update


def test_groups_must_divide_over_the_processes(monkeypatch):
    from algorithms.common.runtime import distributed

    monkeypatch.setattr(distributed.Distributed, "__init__", lambda self, **_: setattr(self, "rank", 0)
                        or setattr(self, "world_size", 3))  # fmt: skip
    with pytest.raises(ValueError, match="multiple of the number of processes"):
        GRPO("TransformerPolicy", make_env(), n_groups=2, group_size=4, seed=0)
