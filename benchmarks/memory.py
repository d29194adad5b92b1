"""Peak training memory of one GRPO update on the ~100M-parameter built-in model, with 1024-token sequences,
with and without mixed precision and gradient checkpointing every 4 layers (the seed's memory claims).

One update is what ``GRPO.train()`` does with a rollout: the reference model's forward (beta 0.04), the
policy's forward and backward through the GRPO loss, gradient clipping and an AdamW step. The batch: G=4
completions of 960 tokens to one 64-token prompt (1024 tokens per sequence), random tokens from the built-in
vocabulary (memory and time do not depend on which tokens). Each configuration runs in its own fresh process,
two updates (the first allocates AdamW's state), and reports:

- training memory: peak RSS (``VmHWM``) minus the RSS after the imports, i.e. weights, reference, gradients,
  optimizer state and the activations of the update — what the seed's "GB per 100M parameters" counts;
- the time of the second update.

On this CPU (no native bf16 instructions) bf16 autocast saves activation memory but its matmuls are emulated,
so the time column shows what that costs here; on a GPU with bf16 the same setting is faster, not slower.

Command (what ``benchmarks/RESULTS.md`` records; about 5 minutes on 2 cores)::

    python benchmarks/memory.py --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import cpu_flags, cpu_name, memory_mib, update_results

SECTION = "## Training memory of one update, ~100M parameters, 1024-token sequences"
CONFIGS = {  # name: (mixed_precision, gradient_checkpointing)
    "fp32": ("no", False),
    "checkpoint every 4 layers": ("no", 4),
    "bf16 autocast": ("bf16", False),
    "bf16 + checkpoint every 4 layers": ("bf16", 4),
}


def worker(config: str, args: argparse.Namespace) -> dict[str, float]:
    """One configuration in this (fresh) process: two updates, memory and time of the second."""
    import torch

    torch.set_num_threads(args.threads)
    imports = memory_mib()["rss"]
    from algorithms.common.generation.completion_pass import completion_log_probs
    from algorithms.common.model.gradient_checkpointing import checkpoint_every
    from algorithms.common.model.loading import count_parameters, load_model
    from algorithms.common.runtime.precision import DTYPES, autocast
    from algorithms.grpo.update import grpo_loss

    precision, every = CONFIGS[config]
    dtype = DTYPES.get(precision)
    policy = load_model(args.model, seed=0).eval()
    reference = load_model(args.model, seed=0).eval().requires_grad_(False)
    if every:
        checkpoint_every(policy, every)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    generator = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(3, 103, (1, args.prompt), generator=generator).expand(args.group, -1)
    prompt_mask = torch.ones_like(prompt_ids)
    completion_len = args.sequence - args.prompt
    completion_ids = torch.randint(3, 103, (args.group, completion_len), generator=generator)
    completion_mask = torch.ones_like(completion_ids, dtype=torch.bool)
    advantages = torch.randn(args.group, generator=generator)
    batch = (prompt_ids, prompt_mask, completion_ids, completion_mask)

    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        with torch.no_grad(), autocast(dtype, "cpu"):
            ref_log_probs, _ = completion_log_probs(reference, *batch, vocab_size=103)
        with autocast(dtype, "cpu"):
            log_probs, _ = completion_log_probs(policy, *batch, vocab_size=103)
        loss, _ = grpo_loss(log_probs, log_probs.detach(), ref_log_probs, advantages, completion_mask,
                                      clip_low=0.2, beta=0.04)  # fmt: skip
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    return {
        "training_mib": memory_mib()["peak"] - imports,
        "seconds": seconds[-1],
        "parameters": count_parameters(policy),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="base", help="built-in model (base: ~99M parameters)")
    parser.add_argument("--sequence", type=int, default=1024, help="tokens per sequence (prompt + completion)")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    parser.add_argument("--group", type=int, default=4, help="sequences per update (G completions of one prompt)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", type=Path, help="write the table into this RESULTS.md")
    parser.add_argument("--worker", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return

    results = {}
    for config in CONFIGS:
        command = [sys.executable, __file__, *sys.argv[1:], "--worker", config]
        command = [c for c in command if c != "--results" and c != str(args.results)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        results[config] = json.loads(done.stdout.strip().splitlines()[-1])
        print(config, results[config], flush=True)

    base = results["fp32"]
    per_100m = 1e8 / base["parameters"]
    lines = [
        f"Command: `python benchmarks/memory.py {' '.join(sys.argv[1:])}` ({datetime.date.today().isoformat()}).",
        "",
        f"Python {platform.python_version()}; {os.cpu_count()}-core {cpu_name()} (flags: {cpu_flags()}), no GPU; "
        f"{args.threads} torch threads. Model {args.model!r} ({base['parameters'] / 1e6:.1f}M parameters, 12 layers), "
        f"{args.group} sequences of {args.sequence} tokens ({args.prompt}-token prompt), reference forward + policy "
        "forward/backward + AdamW step; each configuration in a fresh process, the second of two updates timed.",
        "",
        "| configuration | training memory | vs fp32 | GiB per 100M parameters | update time | vs fp32 |",
        "|---|---|---|---|---|---|",
    ]
    for config, result in results.items():
        gib, saved = result["training_mib"] / 1024, result["training_mib"] / base["training_mib"] - 1
        lines.append(
            f"| {config} | {gib:.2f} GiB | {saved:+.1%} | {gib * per_100m:.2f} | {result['seconds']:.1f} s | "
            f"{result['seconds'] / base['seconds'] - 1:+.1%} |"
        )
    body = "\n".join(lines)
    print(body)
    if args.results:
        update_results(args.results, SECTION, f"`--model {args.model} --sequence {args.sequence}`", body)
        print(f"written to {args.results}")


if __name__ == "__main__":
    main()
