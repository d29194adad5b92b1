"""GRPO and LMPPO with ``sharding="fsdp"`` under torchrun, for tests/test_sharded_training.py (whose one-process
references call :func:`grpo` and :func:`ppo` here, unsharded).

``python -m torch.distributed.run --standalone --nproc_per_node 2 tests/sharded_training_job.py OUT MODE``:

- ``train``: GRPO (cold start of 2 SFT steps, ``beta`` > 0: a sharded reference, which samples the first rollout)
  learns 2 iterations, saves
  ``model.zip`` and a sharded checkpoint ``ckpt/``, writes its whole state (``two.pt``), learns a third iteration
  (``three.pt``); a LoRA GRPO in bf16 learns 1 iteration and exports its adapter folder and the merged model
  (``lora.pt``, ``adapter/``, ``merged/``); LMPPO with gradient checkpointing (a sharded value head and reference)
  learns 1 iteration (``ppo_fsdp.pt``), and so does LMPPO with DDP (``ppo_ddp.pt``).
- ``resume``: loads ``model.zip`` and then ``ckpt/model.zip`` on the 2 processes (``loaded_zip.pt``,
  ``loaded_ckpt.pt``), each learning the third iteration (``resumed_zip.pt``, ``resumed_ckpt.pt``); then writes
  ``ckpt/`` again while rank 1 is killed (SIGKILL) with its shard written.

Rank 0 writes the files (``get_parameters()``: whole tensors, gathered to rank 0); ``facts_<rank>.json`` holds what
each rank held.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist

from algorithms import GRPO, LMPPO
from tests.sizes import TINY
from tests.test_grpo import make_env

SETTINGS = {
    "n_groups": 2,
    "group_size": 4,
    "beta": 0.04,
    "learning_rate": 1e-3,
    "cold_start": True,
    "cold_start_kwargs": {"steps": 2, "batch_size": 4},
    "controls_kwargs": {"protected_rollouts": 1},
    "seed": 0,
    "policy_kwargs": TINY,
    "distributed_kwargs": {"timeout": 60.0},
    "mixed_precision": "no",
    "sharding": "fsdp",
}
LORA = {**TINY, "lora": {"r": 4, "alpha": 8}}
ITERATION = 8  # completions: K x G


def grpo(**kwargs) -> GRPO:
    return GRPO("TransformerPolicy", make_env(), **{**SETTINGS, **kwargs})


def ppo(**kwargs) -> LMPPO:
    policy = {**TINY, "gradient_checkpointing": True}  # a chunk of layers gathered as one FSDP group
    settings = {**SETTINGS, "group_size": 1, "n_epochs": 2, "policy_kwargs": policy, **kwargs}
    for name in ("beta", "controls_kwargs"):  # GRPO's
        settings.pop(name)
    return LMPPO("TransformerPolicy", make_env(), **settings)


def whole(model) -> dict:
    """A copy of the model's whole policy and optimizer state (rank 0; ``{}`` elsewhere)."""
    parameters = model.get_parameters()  # unsharded: SB3's, the live tensors
    return copy.deepcopy({"policy": parameters["policy"], "optimizer": parameters["policy.optimizer"]})


def save(state: dict, path: Path) -> None:
    if dist.get_rank() == 0:
        torch.save(state, path)


def train(out: Path) -> None:
    model = grpo()
    facts = {"local": sum(p.to_local().numel() for p in model.policy.parameters()),
             "types": sorted({type(p).__name__ for p in model.policy.parameters()}),
             "reference_types": sorted({type(p).__name__ for p in model.ref_model.parameters()})}  # fmt: skip
    model.learn(2 * ITERATION)
    model.save(out / "model.zip")
    model.save_sharded(out / "ckpt")
    save(whole(model), out / "two.pt")
    model.learn(ITERATION, reset_num_timesteps=False)
    save(whole(model), out / "three.pt")
    lora = grpo(policy_kwargs=LORA, mixed_precision="bf16", cold_start=False)
    facts["lora"] = sorted({f"{type(p).__name__} {p.requires_grad}" for p in lora.policy.parameters()})
    initial = lora.get_parameters()["policy"]
    lora.learn(ITERATION)
    lora.save_pretrained(str(out / "adapter"))
    lora.save_pretrained(str(out / "merged"), merge=True)
    save({"initial": initial, "final": lora.get_parameters()["policy"]}, out / "lora.pt")
    for sharding in ("fsdp", None):
        critic = ppo(sharding=sharding)
        critic.learn(2)
        save(whole(critic), out / f"ppo_{sharding or 'ddp'}.pt")
    (out / f"facts_{dist.get_rank()}.json").write_text(json.dumps(facts))


def resume(out: Path) -> None:
    for name in ("zip", "ckpt"):
        model = GRPO.load(out / ("model.zip" if name == "zip" else "ckpt/model.zip"), env=make_env())
        save(whole(model), out / f"loaded_{name}.pt")
        model.learn(ITERATION, reset_num_timesteps=False)
        save(whole(model), out / f"resumed_{name}.pt")
    (out / f"resumed_{dist.get_rank()}").touch()
    kill_rank_one_while_saving(model, out / "ckpt")


def kill_rank_one_while_saving(model: GRPO, directory: Path) -> None:
    """Save the checkpoint again; rank 1 is killed (SIGKILL) once its shard is written, before the checkpoint is."""
    from torch.distributed.checkpoint import FileSystemWriter

    write_data = FileSystemWriter.write_data

    def write_then_die(self, plan, planner):
        future = write_data(self, plan, planner)
        if dist.get_rank() == 1:
            future.wait()
            os.kill(os.getpid(), signal.SIGKILL)
        return future

    FileSystemWriter.write_data = write_then_die
    model.save_sharded(directory)


if __name__ == "__main__":
    torch.set_num_threads(1)
    folder, mode = Path(sys.argv[1]), sys.argv[2]
    {"train": train, "resume": resume}[mode](folder)
