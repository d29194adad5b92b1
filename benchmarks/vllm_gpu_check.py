"""vLLM on a CUDA GPU, checked in minutes (``benchmarks/gpu_check.sh`` runs it; nothing here runs on a CPU-only
machine, and none of it has been run on the machine that wrote it: it had no GPU).

Each check runs GRPO from this project on the GPU and records what it measured, pass or fail, as a Markdown table
in ``--out``:

1. ``colocated``: ``rollout_engine="vllm"`` colocated, the built-in ``--model`` in bf16 (``mixed_precision="auto"``),
   ``--iterations`` iterations: seconds per iteration, the weight push's seconds, ``train/sampler_kl`` (bf16 vLLM
   against the bf16 update: small, not 0), and the engine's log-probs against the update's after training;
2. ``sleep``: the same with ``rollout_engine_kwargs={"enable_sleep_mode": True}``: the GPU memory vLLM frees
   while the trainer runs (``torch.cuda.mem_get_info`` after the rollout against during it);
3. ``lora``: LoRA adapters pushed as LoRA requests (``rollout_engine_kwargs={"lora_sync": "adapters"}``), two
   iterations;
4. ``served``: a vLLM server on 127.0.0.1 sharing the GPU (``gpu_memory_utilization`` 0.3), two iterations.

    python benchmarks/vllm_gpu_check.py --out gpu_check.md [--model base] [--iterations 3]
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from stable_baselines3.common.callbacks import BaseCallback

import grpo_gym
from algorithms import GRPO

ENV = {"template": "compact", "difficulty": 0.5, "max_new_tokens": 128}


class Probe(BaseCallback):
    """Iteration boundaries and the GPU's free memory during each rollout and right after it."""

    def __init__(self) -> None:
        super().__init__()
        self.starts: list[float] = []
        self.free_during: list[int] = []

    def _on_rollout_start(self) -> None:
        self.starts.append(time.perf_counter())

    def _on_step(self) -> bool:
        self.free_during.append(torch.cuda.mem_get_info()[0])
        return True


def grpo(args: argparse.Namespace, **kwargs: Any) -> GRPO:
    settings = {"n_groups": 8, "group_size": 8, "cold_start": False, "beta": 0.0, "seed": 0, "device": "cuda",
                "policy_kwargs": {"model": args.model}, "rollout_engine": "vllm",
                "tensorboard_log": tempfile.mkdtemp(prefix="vllm-gpu-check-tb-")}  # fmt: skip
    return GRPO("TransformerPolicy", grpo_gym.R1ZeroEnv(**ENV), **{**settings, **kwargs})


def last_scalar(folder: str, tag: str) -> float:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = sorted(Path(folder).iterdir())[-1]
    events = EventAccumulator(str(run), size_guidance={"scalars": 0}).Reload()
    return events.Scalars(tag)[-1].value if tag in events.Tags()["scalars"] else float("nan")


def train(model: GRPO, iterations: int) -> dict[str, Any]:
    """Train and measure: seconds per iteration (after the first), the last push, the sampler KL and log-prob gap."""
    from algorithms.common.generation.engines.base import SamplingSettings
    from algorithms.common.rollout.batch import left_pad
    from tests.engine_models import max_gap

    probe = Probe()
    model.learn(64 * iterations, callback=probe)
    probe.starts.append(time.perf_counter())
    per_iteration = [b - a for a, b in zip(probe.starts[1:-1], probe.starts[2:], strict=True)] or [0.0]
    kl = last_scalar(model.tensorboard_log, "train/sampler_kl")
    ids, mask = left_pad([torch.tensor([5, 6, 7, 8]), torch.tensor([9, 10, 11])], 0)
    ids, mask = ids.cuda(), mask.cuda()
    out = model.policy.generate(ids, mask, generator=torch.Generator("cuda").manual_seed(0))
    with torch.autocast("cuda", torch.bfloat16):
        gap = max_gap(model.policy.model, ids, mask, out, SamplingSettings.of_policy(model.policy))
    return {
        "s/iteration": sum(per_iteration) / len(per_iteration),
        "push s": model.policy.rollout_engine.last_sync_seconds,
        "sampler_kl": kl,
        "log-prob gap": gap,
        "free GiB during rollouts (min)": min(probe.free_during) / 2**30,
    }


def check_colocated(args: argparse.Namespace) -> dict[str, Any]:
    with grpo(args) as model:
        return train(model, args.iterations)


def check_sleep(args: argparse.Namespace) -> dict[str, Any]:
    with grpo(args, rollout_engine_kwargs={"enable_sleep_mode": True}) as model:
        result = train(model, args.iterations)
        model.policy.rollout_engine.sleep()
        result["free GiB asleep"] = torch.cuda.mem_get_info()[0] / 2**30
        return result


def check_lora(args: argparse.Namespace) -> dict[str, Any]:
    lora = {"model": args.model, "lora": {"r": 16, "alpha": 32}}
    with grpo(args, policy_kwargs=lora, rollout_engine_kwargs={"lora_sync": "adapters"}) as model:
        return train(model, 2)


def check_served(args: argparse.Namespace) -> dict[str, Any]:
    from algorithms.common.generation.engines.base import SamplingSettings
    from algorithms.common.generation.engines.vllm_folder import export_folder
    from algorithms.common.generation.engines.vllm_launcher import start_vllm_server
    from algorithms.common.model.loading import load_model

    vocab = grpo_gym.R1ZeroEnv().codec.vocab_size
    folder = Path(tempfile.mkdtemp(prefix="vllm-gpu-check-"))
    exported, _ = export_folder(load_model(args.model, vocab_size=vocab, seed=0), SamplingSettings(1, 0), folder / "m")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    begin = time.perf_counter()
    server = start_vllm_server(exported, port=port, dtype="bfloat16", gpu_memory_utilization=0.3,
                               log_path=folder / "server.log", startup_timeout=300)  # fmt: skip
    started = time.perf_counter() - begin
    try:
        with grpo(
            args,
            rollout_engine_kwargs={"mode": "server", "server_base_url": server.base_url},
        ) as model:
            return {"server start s": started, **train(model, 2)}
    finally:
        server.stop()


CHECKS = {"colocated": check_colocated, "sleep": check_sleep, "lora": check_lora, "served": check_served}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check.md"))
    parser.add_argument("--model", default="base", help="a built-in size")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--checks", nargs="+", default=list(CHECKS), choices=list(CHECKS))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: vllm_gpu_check.py checks vLLM on a GPU")
    lines = [f"\n## vLLM on the GPU ({args.model}, K=8 x G=8, {ENV['max_new_tokens']} new tokens)\n",
             "| check | result |", "|---|---|"]  # fmt: skip
    for name in args.checks:
        try:
            result = CHECKS[name](args)
            shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items())
        except Exception as error:  # a check that fails is recorded, and the next one runs
            shown = f"**failed**: {type(error).__name__}: {error}".replace("\n", " ")[:600]
            traceback.print_exc()
        lines.append(f"| {name} | {shown} |")
        print(lines[-1], flush=True)
    with args.out.open("a", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
