"""A tiny GRPO job on colocated vLLM that tests/test_vllm_training.py starts under torchrun (or calls in-process).

``python -m torch.distributed.run --standalone --nproc_per_node 2 tests/vllm_distributed_job.py OUT MODE``: each rank
samples its groups on its own ``vllm.LLM`` (vLLM's ``external_launcher`` under torchrun). ``MODE`` ``train``: 2
iterations of K=2 groups x G=4, saved to ``OUT/model.zip``; ``resume``: that file loaded on every rank and trained
one iteration more, each rank's weights written to ``OUT/resumed_<rank>.pt``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from algorithms import GRPO
from tests.engine_models import ENGINE_KWARGS
from tests.test_grpo import make_env

SETTINGS = {
    "n_groups": 2,
    "group_size": 4,
    "beta": 0.04,
    "learning_rate": 1e-3,
    "cold_start": False,
    "seed": 0,
    "policy_kwargs": {"model": "tiny", "model_kwargs": ENGINE_KWARGS},
    "distributed_kwargs": {"timeout": 120.0},
    "mixed_precision": "no",
    "rollout_engine": "vllm",
    "rollout_engine_kwargs": {"kv_cache_memory_bytes": 32 << 20},
}


def run(out: Path, iterations: int = 2) -> dict[str, torch.Tensor]:
    """``iterations`` iterations from the start, saved to ``out/model.zip``; the final weights."""
    torch.set_num_threads(1)
    with GRPO("TransformerPolicy", make_env(), **SETTINGS) as model:
        model.learn(8 * iterations)
        model.save(out / "model.zip")
        return {name: value.detach().clone() for name, value in model.policy.state_dict().items()}


def resume(out: Path) -> None:
    """``out/model.zip`` trained one iteration more; this rank's weights to ``out/resumed_<rank>.pt``."""
    torch.set_num_threads(1)
    with GRPO.load(out / "model.zip", env=make_env(), distributed_kwargs={"timeout": 120.0}) as model:
        model.learn(8, reset_num_timesteps=False)
        torch.save(model.policy.state_dict(), out / f"resumed_{os.environ.get('RANK', '0')}.pt")


if __name__ == "__main__":
    folder, mode = Path(sys.argv[1]), sys.argv[2]
    if mode == "train":
        run(folder)
    else:
        resume(folder)
