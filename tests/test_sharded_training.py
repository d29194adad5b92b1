"""GRPO and LMPPO with ``sharding="fsdp"`` (FSDP2, algorithms/common/runtime/parallel.py) on real processes: torchrun,
2 gloo ranks on the CPU, the tiny model; the one-process references run here.

Two torchrun jobs (tests/sharded_training_job.py: ``train``, then ``resume`` reading its files) serve most tests;
the command line's sharded checkpoints have their own runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from algorithms import GRPO
from algorithms.cli import main
from tests import sharded_training_job as job
from tests.test_grpo import make_env
from tests.test_resume import write_config
from tests.two_ranks import run_on_two_ranks

JOB = Path(__file__).with_name("sharded_training_job.py")
ROOT = Path(__file__).resolve().parents[1]
#: 2 sharded processes against 1 in float32: the ranks' half gradients are summed where one process takes the whole
#: gradient at once, so the float32 sums run in another order; measured over 3 iterations (cold start, beta > 0):
#: 1.7e-6 at most on the weights, 1.4e-10 on AdamW's moments
WEIGHTS = {"atol": 2e-5, "rtol": 1e-4}
MOMENTS = {"atol": 1e-8, "rtol": 1e-3}
EXACT = {"atol": 0, "rtol": 0}


def torchrun(out: Path, mode: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_on_two_ranks(JOB, out, mode, timeout=timeout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sharded_training")
    done = torchrun(out, "train")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def resumed(trained: Path) -> tuple[Path, subprocess.CompletedProcess]:
    return trained, torchrun(trained, "resume")


@pytest.fixture(scope="module")
def one_process() -> dict:
    """The same GRPO run on one process (``sharding="fsdp"`` there trains unsharded)."""
    torch.set_num_threads(1)
    model = job.grpo()
    model.learn(2 * job.ITERATION)
    two = job.whole(model)
    model.learn(job.ITERATION, reset_num_timesteps=False)
    return {"two": two, "three": job.whole(model), "numel": sum(p.numel() for p in model.policy.parameters())}


def assert_same_state(got: dict, expected: dict, weights: dict = EXACT, moments: dict = EXACT) -> None:
    """Whole policy and optimizer state dicts equal, bit for bit or within the given tolerances."""
    assert got["policy"].keys() == expected["policy"].keys()
    for name, value in expected["policy"].items():
        torch.testing.assert_close(got["policy"][name], value, **weights, msg=name)
    assert got["optimizer"]["state"].keys() == expected["optimizer"]["state"].keys()
    for index, state in expected["optimizer"]["state"].items():
        for name, value in state.items():
            torch.testing.assert_close(got["optimizer"]["state"][index][name], value, **moments, msg=f"{index} {name}")


def test_each_rank_holds_a_shard_of_the_policy_and_the_reference(trained: Path, one_process: dict):
    facts = [json.loads((trained / f"facts_{rank}.json").read_text()) for rank in (0, 1)]
    for rank in facts:
        assert rank["types"] == ["DTensor"] and rank["reference_types"] == ["DTensor"]
        assert rank["local"] <= 0.51 * one_process["numel"]
    assert sum(rank["local"] for rank in facts) == one_process["numel"]  # every weight once over the ranks


def test_two_sharded_processes_train_the_weights_of_one(trained: Path, one_process: dict):
    """A cold start (each rank's SFT loss weighted 1/2, the backward summing), the reference copied from its result,
    then 3 GRPO iterations: the weights and AdamW's state of one process, within float32's summation order."""
    assert_same_state(torch.load(trained / "two.pt"), one_process["two"], WEIGHTS, MOMENTS)
    assert_same_state(torch.load(trained / "three.pt"), one_process["three"], WEIGHTS, MOMENTS)


@pytest.mark.parametrize("saved", ["model.zip", "ckpt/model.zip"])
def test_a_sharded_runs_files_load_on_one_process_exactly(trained: Path, saved: str):
    """The zip of save() (whole tensors gathered to rank 0) and the sharded checkpoint of save_sharded() (each rank's
    shards) both load on one process bit for bit, and train on as one process would."""
    model = GRPO.load(trained / saved, env=make_env())
    assert model.num_timesteps == 2 * job.ITERATION
    assert_same_state(job.whole(model), torch.load(trained / "two.pt"))
    model.learn(job.ITERATION, reset_num_timesteps=False)
    assert_same_state(job.whole(model), torch.load(trained / "three.pt"), WEIGHTS, MOMENTS)


def test_a_sharded_checkpoints_model_file_alone_or_its_folder_is_refused_naming_the_fix(trained: Path, tmp_path: Path):
    """The checkpoint's model.zip holds no weights (they are the shards beside it): copied out of its folder it is
    refused naming the file and the fix; the folder passed for its model file names the file to pass (GRPO.load,
    and the serve / quantize loader)."""
    from algorithms.deploy.loading import load_policy

    shutil.copy(trained / "ckpt" / "model.zip", tmp_path / "lonely.zip")
    with pytest.raises(ValueError, match=r"lonely\.zip' holds no weights: .*copy the folder whole"):
        GRPO.load(tmp_path / "lonely.zip")
    inside = repr(str(trained / "ckpt" / "model.zip"))
    for load in (GRPO.load, load_policy):
        with pytest.raises(ValueError, match=f"is a checkpoint folder: pass its model file, {re.escape(inside)}"):
            load(trained / "ckpt")


@pytest.mark.parametrize("saved", ["zip", "ckpt"])
def test_a_sharded_runs_files_resume_on_two_processes_exactly(resumed, saved: str):
    """Loaded on 2 processes again, each file gives the saved state and the next iteration of the uninterrupted
    run, bit for bit."""
    folder, _ = resumed
    assert (folder / "resumed_0").exists() and (folder / "resumed_1").exists()
    assert_same_state(torch.load(folder / f"loaded_{saved}.pt"), torch.load(folder / "two.pt"))
    assert_same_state(torch.load(folder / f"resumed_{saved}.pt"), torch.load(folder / "three.pt"))


def test_a_kill_during_a_sharded_checkpoint_leaves_the_previous_one(resumed):
    """Rank 1 was killed (SIGKILL) with its shard of a new save_sharded() written: the folder still holds the
    previous checkpoint, whole."""
    folder, done = resumed
    assert done.returncode != 0
    assert "SIGKILL" in done.stderr or "Signal 9" in done.stderr, done.stderr[-3000:]
    model = GRPO.load(folder / "ckpt" / "model.zip", env=make_env())
    assert_same_state(job.whole(model), torch.load(folder / "two.pt"))


def test_lora_with_sharding_trains_the_adapters_and_exports_their_folder(trained: Path):
    """Adapters and frozen base both sharded, bf16 compute on float32 master weights: every adapter weight moved, no
    base weight did; save_pretrained wrote the adapter folder (gathered on rank 0) with the trained adapters."""
    facts = json.loads((trained / "facts_0.json").read_text())
    assert facts["lora"] == ["DTensor False", "DTensor True"]  # the frozen base and the adapters, both sharded
    saved = torch.load(trained / "lora.pt")
    adapters = [name for name in saved["final"] if ".lora_" in name]
    assert adapters
    for name, value in saved["final"].items():
        assert (not torch.equal(value, saved["initial"][name])) == (name in adapters), name
    assert json.loads((trained / "adapter" / "adapter_config.json").read_text())["r"] == job.LORA["lora"]["r"]
    exported = load_file(trained / "adapter" / "adapter_model.safetensors")
    assert len(exported) == len(adapters)
    for name in adapters:  # peft's file names drop the adapter's name and the policy's "model." prefix
        key = name.removeprefix("model.").replace(".default.", ".")
        torch.testing.assert_close(exported[key], saved["final"][name], **EXACT, msg=name)


def test_lora_with_sharding_exports_the_merged_model(trained: Path):
    """save_pretrained(merge=True) from the gathered state dict (a sharded network cannot be copied): an ordinary
    model folder whose logits are those of the trained adapters on their base."""
    from transformers import AutoModelForCausalLM

    policy = job.grpo(policy_kwargs=job.LORA, cold_start=False).policy
    policy.load_state_dict(torch.load(trained / "lora.pt")["final"])
    merged = AutoModelForCausalLM.from_pretrained(trained / "merged")
    ids = torch.arange(2, 14).view(2, 6)
    with torch.no_grad():
        expected = policy.model(input_ids=ids).logits
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)


def test_lmppo_with_sharding_trains_the_weights_of_ddp(trained: Path):
    """LMPPO's value head and reference sharded too, its layers in gradient-checkpointed chunks: the job's DDP run's
    weights, within float32's summation order."""
    assert_same_state(torch.load(trained / "ppo_fsdp.pt"), torch.load(trained / "ppo_ddp.pt"), WEIGHTS, MOMENTS)


def test_sharding_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="gradient_compression"):
        job.grpo(distributed_kwargs={"gradient_compression": "fp16"})
    with pytest.raises(ValueError, match="leave diagnostics off"):
        job.grpo(controls_kwargs={"diagnostics": True})
    with pytest.raises(ValueError, match="sharding"):
        job.grpo(sharding="zero3")


def test_the_cli_resumes_a_sharded_checkpoint_on_two_and_on_one_process(tmp_path: Path):
    """grpo-gym train --nproc 2 --sharding fsdp writes sharded checkpoints; --resume from one continues to the
    uninterrupted run's weights: bit for bit on 2 processes, within float32's summation order on 1."""
    config = write_config(tmp_path, n_timesteps=24)  # 3 iterations; checkpoints after the first two
    common = ["train", "--no-progress-bar", "--config", str(config), "--checkpoint-every", "1", "--seed", "3",
              "--sharding", "fsdp"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    whole = [sys.executable, "-m", "algorithms.cli", *common, "--nproc", "2", "--save-path", str(tmp_path / "whole")]
    done = subprocess.run(whole, cwd=ROOT, capture_output=True, text=True, env=env, check=False, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # rank 0 alone prints: the cold start once, the tables before and after GRPO once each
    assert done.stdout.count("cold start:") == 1 and done.stdout.count("\npolicy ") == 2, done.stdout
    newest = tmp_path / "whole_checkpoints" / "iteration_0000002"
    assert {p.name for p in newest.iterdir()} == {".metadata", "__0_0.distcp", "__1_0.distcp", "model.zip", "run.json"}
    for name in ("two", "one"):
        shutil.copytree(tmp_path / "whole_checkpoints", tmp_path / f"{name}_checkpoints")
    resume = [*common, "--resume", "--save-path", str(tmp_path / "two")]
    done = subprocess.run([sys.executable, "-m", "algorithms.cli", *resume, "--nproc", "2"], cwd=ROOT,
                          capture_output=True, text=True, env=env, check=False, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("resuming from") == 1, done.stdout  # rank 0 alone prints
    assert main([*common, "--resume", "--save-path", str(tmp_path / "one")]) == 0  # one process, in this one
    expected = GRPO.load(tmp_path / "whole.zip")
    for name, tolerance in (("two", EXACT), ("one", WEIGHTS)):
        resumed = GRPO.load(tmp_path / f"{name}.zip")
        assert resumed.num_timesteps == expected.num_timesteps == 24
        weights = resumed.policy.state_dict()
        for key, value in expected.policy.state_dict().items():
            torch.testing.assert_close(weights[key], value, **tolerance, msg=f"{name}: {key}")
