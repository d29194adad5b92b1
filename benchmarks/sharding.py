"""Per-rank memory and time of a training step: one process, DDP and FSDP2 (issue 26), on the built-in models.

One step is what an update does with its batch, without the RL around it: the forward and backward of the language
model's loss on this rank's rows (``--rows`` sequences of ``--tokens`` random tokens in all, split over the
ranks, each rank's loss weighted by its share), the gradients combined over the ranks, clipping at norm 1 and an
AdamW step. The runs:

- ``1 process``: the unsharded model alone (``--threads`` threads, 1 by default: the same per process as the
  ranks', on a machine whose 2 cores other jobs share);
- ``DDP``: ``--processes`` processes with whole replicas, the gradients summed by the project's DDP reducer
  (:class:`~algorithms.common.runtime.distributed.GradientSync`); with ``--compute-dtype bf16`` the forward runs under
  autocast, as the project's DDP path does;
- ``FSDP2``: ``--processes`` processes, :func:`~algorithms.common.runtime.sharding.shard_model` (``bf16``: bf16
  compute, float32 master weights and reduction).

Per rank (the largest over the ranks): the **training state**, counted from the tensors this rank holds (its
parameters, their gradients and AdamW's state, i.e. its shards under FSDP2); the **process peak** (CPU: ``VmHWM``
minus the RSS after the imports; CUDA: ``torch.cuda.max_memory_allocated``), which adds activations, DDP's
gradient buckets and allocator slack; the median seconds of a step after one warm-up step, and tokens per second.
For FSDP2 also the **gather for sampling** (:func:`~algorithms.common.runtime.sharding.gathered_weights`): the
bytes of the full weights it materialises on each rank, the RSS (CPU) or allocated memory (CUDA) it added, and
its seconds.

On 2 CPU cores the processes share the cores: the times show the overhead of going multi-process and sharded,
not a speed-up; the header says how much of the machine other processes used meanwhile.

With ``--grpo`` the unit is a whole GRPO iteration instead (``GRPO(..., sharding=None | "fsdp")``: K=2 problems x G=4
completions of ``--tokens`` new tokens, beta 0.04, so a frozen reference too, one update over the rollout): per rank
the training state (the policy's parameters, gradients and AdamW state, and the reference's parameters, i.e. this
rank's shards under FSDP2), the process peak, and the median seconds of an iteration (sampling from the gathered
weights, scoring, the reference's log-probs, the update) after one warm-up iteration.

Commands (what ``benchmarks/RESULTS.md`` records; about 10 minutes each on 2 cores; ``benchmarks/gpu_check.sh`` runs
the CUDA variant)::

    python benchmarks/sharding.py --models small base --results benchmarks/RESULTS.md
    python benchmarks/sharding.py --grpo --models small base --tokens 32 --steps 3 --results benchmarks/RESULTS.md
    python benchmarks/sharding.py --device cuda --compute-dtype bf16 --models base --processes 1 --out figures.md
"""

from __future__ import annotations

import argparse
import contextlib
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import busy_cpu_seconds, cpu_flags, cpu_name, memory_mib, others_share, update_results

SECTION = "## Sharding: per-rank memory and time of a training step, DDP vs FSDP2"
GRPO_SECTION = "## Sharding: per-rank memory and time of a GRPO iteration, DDP vs FSDP2"
MiB = 2**20


def local_bytes(tensors) -> int:
    """The bytes this rank holds of ``tensors`` (a ``DTensor``: its shard)."""
    return sum(
        (t.to_local() if hasattr(t, "to_local") else t).numel() * t.element_size() for t in tensors if t is not None
    )


def usage() -> tuple[float, float, float]:
    """:func:`common.usage` counting the workers this script waited for as its own CPU time."""
    times = os.times()
    own = times.user + times.system + times.children_user + times.children_system
    return time.perf_counter(), own, busy_cpu_seconds()


def memory_now(device) -> float:
    """MiB in use now: RSS on the CPU, allocated memory on CUDA."""
    import torch

    return torch.cuda.memory_allocated(device) / MiB if device.type == "cuda" else memory_mib()["rss"]


def worker(settings: dict) -> None:
    """One run (one process, or one rank of a torchrun job); rank 0 prints every rank's figures as JSON."""
    import torch
    import torch.distributed as dist

    from algorithms.common.model.loading import BUILTIN_VOCAB_SIZE, load_model
    from algorithms.common.runtime.distributed import GradientSync
    from algorithms.common.runtime.sharding import clip_grad_norm, device_mesh, gathered_weights, shard_model

    torch.set_num_threads(settings["threads"])
    cuda = settings["device"] == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if "RANK" in os.environ:
        if cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    import transformers.models.llama.modeling_llama  # noqa: F401  (imported before the baseline reading)

    baseline = memory_mib()["rss"]
    dtype = {"no": None, "bf16": torch.bfloat16}[settings["compute_dtype"]]
    model = load_model(settings["model"], vocab_size=BUILTIN_VOCAB_SIZE, seed=0).to(device).eval()
    if settings["mode"] == "fsdp":
        shard_model(model, device_mesh(device), dtype)
    parameters = list(model.parameters())
    optimizer = torch.optim.AdamW(parameters, lr=1e-5)
    sync = GradientSync(parameters, world) if settings["mode"] == "ddp" and world > 1 else None
    autocast = settings["mode"] != "fsdp" and dtype is not None
    batch = torch.randint(2, BUILTIN_VOCAB_SIZE, (settings["rows"], settings["tokens"]), device=device,
                          generator=torch.Generator(device).manual_seed(0))  # fmt: skip
    rows = batch.chunk(world)[rank]
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    seconds, state = [], 0
    for _ in range(settings["steps"]):
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype) if autocast else contextlib.nullcontext():
            loss = model(input_ids=rows, labels=rows).loss * (len(rows) / len(batch))
        loss.backward()
        if sync is not None:
            sync.sync()
        clip_grad_norm(parameters, 1.0)
        optimizer.step()
        moments = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        state = local_bytes(parameters) + local_bytes(p.grad for p in parameters) + local_bytes(moments)
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) / MiB if cuda else memory_mib()["peak"] - baseline
    figures = {"state_mib": state / MiB, "peak_mib": peak, "step_s": statistics.median(seconds[1:]),
               "parameters": sum(p.numel() for p in parameters)}  # fmt: skip
    figures["tokens_per_s"] = batch.numel() / figures["step_s"]
    if settings["mode"] == "fsdp":
        figures.update(measure_gather(model, device, gathered_weights))
    everyone = [None] * world
    if dist.is_initialized():
        dist.all_gather_object(everyone, figures)
        dist.destroy_process_group()
    else:
        everyone = [figures]
    if rank == 0:
        print(json.dumps(everyone))


def grpo_worker(settings: dict) -> None:
    """One GRPO run (one process, or one rank of a torchrun job); rank 0 prints every rank's figures as JSON."""
    import torch
    import torch.distributed as dist
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    import grpo_gym
    from algorithms import GRPO
    from algorithms.common.runtime.sharding import gathered_weights

    torch.set_num_threads(settings["threads"])
    baseline = memory_mib()["rss"]
    env = DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(template="compact", max_new_tokens=settings["tokens"],
                                                          difficulty=0.3))])  # fmt: skip
    precision = {"no": "no", "bf16": "bf16"}[settings["compute_dtype"]]
    model = GRPO("TransformerPolicy", env, n_groups=2, group_size=4, beta=0.04, ent_coef=0.0, cold_start=False,
                 mixed_precision=precision, policy_kwargs={"model": settings["model"]}, seed=0,
                 sharding=settings["sharding"], device=settings["device"])  # fmt: skip
    marks: list[float] = []

    class Clock(BaseCallback):
        def _on_rollout_start(self) -> None:
            marks.append(time.perf_counter())

        def _on_step(self) -> bool:
            return True

    model.learn((settings["steps"] + 1) * 8, callback=Clock())  # the last rollout's start closes the last interval
    parameters = list(model.policy.parameters())
    moments = [v for s in model.policy.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    reference = list(model.ref_model.parameters()) if model.ref_model is not None else []
    state = local_bytes(parameters) + local_bytes(p.grad for p in parameters) + local_bytes(moments)
    state += local_bytes(reference)
    cuda = model.device.type == "cuda"
    peak = torch.cuda.max_memory_allocated(model.device) / MiB if cuda else memory_mib()["peak"] - baseline
    intervals = [b - a for a, b in itertools.pairwise(marks)][1:]  # after one warm-up iteration
    median = statistics.median(intervals)
    figures = {"state_mib": state / MiB, "peak_mib": peak, "step_s": median, "tokens_per_s": 8 / median,
               "parameters": sum(p.numel() for p in parameters)}  # fmt: skip
    if settings["sharding"] == "fsdp":
        figures.update(measure_gather(model.policy.model, model.device, gathered_weights))
    everyone = [None] * model._dist.world_size
    if dist.is_initialized():
        dist.all_gather_object(everyone, figures)
        dist.destroy_process_group()
    else:
        everyone = [figures]
    if model._dist.is_main:
        print(json.dumps(everyone))


def measure_gather(model, device, gathered_weights) -> dict:
    """What :func:`gathered_weights` costs on this rank: the full weights' bytes, the memory it added, its seconds."""
    import torch

    before = memory_now(device)
    start = time.perf_counter()
    with torch.no_grad(), gathered_weights(model):
        seconds = time.perf_counter() - start
        full = sum(p.numel() * p.element_size() for p in model.parameters()) / MiB
        added = memory_now(device) - before
    return {"gather_mib": full, "gather_added_mib": added, "gather_s": seconds}


def launch(settings: dict, processes: int) -> list[dict]:
    """Run one configuration in fresh processes (torchrun when sharded or several), return every rank's figures."""
    job = [__file__, "--worker", json.dumps(settings)]
    if processes == 1 and settings["mode"] in ("single", "grpo"):
        command = [sys.executable, *job]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", *job]
    done = subprocess.run(command, capture_output=True, text=True, check=False, env={**os.environ})
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise SystemExit(f"the {settings['mode']} run on {processes} process(es) failed")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(args: argparse.Namespace, model: str) -> str:
    """Run the configurations for ``model`` and format their figures."""
    cores = os.cpu_count() or 1
    base = {"model": model, "device": args.device, "compute_dtype": args.compute_dtype, "rows": args.rows,
            "tokens": args.tokens, "steps": args.steps}  # fmt: skip
    modes = {"single": {"mode": "single"}, "ddp": {"mode": "ddp"}, "fsdp": {"mode": "fsdp"}}
    if args.grpo:  # the same modes as GRPO(sharding=...)
        modes = {key: {"mode": "grpo", "sharding": "fsdp" if key == "fsdp" else None} for key in modes}
    runs = {}
    if args.device == "cpu":
        runs["1 process"] = launch({**base, **modes["single"], "threads": args.threads}, 1)
    threads = max(1, args.threads // args.processes) if args.device == "cpu" else 1
    runs[f"DDP, {args.processes} processes"] = launch({**base, **modes["ddp"], "threads": threads}, args.processes)
    runs[f"FSDP2, {args.processes} processes"] = launch({**base, **modes["fsdp"], "threads": threads}, args.processes)
    ddp = max(rank["state_mib"] for rank in runs[f"DDP, {args.processes} processes"])
    ddp_step = statistics.median(rank["step_s"] for rank in runs[f"DDP, {args.processes} processes"])
    parameters = runs[f"DDP, {args.processes} processes"][0]["parameters"]
    peak = "peak allocated (CUDA)" if args.device == "cuda" else "process peak above imports"
    unit, rate = ("iteration", "completions/s") if args.grpo else ("step", "tokens/s")
    work = (f"2 x 4 completions of at most {args.tokens} new tokens per iteration" if args.grpo
            else f"{args.rows} sequences x {args.tokens} tokens per step in all")  # fmt: skip
    lines = [
        f"Model `{model}` ({parameters / 1e6:.1f}M parameters), {work}, compute {args.compute_dtype}, median of "
        f"{args.steps - 1} {unit}s after 1 warm-up; device {args.device}, {cores} cores. Per rank: the largest over "
        "the ranks.",
        "",
        f"| run | training state per rank | vs DDP | {peak} | s/{unit} | vs DDP | {rate} | gather for sampling: "
        "full weights, memory added, seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, ranks in runs.items():
        state = max(rank["state_mib"] for rank in ranks)
        step = statistics.median(rank["step_s"] for rank in ranks)
        gather = "—"
        if "gather_mib" in ranks[0]:
            added = max(rank["gather_added_mib"] for rank in ranks)
            gather = f"{ranks[0]['gather_mib']:.0f} MiB, {added:.0f} MiB, {max(r['gather_s'] for r in ranks):.2f} s"
        peak_mib, tokens = max(r["peak_mib"] for r in ranks), statistics.median(r["tokens_per_s"] for r in ranks)
        lines.append(
            f"| {name} | {state:.0f} MiB | {state / ddp:.2f}x | {peak_mib:.0f} MiB | {step:.2f} | "
            f"{step / ddp_step:.2f}x | {tokens:.{2 if args.grpo else 0}f} | {gather} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["small", "base"])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--compute-dtype", default="no", choices=["no", "bf16"])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of the single process (split over ranks)")
    parser.add_argument("--results", type=Path, help="update this RESULTS.md")
    parser.add_argument("--out", type=Path, help="write the tables to this file")
    parser.add_argument("--grpo", action="store_true", help="time whole GRPO iterations instead of training steps")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        settings = json.loads(args.worker)
        (grpo_worker if settings["mode"] == "grpo" else worker)(settings)
        return
    import torch

    machine = (
        f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, nccl"
        if args.device == "cuda"
        else f"{cpu_name()} ({cpu_flags()}), no GPU, torch {torch.__version__}, gloo"
    )
    header = (
        f"Command: `python benchmarks/sharding.py {' '.join(sys.argv[1:])}` ({datetime.date.today().isoformat()}); "
        f"{machine}; Python {platform.python_version()}."
    )
    for model in args.models:
        start = usage()
        runs = table(args, model)
        noise = f"Other processes used {others_share(start, usage()):.0%} of the machine's CPUs meanwhile."
        body = f"{header} {noise if args.device == 'cpu' else ''}\n\n{runs}"
        print(body, flush=True)
        if args.results:
            update_results(
                args.results, GRPO_SECTION if args.grpo else SECTION, f"`--model {model}` on {args.device}", body
            )
        if args.out:
            with args.out.open("a") as out:
                out.write(f"{body}\n\n")


if __name__ == "__main__":
    main()
