"""A tiny GRPO job that the distributed tests start under torchrun (or call in-process for one process).

``python -m torch.distributed.run --standalone --nproc_per_node 2 tests/distributed_job.py OUT MODE``: trains
the tiny test model on K=2 groups x G=4 for 2 iterations and writes each rank's final parameters to
``OUT/params_<rank>.pt`` (rank 0 also saves ``OUT/model.zip`` and logs to ``OUT/tb``). ``MODE``: ``train``,
``die`` (rank 1 exits at the second rollout) or ``hang`` (rank 1 stops answering at the second rollout).
Further ``key=value`` arguments are GRPO arguments (``mixed_precision=bf16``; ``gradient_compression=powersgd`` goes
into ``distributed_kwargs``).
The precision is pinned to float32 unless one is given: the tests compare the weights with float32 tolerances.
"""

from __future__ import annotations

import ast
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from stable_baselines3.common.callbacks import BaseCallback

from algorithms import GRPO
from tests.sizes import TINY
from tests.test_grpo import make_env


class Fail(BaseCallback):
    """Rank 1 dies or hangs when the second rollout starts."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode, self.rollouts = mode, 0

    def _on_rollout_start(self) -> None:
        self.rollouts += 1
        if self.rollouts == 2 and int(os.environ.get("RANK", "0")) == 1:
            if self.mode == "die":
                os._exit(3)
            if self.mode == "hang":
                time.sleep(3600)

    def _on_step(self) -> bool:
        return True


def literal(text: str) -> object:
    """A ``key=value`` argument's value: a Python literal (``True``, ``3``) or the text itself (``powersgd``)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def run(out: Path, mode: str = "train", iterations: int = 2, **kwargs) -> GRPO:
    torch.set_num_threads(1)
    settings = {"n_groups": 2, "group_size": 4, "beta": 0.04, "learning_rate": 1e-3, "cold_start": False,
                "seed": 0, "policy_kwargs": TINY, "tensorboard_log": str(out / "tb"),
                "distributed_kwargs": {"timeout": 10.0}, "mixed_precision": "no"}  # fmt: skip
    model = GRPO("TransformerPolicy", make_env(), **{**settings, **kwargs})
    model.learn(8 * iterations, callback=Fail(mode))
    torch.save(model.policy.state_dict(), out / f"params_{model._dist.rank}.pt")
    model.save(out / "model.zip")
    return model


if __name__ == "__main__":
    out, mode = Path(sys.argv[1]), sys.argv[2]
    extra: dict = {key: literal(value) for key, value in (argument.split("=", 1) for argument in sys.argv[3:])}
    if "gradient_compression" in extra:  # a setting of distributed_kwargs; PowerSGD from step 3
        compression = extra.pop("gradient_compression")
        extra.update(iterations=4, distributed_kwargs={"timeout": 10.0, "gradient_compression": compression})
    run(out, mode, **extra)
    if torch.distributed.is_initialized():  # join gloo's threads before exit (a rank aborted at exit without it)
        torch.distributed.destroy_process_group()
