"""Does GRPO learn the same on vLLM? ``rollout_engine="vllm"`` (colocated) against our own sampler
(``"builtin"``) at the same settings, across seeds, judged by one evaluator on one held-out set (issue 33).

Reuses ``learning_robustness.py`` whole: its starts (``--start c``, the default: issue 30's pretrained Llama with its
word-level tokenizer, tuned 300 steps on carry addition, the start GRPO learns from; ``--start a``: the built-in tiny
model after the demo preset's cold start on ``arithmetic``), its runs (``run_ours`` of ``learning_vs_trl.py``: GRPO
with its defaults but beta 0, clip 0.2, gradient clip 0.5, K=4 x G=8, the same problem stream per seed) and its
evaluator (every run's final weights and the start scored on the same ``--held-out`` problems, greedy and sampled,
float32, through our policy). The two arms differ in ``rollout_engine`` alone (and so in ``sampler_correction="auto"``:
TIS on for vLLM); seeds 0 .. ``--seeds``-1 each. Each run is its own process, ``OMP_NUM_THREADS=--threads`` (vLLM's
threads and torch's share the cores).

The issue's criterion: vLLM's median and worst greedy held-out change within 2 points of the builtin sampler's.

Needs vLLM (``bash .ci/install_vllm.sh``; run with that venv's python). Results are kept in ``--work`` (runs and
scores are reused).

What RESULTS.md records (2 cores: about 15 min for start c, 7-10 min for each start a run)::

    .venv-vllm/bin/python benchmarks/learning_engines.py --work /tmp/le_c --workers 2 --threads 1 --start c \\
        --learning-rate 3e-5 --iterations 60 --ours ent_coef=0 --results benchmarks/RESULTS.md
    .venv-vllm/bin/python benchmarks/learning_engines.py --work /tmp/le_a --workers 2 --threads 1 --start a \\
        --learning-rate 1e-4 --results benchmarks/RESULTS.md
    .venv-vllm/bin/python benchmarks/learning_engines.py --work /tmp/le_a --workers 2 --threads 1 --start a \\
        --learning-rate 3e-5 --results benchmarks/RESULTS.md

Smoke run (a few minutes)::

    .venv-vllm/bin/python benchmarks/learning_engines.py --work /tmp/learning_engines_smoke --start a --iterations 2 \\
        --seeds 1 --held-out 10 --sft-steps-a 5
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import cpu_flags, cpu_name, update_results
from learning_robustness import SHARED_OURS, build_start, score, train
from robustness_report import changes

SECTION = "## Learning on vLLM: rollout_engine='vllm' (colocated) vs our sampler"
ARMS = {"builtin": {"rollout_engine": "builtin"}, "vllm": {"rollout_engine": "vllm"}}
TOLERANCE = 2.0  # points: the "within 2 points"


def runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every run: the two arms interleaved, seed by seed, at ``--learning-rate`` on ``--start``."""
    return [
        {"start": args.start, "label": label, "trainer": "ours", "lr": args.learning_rate, "seed": seed,
         "ours": {**SHARED_OURS, **engine, **args.ours}, "trl": {}}
        for seed in range(args.seeds) for label, engine in ARMS.items()
    ]  # fmt: skip


def report(args: argparse.Namespace, results: list[dict[str, Any]], scores: dict[str, Any], minutes: float) -> str:
    """The per-arm table (median, worst, best greedy change; sampled; seconds per iteration) and the criterion."""
    import torch

    arms = {label: arm for (_, label, _), arm in changes(results, scores).items()}
    try:
        import vllm

        versions = f"vLLM {vllm.__version__}, "
    except ImportError:
        versions = ""
    lines = [
        f"Command: `python benchmarks/learning_engines.py {' '.join(sys.argv[1:])}` "
        f"({datetime.date.today().isoformat()}; {minutes:.0f} min).",
        "",
        f"{versions}torch {torch.__version__}, Python {platform.python_version()}; {os.cpu_count()}-core "
        f"{cpu_name()} ({cpu_flags()}), no GPU; {args.workers} runs at a time, OMP_NUM_THREADS={args.threads}. "
        f"Start {args.start}, K=4 x G=8, {args.iterations} iterations, learning rate {args.learning_rate:g}, seeds "
        f"0-{args.seeds - 1}; held-out: {args.held_out} problems, greedy and sampled, one evaluator (float32).",
        "",
        "| engine | seeds | greedy change: median | worst | best | sampled: median | per seed (greedy) | s/iteration |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, arm in arms.items():
        greedy = arm["greedy"]
        lines.append(
            f"| {label} | {len(greedy)} | **{statistics.median(greedy):+.1f}** | {min(greedy):+.1f} | "
            f"{max(greedy):+.1f} | {statistics.median(arm['sampled']):+.1f} | "
            f"{' '.join(f'{v:+.1f}' for v in greedy)} | {statistics.mean(arm['per_iteration']):.2f} |"
        )
    if set(arms) == set(ARMS):
        ours, theirs = arms["builtin"]["greedy"], arms["vllm"]["greedy"]
        median = abs(statistics.median(theirs) - statistics.median(ours))
        worst = abs(min(theirs) - min(ours))
        met = "met" if median <= TOLERANCE and worst <= TOLERANCE else "not met"
        lines += ["", f"Criterion (vLLM within {TOLERANCE:g} points of builtin, greedy): median gap {median:.1f}, "
                      f"worst gap {worst:.1f}: **{met}**."]  # fmt: skip
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    from algorithms.common.hyperparams import parse_overrides

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/learning_engines"), help="kept between runs")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--held-out", type=int, default=200)
    parser.add_argument("--workers", type=int, default=1, help="runs at a time (vLLM's threads count too)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS and torch threads of each run")
    parser.add_argument(
        "--start",
        choices=("a", "c"),
        default="c",
        help="a: the built-in tiny model after its cold start; c: issue 30's pretrained Llama",
    )
    parser.add_argument("--sft-steps-a", type=int, default=500, help="start a's cold-start steps")
    parser.add_argument("--ours", nargs="*", default=[], help="more GRPO arguments for both arms, key=value")
    parser.add_argument("--results", type=Path, help="write the section into this RESULTS.md")
    args = parser.parse_args()
    args.ours = parse_overrides(args.ours)
    # what learning_robustness.build_start / train / score read
    args.sft_target_b, args.sft_max_steps_b, args.sft_steps_c = 0.62, 4000, 300
    return args


def main() -> None:
    args = parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the runs' (each its own process)
    (args.work / "runs").mkdir(parents=True, exist_ok=True)
    began = time.time()
    starts = {args.start: build_start(args, args.start)}
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(lambda run: train(args, run, starts), runs(args)))
    scores = {args.start: score(args, args.start, starts[args.start]["folder"], results)}
    body = report(args, results, scores, (time.time() - began) / 60)
    print(body)
    if args.results:
        title = f"start {args.start}, learning rate {args.learning_rate:g}, {args.iterations} iterations"
        update_results(args.results, SECTION, title, body)
        print(f"written to {args.results}")


if __name__ == "__main__":
    main()
