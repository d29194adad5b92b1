"""Group parallelism on this machine: 1 process against 2 ``gloo`` processes, side by side in one run.

The same GRPO job — the built-in ``small`` model (~4.7M parameters), K=4 problems x G=8 completions, 64 new
tokens, beta 0.04, ``R1Zero-v0`` arithmetic with the compact template — runs as one process with 2 torch
threads, then under ``torchrun --nproc_per_node=2`` with 1 thread per process (the same 2 cores), the second
time with each gradient compression. Reported: median seconds per iteration after warm-up; the share of the
update time spent combining gradients (``GradientSync.sync``: the DDP reducer's all-reduce, compression
included); the bytes each rank all-reduces per optimizer step.

On 2 cores the processes share the cores a single process already uses, so this measures the overhead of
going multi-process, not a speed-up; with one GPU per process the groups' generation and backward run in
parallel. The seed claims: "communication overhead -60%" from group parallelism and "32% -> 18%" of
time in communication with gradient compression.

Command (what ``benchmarks/RESULTS.md`` records; about 3 minutes)::

    python benchmarks/distributed.py --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import cpu_name, update_results

SECTION = "## Group parallelism: 1 vs 2 processes"
COMPRESSIONS = ["none", "fp16", "powersgd"]


def worker(args: argparse.Namespace) -> None:
    """One job (one process, or one rank of a torchrun job); rank 0 prints its figures as JSON."""
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    import grpo_gym
    from algorithms import GRPO

    torch.set_num_threads(args.threads)
    env = DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(template="compact", max_new_tokens=64, difficulty=0.3))])
    compression = None if args.compression == "none" else args.compression
    model = GRPO("TransformerPolicy", env, n_groups=4, group_size=8, beta=0.04, ent_coef=0.0, cold_start=False,
                 policy_kwargs={"model": args.model}, seed=0,
                 distributed_kwargs={"gradient_compression": compression})  # fmt: skip
    marks: list[float] = []
    train_seconds: list[float] = []
    train = model.train

    def timed_train() -> None:
        start = time.perf_counter()
        train()
        train_seconds.append(time.perf_counter() - start)

    model.train = timed_train

    class Clock(BaseCallback):
        def _on_rollout_start(self) -> None:
            marks.append(time.perf_counter())
            sync = model._parallel.sync  # DDP's reducer
            if len(marks) == args.warmup + 1 and sync is not None:  # count from the first timed iteration
                sync.seconds, sync.bytes, sync.steps = 0.0, 0, 0

        def _on_step(self) -> bool:
            return True

    total = (args.warmup + args.iterations + 1) * 32
    model.learn(total, callback=Clock())
    if not model._dist.is_main:
        return
    iterations = [b - a for a, b in itertools.pairwise(marks)][args.warmup :]
    sync = model._parallel.sync
    timed_train = sum(train_seconds[args.warmup :])  # the updates whose gradient combination was counted
    print(
        json.dumps(
            {
                "iteration_s": statistics.median(iterations),
                "comm_share": sync.seconds / timed_train if sync else 0.0,
                "comm_s": sync.seconds / sync.steps if sync else 0.0,
                "bytes_per_step": sync.bytes / sync.steps if sync else 0,
                "parameters": sum(p.numel() for p in model.policy.parameters()),
            }
        )
    )


def launch(args: argparse.Namespace, processes: int, compression: str) -> dict:
    threads = 2 // processes if processes <= 2 else 1
    job = [__file__, "--worker", "--model", args.model, "--iterations", str(args.iterations), "--warmup",
           str(args.warmup), "--threads", str(threads), "--compression", compression]  # fmt: skip
    if processes == 1:
        command = [sys.executable, *job]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", *job]
    done = subprocess.run(command, capture_output=True, text=True, check=False, env={**os.environ})
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise SystemExit(f"the {processes}-process run failed")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compression", default="none", choices=COMPRESSIONS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--results", type=Path)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    import torch

    runs = {"1 process, 2 threads": launch(args, 1, "none")}
    for compression in COMPRESSIONS:
        runs[f"2 processes, 1 thread each, compression {compression}"] = launch(args, 2, compression)
        print(runs, flush=True)
    single = runs["1 process, 2 threads"]["iteration_s"]
    plain = runs["2 processes, 1 thread each, compression none"]
    lines = [
        f"Command: `python benchmarks/distributed.py {' '.join(sys.argv[1:])}` ({datetime.date.today().isoformat()}).",
        "",
        f"torch {torch.__version__}, Python {platform.python_version()}; {os.cpu_count()}-core {cpu_name()}, no GPU; "
        f"gloo. Model {args.model!r} ({plain['parameters'] / 1e6:.1f}M parameters), K=4 x G=8, 64 new tokens; median "
        f"of {args.iterations} iterations after {args.warmup} warm-up.",
        "",
        "| run | s/iteration | vs 1 process | gradient combination per step | share of the update | bytes all-reduced "
        "per step and rank |",
        "|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        sent = f"{run['bytes_per_step'] / 2**20:.2f} MiB" if run["bytes_per_step"] else "—"
        comm = f"{run['comm_s'] * 1e3:.0f} ms" if run["comm_s"] else "—"
        share = f"{run['comm_share']:.1%}" if run["comm_s"] else "—"
        lines.append(
            f"| {name} | {run['iteration_s']:.2f} | {run['iteration_s'] / single:.2f}x | {comm} | {share} | {sent} |"
        )
    body = "\n".join(lines)
    print(body)
    if args.results:
        update_results(args.results, SECTION, f"`--model {args.model}`", body)
        print(f"written to {args.results}")


if __name__ == "__main__":
    main()
