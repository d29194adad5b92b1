"""LoRA against full fine-tuning on CPU: trainable parameters, training memory and seconds per GRPO iteration at
the built-in ``medium`` (~25M) and ``base`` (~99M) sizes, and the sampler's speed with adapters against without.

Training rows: ``GRPO`` on ``R1Zero-v0`` arithmetic prompts (``template="compact"``), K x G completions per
iteration sampled in one batch, scored, one AdamW step on all of them, with the k3 KL penalty (beta 0.04) to
the reference: a frozen copy of the model for full fine-tuning, the same network with its adapters disabled for
LoRA (no copy). fp32, no cold start, no gradient checkpointing. LoRA: ``{"r": 16, "alpha": 32, "target_modules":
"all-linear"}``. Each row runs in its own fresh process, which imports everything first (peft included, in
both modes) and reports:

- training memory: peak RSS (``VmHWM``) minus the RSS after the imports, i.e. the weights, the reference,
  gradients, AdamW state, activations and the sampler's KV cache;
- the seconds per iteration (sampling + reward + update), the mean of ``--iterations`` iterations after one
  warm-up iteration.

Generation rows (``benchmarks/generation.py``'s setup): K=4 x G=8 rows, ``--gen-tokens`` new tokens, no EOS (every
row runs to the end, so both models generate the same number of tokens); the plain model and the same model
wrapped with LoRA adapters of nonzero weights (``init_lora_weights=False``) are called alternately after a
warm-up call each; the median seconds per call of each and their ratio. The fast decoder merges the adapters
into its weights once per call (``W + s * B @ A``), so a decoding step costs the same with LoRA as without.

The machine's other processes are measured (their share of the CPUs during each row) and stated: on a shared
2-core machine, they slow every row, so compare rows of one run, not across runs.

Command (what ``benchmarks/RESULTS.md`` records; about 10 minutes on an idle 2-core machine, several times that
when other workers keep it busy)::

    python benchmarks/lora.py --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import busy_cpu_seconds, cpu_flags, cpu_name, memory_mib, update_results

SECTION = "## LoRA vs full fine-tuning (CPU)"
LORA = {"r": 16, "alpha": 32, "target_modules": "all-linear"}


def _others(busy_start: float, wall_start: float, cpu_start: float) -> float:
    """The share of the machine's CPUs other processes used since the starts."""
    wall = max(time.perf_counter() - wall_start, 1e-9)
    mine = time.process_time() - cpu_start
    return max(0.0, (busy_cpu_seconds() - busy_start) - mine) / (wall * os.cpu_count())


def train_worker(size: str, mode: str, args: argparse.Namespace) -> dict[str, float]:
    """One training row in this (fresh) process."""
    import peft  # noqa: F401  (imported in both modes, so the memory after the imports compares)
    import torch

    import grpo_gym
    from algorithms import GRPO

    torch.set_num_threads(args.threads)
    imports = memory_mib()["rss"]
    env = grpo_gym.R1ZeroEnv(template="compact", max_new_tokens=args.new_tokens, difficulty=0.5)
    policy_kwargs = {"model": size, **({"lora": LORA} if mode == "LoRA" else {})}
    model = GRPO(
        "TransformerPolicy",
        env,
        n_groups=args.groups,
        group_size=args.group_size,
        beta=0.04,
        cold_start=False,
        learning_rate=1e-5,
        mixed_precision="no",
        seed=0,
        policy_kwargs=policy_kwargs,
    )
    parameters = list(model.policy.parameters())
    batch = args.groups * args.group_size
    model.learn(batch)  # warm-up iteration
    busy, wall, cpu = busy_cpu_seconds(), time.perf_counter(), time.process_time()
    model.learn(args.iterations * batch, reset_num_timesteps=False)
    seconds = (time.perf_counter() - wall) / args.iterations
    return {
        "trainable": sum(p.numel() for p in parameters if p.requires_grad),
        "parameters": sum(p.numel() for p in parameters),
        "reference_copy": model.ref_model is not None,
        "training_mib": memory_mib()["peak"] - imports,
        "seconds": seconds,
        "others": _others(busy, wall, cpu),
    }


def generation_worker(size: str, args: argparse.Namespace) -> dict[str, float]:
    """Median seconds per ``sample()`` call of the plain model and of the same model with LoRA adapters."""
    import torch
    from generation import prompts

    from algorithms.common.generation.sampler import sample
    from algorithms.common.model.loading import load_model
    from algorithms.common.model.lora import apply_lora

    torch.set_num_threads(args.threads)
    models = {
        "plain": load_model(size, seed=0).eval(),
        "LoRA": apply_lora(load_model(size, seed=0), {**LORA, "init_lora_weights": False}, seed=0).eval(),
    }
    ids, mask, pad_id, _ = prompts(0)
    generator = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {name: [] for name in models}
    tokens: dict[str, int] = {}

    def call(name: str) -> float:
        start = time.perf_counter()
        out = sample(models[name], ids, mask, max_new_tokens=args.gen_tokens, eos_token_id=[], pad_token_id=pad_id,
                     top_p=0.92, vocab_size=103, generator=generator)  # fmt: skip
        tokens[name] = int(out.lengths.sum())
        return time.perf_counter() - start

    for name in models:  # warm-up
        call(name)
    busy, wall, cpu = busy_cpu_seconds(), time.perf_counter(), time.process_time()
    for _ in range(args.repeats):
        for name in models:
            times[name].append(call(name))
    medians = {name: statistics.median(seconds) for name, seconds in times.items()}
    return {
        "plain_s": medians["plain"],
        "lora_s": medians["LoRA"],
        "ratio": medians["LoRA"] / medians["plain"],
        "tokens": tokens["plain"],
        "others": _others(busy, wall, cpu),
    }


def run_worker(*extra: str) -> dict[str, float]:
    argv = [a for a in sys.argv[1:]]
    if "--results" in argv:
        index = argv.index("--results")
        del argv[index : index + 2]
    done = subprocess.run([sys.executable, __file__, *argv, *extra], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"worker {extra} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(args: argparse.Namespace, size: str, training: dict, generation: dict, load: str) -> str:
    """The RESULTS.md subsection of one model size."""
    batch = f"K={args.groups} x G={args.group_size}"
    lines = [
        f"Command: `python benchmarks/lora.py {' '.join(sys.argv[1:])}` ({datetime.date.today().isoformat()}).",
        "",
        f"Python {platform.python_version()}; {os.cpu_count()}-core {cpu_name()} (flags: {cpu_flags()}), no GPU, "
        f"shared with other workers (`uptime` before the run: {load}); {args.threads} torch threads. GRPO on "
        "R1Zero-v0 (compact template), "
        f"{batch} completions of up to {args.new_tokens} tokens per iteration, beta 0.04, fp32; LoRA r=16, alpha=32, "
        f"all linear layers. Seconds: the mean of {args.iterations} timed iteration(s) after a warm-up one; "
        'memory: peak RSS minus RSS after the imports; each row a fresh process. "Others": the share of the CPUs '
        "other processes used during the row.",
        "",
        "| model | fine-tuning | trainable parameters | reference copy | training memory | s / iteration | others |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode, r in training.items():
        lines.append(
            f"| {size} ({r['parameters'] / 1e6:.1f}M) | {mode} | {r['trainable'] / 1e6:.2f}M "
            f"({r['trainable'] / r['parameters']:.1%}) | {'yes' if r['reference_copy'] else 'no'} | "
            f"{r['training_mib']:.0f} MiB | {r['seconds']:.1f} | {r['others']:.0%} |"
        )
    full, lora = training["full"], training["LoRA"]
    lines.append(
        f"\nLoRA uses {lora['training_mib'] / full['training_mib']:.2f}x the training memory and "
        f"{lora['seconds'] / full['seconds']:.2f}x the time per iteration of full fine-tuning."
    )
    lines += [
        "",
        f"Generation (`sample()`, K=4 x G=8 rows, {args.gen_tokens} new tokens, no EOS, median of {args.repeats} "
        "alternating calls after a warm-up each; the LoRA model's adapters have nonzero weights):",
        "",
        "| model | plain s / call | LoRA s / call | LoRA / plain | others |",
        "|---|---|---|---|---|",
    ]
    r = generation
    lines.append(f"| {size} | {r['plain_s']:.2f} | {r['lora_s']:.2f} | {r['ratio']:.2f}x | {r['others']:.0%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["medium", "base"], choices=["tiny", "small", "medium", "base"])
    parser.add_argument("--groups", type=int, default=2, help="K: prompts per iteration")
    parser.add_argument("--group-size", type=int, default=4, help="G: completions per prompt")
    parser.add_argument("--new-tokens", type=int, default=32, help="the most tokens of a training completion")
    parser.add_argument("--iterations", type=int, default=1, help="timed iterations per training row")
    parser.add_argument("--gen-tokens", type=int, default=64, help="new tokens per generation call")
    parser.add_argument("--repeats", type=int, default=2, help="timed generation calls per model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", type=Path, help="write the tables into this RESULTS.md")
    parser.add_argument("--train-worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--generation-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.train_worker:
        print(json.dumps(train_worker(*args.train_worker, args)))
        return
    if args.generation_worker:
        print(json.dumps(generation_worker(args.generation_worker, args)))
        return

    for size in args.sizes:  # one subsection per size, written as soon as it is measured
        load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        print(load, flush=True)
        training = {}
        for mode in ("full", "LoRA"):
            training[mode] = run_worker("--train-worker", size, mode)
            print(size, mode, training[mode], flush=True)
        generation = run_worker("--generation-worker", size)
        print(size, "generation", generation, flush=True)
        body = table(args, size, training, generation, load.split("load average:")[-1].strip())
        print(body)
        if args.results:
            update_results(args.results, SECTION, f"`{size}`", body)
            print(f"written to {args.results}")


if __name__ == "__main__":
    main()
