"""Model FLOPs utilisation of the GRPO update step: how far from this machine's matmul peak the update runs.

The update step is the policy's forward and backward through the GRPO loss on one rollout of K=4 prompts x
G=8 completions, the mid-size built-in model (``medium``, ~25M parameters), with completions of realistic
mixed lengths (sampled from the model itself, up to ``--new-tokens``). FLOPs count the matmuls of the real
tokens only, ``6 x (matmul parameters) x tokens`` (forward 2, backward 4; the input embedding is a lookup, the
tied output head a matmul; attention's score and value products are left out, so this is a lower bound),
where the tokens are each distinct prompt once plus every completion token, i.e. the work a padding-free,
prompt-sharing layout must do. The peak is measured on the same machine: the best of repeated 2048x2048
float32 ``torch.mm`` calls with the same threads.

MFU = FLOPs / time of the update / peak. It is reported for the default packed layout and for the padded
one-row-per-completion layout, which does the same useful FLOPs plus the padding's.

Command (what ``benchmarks/RESULTS.md`` records; about a minute)::

    python benchmarks/mfu.py --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import cpu_name, update_results
from generation import GROUP_SIZE, N_GROUPS, prompts

SECTION = "## Model FLOPs utilisation of the update step (CPU)"


def matmul_peak(threads: int, size: int = 2048, repeats: int = 10) -> float:
    """Best float32 matmul throughput of this machine, FLOP/s."""
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="medium")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from algorithms.common.generation.completion_pass import completion_log_probs
    from algorithms.common.generation.sampler import sample
    from algorithms.common.model.loading import count_parameters, load_model
    from algorithms.grpo.update import grpo_loss

    model = load_model(args.model, seed=0).eval()
    ids, mask, pad_id, eos_id = prompts(0)
    out = sample(model, ids, mask, max_new_tokens=args.new_tokens, eos_token_id=eos_id, pad_token_id=pad_id,
                 vocab_size=103, generator=torch.Generator().manual_seed(0))  # fmt: skip
    width = int(out.lengths.max())
    tokens, completion_mask = out.tokens[:, :width], out.mask[:, :width]
    advantages = torch.randn(len(ids), generator=torch.Generator().manual_seed(1))
    real_tokens = int(mask[::GROUP_SIZE].sum()) + int(completion_mask.sum())
    embedding = model.get_input_embeddings().weight.numel()
    matmul_parameters = count_parameters(model) - embedding + model.get_output_embeddings().weight.numel()
    flops = 6 * matmul_parameters * real_tokens

    def update(layout: str) -> float:
        start = time.perf_counter()
        log_probs, _ = completion_log_probs(model, ids, mask, tokens, completion_mask, vocab_size=103, layout=layout)
        loss, _ = grpo_loss(log_probs, log_probs.detach(), None, advantages, completion_mask, clip_low=0.2)
        model.zero_grad(set_to_none=True)
        loss.backward()
        return time.perf_counter() - start

    peak = matmul_peak(args.threads)
    seconds = {}
    for layout in ("packed", "padded"):
        update(layout)  # warm-up
    for layout in ("packed", "padded"):
        seconds[layout] = statistics.median(update(layout) for _ in range(args.repeats))
    padded_tokens = len(ids) * (ids.shape[1] + width)
    lines = [
        f"Command: `python benchmarks/mfu.py {' '.join(sys.argv[1:])}` ({datetime.date.today().isoformat()}).",
        "",
        f"torch {torch.__version__}, Python {platform.python_version()}; {os.cpu_count()}-core {cpu_name()}, no GPU; "
        f"{args.threads} torch threads. Model {args.model!r} ({count_parameters(model) / 1e6:.1f}M parameters, "
        f"{matmul_parameters / 1e6:.1f}M in matmuls); K={N_GROUPS} x G={GROUP_SIZE} completions sampled from the "
        f"model, mean {out.lengths.float().mean():.0f} and longest {width} tokens; {real_tokens} real tokens (each "
        f"prompt once), {padded_tokens} positions in the padded layout. Measured float32 matmul peak: "
        f"**{peak / 1e9:.0f} GFLOP/s**. Update = policy forward + backward, median of {args.repeats}.",
        "",
        "| layout | update time | useful FLOPs | achieved | MFU |",
        "|---|---|---|---|---|",
    ]
    for layout, time_s in seconds.items():
        lines.append(
            f"| {layout} | {time_s:.2f} s | {flops / 1e9:.0f} GFLOP | {flops / time_s / 1e9:.0f} GFLOP/s | "
            f"{flops / time_s / peak:.1%} |"
        )
    body = "\n".join(lines)
    print(body)
    if args.results:
        update_results(args.results, SECTION, f"`--model {args.model} --new-tokens {args.new_tokens}`", body)
        print(f"written to {args.results}")


if __name__ == "__main__":
    main()
