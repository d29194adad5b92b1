"""Generation speed: this project's sampler against ``model.generate`` on the same model and batch.

One batch is a GRPO rollout: K=4 prompts x G=8 completions (each prompt repeated G times), the prompts of
``R1Zero-v0`` (arithmetic, ``template="compact"``) encoded with the built-in tokenizer and left-padded; the
model is a randomly initialised built-in Llama-style model. Both samplers use temperature 1, top-p 0.92 and
the built-in EOS; ``model.generate`` gets ``do_sample=True`` and the pad id. Rows stop at their EOS in both.
Tokens/s counts the generated tokens (each row up to and including its EOS), divided by the wall time of the
call; the calls alternate (ours, generate, ours, ...) after a warm-up call each, and the median is reported.

Rows: ``ours`` (the default decoder for this model: :class:`~algorithms.common.generation.decoders.LlamaDecoder`),
``ours, decoder="hf"`` (the same loop through the model's own forward, to separate the loop's gains from the
decoder's) and ``model.generate``. ``--no-eos`` makes every row run to ``--new-tokens`` (no EOS at all), which
isolates the cost per decoding step from how many rows end early.

Command (what ``benchmarks/RESULTS.md`` records)::

    python benchmarks/generation.py --model tiny --new-tokens 64 --results benchmarks/RESULTS.md
    python benchmarks/generation.py --model medium --new-tokens 256 --repeats 3 --results benchmarks/RESULTS.md
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
from common import busy_cpu_seconds, cpu_name, update_results

SECTION = "## Generation: our sampler vs model.generate (CPU)"
N_GROUPS, GROUP_SIZE = 4, 8


def prompts(seed: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """K distinct env prompts, each repeated G times, left-padded: ``(ids, mask, pad_id, eos_id)``."""
    import grpo_gym
    from algorithms.common.rollout.batch import left_pad

    env = grpo_gym.R1ZeroEnv(template="compact", difficulty=0.5)
    rows = []
    for k in range(N_GROUPS):
        observation, _ = env.reset(seed=seed + k)
        ids = torch.as_tensor(observation["input_ids"][observation["attention_mask"] == 1])
        rows.extend([ids] * GROUP_SIZE)
    ids, mask = left_pad(rows, env.codec.pad_id)
    return ids, mask, env.codec.pad_id, env.codec.eos_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=["tiny", "small", "medium", "base"])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per sampler")
    parser.add_argument("--no-eos", action="store_true", help="no EOS: every row runs to --new-tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", type=Path, help="write the table into this RESULTS.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from algorithms.common.generation.sampler import sample
    from algorithms.common.model.loading import count_parameters, load_model

    model = load_model(args.model, seed=args.seed).eval()
    ids, mask, pad_id, eos_id = prompts(args.seed)
    eos = [] if args.no_eos else [eos_id]
    generator = torch.Generator().manual_seed(args.seed)

    def ours(decoder: str) -> int:
        out = sample(model, ids, mask, max_new_tokens=args.new_tokens, eos_token_id=eos, pad_token_id=pad_id,
                     top_p=0.92, vocab_size=103, generator=generator, decoder=decoder)  # fmt: skip
        return int(out.lengths.sum())

    def hf_generate() -> int:
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_p=0.92, top_k=0,
                             temperature=1.0, max_new_tokens=args.new_tokens, min_new_tokens=0,
                             eos_token_id=eos_id if eos else None, pad_token_id=pad_id)  # fmt: skip
        new = out[:, ids.shape[1] :]
        if not eos:
            return new.numel()
        ended = (new == eos_id).cumsum(dim=1)
        return int(((ended == 0) | ((ended == 1) & (new == eos_id))).sum())  # tokens up to and including the EOS

    samplers = {"ours": lambda: ours("auto"), 'ours, decoder="hf"': lambda: ours("hf"), "model.generate": hf_generate}
    times: dict[str, list[float]] = {name: [] for name in samplers}
    tokens: dict[str, list[int]] = {name: [] for name in samplers}
    busy_start, wall_start, cpu_start = busy_cpu_seconds(), time.perf_counter(), time.process_time()
    with torch.no_grad():
        for run in samplers.values():  # warm-up
            run()
        for _ in range(args.repeats):
            for name, run in samplers.items():
                start = time.perf_counter()
                tokens[name].append(run())
                times[name].append(time.perf_counter() - start)
    wall = time.perf_counter() - wall_start
    others = max(0.0, (busy_cpu_seconds() - busy_start) - (time.process_time() - cpu_start)) / (wall * os.cpu_count())

    speed = {name: statistics.median(n / t for n, t in zip(tokens[name], times[name], strict=True)) for name in times}
    lines = [
        f"Command: `python benchmarks/generation.py {' '.join(sys.argv[1:])}` ({datetime.date.today().isoformat()}).",
        "",
        f"torch {torch.__version__}, Python {platform.python_version()}; {os.cpu_count()}-core {cpu_name()}, no GPU; "
        f"{args.threads} torch threads. Model {args.model!r} ({count_parameters(model) / 1e6:.2f}M parameters), "
        f"K={N_GROUPS} x G={GROUP_SIZE} rows, prompt width {ids.shape[1]}, {args.new_tokens} new tokens"
        f"{', no EOS' if args.no_eos else ''}; {args.repeats} timed calls each, alternating. Other processes used "
        f"{others:.0%} of the CPUs meanwhile.",
        "",
        "| sampler | tokens/s (median) | s/call (median) | generated tokens/call (mean) | vs model.generate |",
        "|---|---|---|---|---|",
    ]
    for name in samplers:
        lines.append(
            f"| {name} | {speed[name]:,.0f} | {statistics.median(times[name]):.3f} | "
            f"{statistics.mean(tokens[name]):.0f} | {speed[name] / speed['model.generate']:.2f}x |"
        )
    body = "\n".join(lines)
    print(body)
    if args.results:
        title = f"`--model {args.model} --new-tokens {args.new_tokens}{' --no-eos' if args.no_eos else ''}`"
        update_results(args.results, SECTION, title, body)
        print(f"written to {args.results}")


if __name__ == "__main__":
    main()
