"""FSDP2 sharding (algorithms.common.runtime.sharding, algorithms.common.saving.sharded) with real processes: torchrun,
2 gloo ranks on the CPU, the built-in tiny Llama; the one-process references run here, through the same functions.

Two torchrun jobs (tests/sharding_job.py) serve every test of the module: ``train`` and, reading its checkpoint,
``resume``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

from algorithms.common.runtime.sharding import copy_weights, device_mesh, full_optimizer_state_dict
from algorithms.common.saving.sharded import load_sharded, save_sharded
from tests import sharding_job as job
from tests.two_ranks import run_on_two_ranks

JOB = Path(__file__).with_name("sharding_job.py")
#: 2 processes against 1 in float32: the only difference is the order of the float32 sums (the two ranks' half
#: gradients summed vs one whole gradient); measured after 3 AdamW steps at lr 1e-2: 1.5e-7 at most on the weights
WEIGHTS = {"atol": 1e-6, "rtol": 1e-5}
MOMENTS = {"atol": 1e-8, "rtol": 1e-4}


def torchrun(out: Path, mode: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_on_two_ranks(JOB, out, mode, timeout=timeout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sharded")
    done = torchrun(out, "train")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def resumed(trained: Path) -> tuple[Path, subprocess.CompletedProcess]:
    return trained, torchrun(trained, "resume")


@pytest.fixture(scope="module")
def one_process() -> dict:
    """The unsharded reference: the same model, batch and steps in this one process."""
    torch.set_num_threads(1)
    model, optimizer = job.build()
    first = job.sample_both(model)
    norms = [job.train_step(model, optimizer) for _ in range(2)]
    step2 = job.gathered(model, optimizer)
    norms.append(job.train_step(model, optimizer))
    return {"first": first, "step2": step2, "step3": job.gathered(model, optimizer), "norms": norms}


def facts(folder: Path) -> list[dict]:
    return [json.loads((folder / f"facts_{rank}.json").read_text()) for rank in (0, 1)]


def assert_same_state(got: dict, expected: dict, exact: bool = False) -> None:
    """Model and optimizer state dicts (whole, unsharded layout) equal, bit for bit or within float32 tolerances."""
    weights, moments = ({"atol": 0, "rtol": 0},) * 2 if exact else (WEIGHTS, MOMENTS)
    assert got["model"].keys() == expected["model"].keys()
    for name, value in expected["model"].items():
        torch.testing.assert_close(got["model"][name], value, **weights, msg=name)
    # (torch's loading may give the hyperparameters' tuples back as lists: betas (0.9, 0.999) -> [0.9, 0.999])
    assert json.dumps(got["optimizer"]["param_groups"]) == json.dumps(expected["optimizer"]["param_groups"])
    assert got["optimizer"]["state"].keys() == expected["optimizer"]["state"].keys()
    for index, state in expected["optimizer"]["state"].items():
        for name, value in state.items():
            torch.testing.assert_close(got["optimizer"]["state"][index][name], value, **moments, msg=f"{index} {name}")


def test_each_process_holds_half_of_every_weight(trained: Path):
    ranks = facts(trained)
    total = ranks[0]["gathered_numel"]
    assert total == sum(p.numel() for p in job.build()[0].parameters())
    assert sum(rank["local_numel"] for rank in ranks) == total  # each weight once over the ranks
    assert all(rank["local_numel"] <= 0.51 * total for rank in ranks)
    assert ranks[0]["gathered_types"] == ["Parameter"]  # plain tensors for the decoders, not DTensors


def test_a_sharded_model_starts_from_rank_zeros_weights(trained: Path):
    """Rank 1 built other weights (seed 1); shard_model gave every rank rank 0's (seed 0)."""
    initial = torch.load(trained / "samples.pt")["initial"]
    for name, value in job.build()[0].state_dict().items():
        torch.testing.assert_close(initial[name], value, atol=0, rtol=0, msg=name)


def test_two_sharded_processes_train_the_weights_of_one(trained: Path, one_process: dict):
    """Weights, gradient norms and AdamW's state after 2 and 3 steps equal the unsharded single process's (the
    gradients are summed, never averaged by gloo's AVG: pytorch#162338)."""
    assert_same_state(torch.load(trained / "step2.pt"), one_process["step2"])
    assert_same_state(torch.load(trained / "step3.pt"), one_process["step3"])
    torch.testing.assert_close(facts(trained)[0]["norms"], one_process["norms"], atol=1e-6, rtol=1e-6)


def test_gradient_checkpointing_in_chunks_shards_by_chunk(trained: Path):
    """A chunk of N checkpointed layers runs them all from its first layer's forward, so its N layers are sharded as
    one group (layers_per_group=N): the weights are those of the run without checkpointing, bit for bit."""
    checkpointed = torch.load(trained / "checkpointed_step2.pt")
    for name, value in torch.load(trained / "step2.pt")["model"].items():
        torch.testing.assert_close(checkpointed[name], value, atol=0, rtol=0, msg=name)


def test_sampling_from_gathered_weights_gives_the_unsharded_tokens(trained: Path, one_process: dict):
    """Both decoders (the project's Llama decoder reading the weights, and the model's own forward) sample the
    tokens and log-probs of an unsharded model with the same weights: before training, and after 2 steps."""
    samples = torch.load(trained / "samples.pt")
    model, _ = job.build()
    model.load_state_dict(torch.load(trained / "step2.pt")["model"])
    for sharded, plain in ((samples["first"], one_process["first"]), (samples["second"], job.sample_both(model))):
        for key, value in plain.items():
            torch.testing.assert_close(sharded[key], value, atol=0, rtol=0, msg=key)


def test_a_sharded_frozen_reference_is_refreshed_from_the_policy(trained: Path):
    """copy_weights between two models sharded alike (no communication) gives the reference the policy's logits."""
    for rank in facts(trained):
        assert rank["reference_differed"] and rank["reference_refreshed"]


def test_a_sharded_checkpoint_loads_on_one_process_exactly(trained: Path, one_process: dict):
    model, optimizer = job.build()
    load_sharded(trained / "ckpt", model, optimizer)
    assert_same_state(job.gathered(model, optimizer), torch.load(trained / "step2.pt"), exact=True)
    assert (trained / "ckpt" / "extra.json").is_file()  # write_extra's file travels with the checkpoint
    job.train_step(model, optimizer)  # and trains on alone, as the single process would have
    assert_same_state(job.gathered(model, optimizer), one_process["step3"])


def test_a_sharded_checkpoint_missing_a_ranks_shard_file_is_refused_naming_it(trained: Path, tmp_path: Path):
    """A checkpoint copied in part (or written on machines that did not share the folder): an error naming the
    missing shard file and the fix, not DCP's FileNotFoundError."""
    shutil.copytree(trained / "ckpt", tmp_path / "ckpt", ignore=shutil.ignore_patterns("__1_0.distcp"))
    with pytest.raises(ValueError, match=r"__1_0\.distcp missing .* copy the checkpoint folder whole"):
        load_sharded(tmp_path / "ckpt", *job.build())


def test_a_sharded_checkpoint_loads_on_two_processes_exactly(resumed):
    folder, _ = resumed
    assert (folder / "resumed_0").exists() and (folder / "resumed_1").exists()
    assert_same_state(torch.load(folder / "resumed_step2.pt"), torch.load(folder / "step2.pt"), exact=True)
    # the resumed job's next step is the uninterrupted job's, bit for bit
    assert_same_state(torch.load(folder / "resumed_step3.pt"), torch.load(folder / "step3.pt"), exact=True)


def test_an_ordinary_whole_model_file_loads_into_two_sharded_processes_exactly(resumed):
    """The layout of the model zip (whole tensors, the optimizer's parameters numbered): every rank reads it and keeps
    its shards, and the next step is the uninterrupted job's."""
    folder, _ = resumed
    loaded = torch.load(folder / "from_full_state.pt")
    assert_same_state(loaded["loaded"], torch.load(folder / "step2.pt"), exact=True)
    assert_same_state(loaded["stepped"], torch.load(folder / "step3.pt"), exact=True)


def test_a_kill_during_a_sharded_save_leaves_the_previous_checkpoint(resumed, tmp_path: Path):
    """Rank 1 was killed (SIGKILL) with its shard of a new save written: the folder still holds the previous
    checkpoint, whole, and the next save over it succeeds."""
    folder, done = resumed
    assert done.returncode != 0
    assert "SIGKILL" in done.stderr or "Signal 9" in done.stderr, done.stderr[-3000:]
    model, optimizer = job.build()
    load_sharded(folder / "ckpt", model, optimizer)
    assert_same_state(job.gathered(model, optimizer), torch.load(folder / "step2.pt"), exact=True)
    shutil.copytree(folder, tmp_path / "copy", ignore=shutil.ignore_patterns("*.pt", "adapter"))
    save_sharded(tmp_path / "copy" / "ckpt", model, optimizer)  # removes a leftover temporary folder, if any
    assert sorted(p.name for p in (tmp_path / "copy").iterdir() if p.name.startswith(".ckpt")) == []
    load_sharded(tmp_path / "copy" / "ckpt", *job.build())


def test_lora_with_sharding_trains_the_adapters_only_and_exports_them(trained: Path):
    """Adapters and frozen base weights are both sharded; with bf16 compute the gathered weights are bf16 and the
    sharded (master) weights float32. After 2 steps every adapter weight changed and no base weight did; the adapter
    folder written from the gathered state dict loads with peft."""
    from peft import PeftModel

    rank = facts(trained)[0]
    assert rank["lora_trainable"] == ["DTensor"] and rank["lora_frozen"] == ["DTensor"]
    assert rank["lora_gathered_dtypes"] == ["torch.bfloat16"] and rank["lora_master_dtypes"] == ["torch.float32"]
    saved = torch.load(trained / "lora.pt")
    adapters = [name for name in saved["final"] if ".lora_" in name]
    assert adapters
    for name, value in saved["final"].items():
        changed = not torch.equal(value, saved["initial"][name])
        assert changed == (name in adapters), name
    exported = PeftModel.from_pretrained(job.build()[0], trained / "adapter")
    for name, value in exported.state_dict().items():
        if ".lora_" in name:
            torch.testing.assert_close(value, saved["final"][name], atol=0, rtol=0, msg=name)


def test_lora_sampling_from_gathered_bf16_weights_gives_the_unsharded_tokens(trained: Path):
    """The gathered weights are the float32 master weights rounded to bf16 (the buffers, e.g. the rotary frequencies,
    stay float32): an unsharded copy with the same weights so rounded samples the same tokens and log-probs, through
    both decoders."""
    saved = torch.load(trained / "lora.pt")
    model, _ = job.build(lora=True)
    model.load_state_dict(saved["final"])
    for parameter in model.parameters():
        parameter.data = parameter.data.to(torch.bfloat16)
    for key, value in job.sample_both(model).items():
        torch.testing.assert_close(saved["samples"][key], value, atol=0, rtol=0, msg=key)


# ---------------------------------------------------------------------------------------------- one process
def test_sharding_needs_a_process_group():
    with pytest.raises(ValueError, match="torchrun"):
        device_mesh("cpu")


def test_loading_an_incomplete_checkpoint_folder_is_refused(tmp_path: Path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "__0_0.distcp").write_bytes(b"partial")
    with pytest.raises(ValueError, match="not a complete sharded checkpoint"):
        load_sharded(tmp_path / "ckpt", *job.build())


def test_a_checkpoint_before_the_first_step_leaves_the_optimizer_fresh(tmp_path: Path):
    """torch's state-dict API would create AdamW's state with a zero step (and so change its next steps): neither a
    save nor a gathered optimizer state dict does that, and a load keeps a fresh optimizer fresh."""
    model, optimizer = job.build()
    save_sharded(tmp_path / "ckpt", model, optimizer)
    assert full_optimizer_state_dict(model, optimizer)["state"] == {}
    assert not optimizer.state
    other, fresh = job.build()
    load_sharded(tmp_path / "ckpt", other, fresh)
    assert not fresh.state


def test_copy_weights_needs_two_copies_of_one_model():
    model, _ = job.build()
    target, _ = job.build()
    with torch.no_grad():
        for p in target.parameters():
            p.zero_()
    copy_weights(model, target)
    for name, value in model.state_dict().items():
        assert torch.equal(target.state_dict()[name], value), name
    with pytest.raises(ValueError, match="different parameters"):
        copy_weights(model, nn.Linear(2, 2))
