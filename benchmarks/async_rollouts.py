"""Bounded staleness on a CPU: iterations per second and held-out change at equal wall-clock budgets, synchronous
GRPO (``max_staleness=0``) against ``max_staleness = 1, 2, 4`` and TRL's ``GRPOTrainer``, at the tiny and the mid
(``medium``) built-in sizes, over several seeds.

Every run is a worker of ``learning_vs_trl.py`` (its start model, clocks, snapshots, TRL settings and evaluation;
see its docstring), in a fresh interpreter with ``--threads`` torch threads (2: both cores; with ``max_staleness``
the producer and the update take one each, :mod:`algorithms.common.rollout.staleness`):

- **Start model**: per size, the built-in model (``--seed``) after the demo preset's cold start, saved as a Hugging
  Face folder every run of that size (and TRL) starts from.
- **Runs**: per size and seed, ours with ``max_staleness`` 0, 1, 2, 4 (GRPO's defaults otherwise, but the collapse
  guard off in every run, since it does not run with ``max_staleness >= 1``; ``--ours`` adds arguments to all) and
  TRL, in an order rotated by the seed. Snapshots at each ``--budgets`` second.
- **Figures**: iterations per second (iterations / training seconds: setup and snapshot writes left out), its ratio
  to the synchronous run of the same seed, and the held-out success change from the start model at each budget
  (greedy and sampled; median and worst over seeds), plus the share of the CPUs other processes used (only runs on an
  idle machine compare). The issue's target: ``k = 1`` at least 1.5x the synchronous iterations per second at the mid
  size, with a median held-out change at equal wall-clock at least as good.

Full measurement (what ``benchmarks/RESULTS.md`` records; about 4 hours on an idle 2-core machine: 2 sizes x 5 runs x
5 seeds x 240 s, plus the cold starts and the evaluations)::

    python benchmarks/async_rollouts.py --results benchmarks/RESULTS.md

Smoke run (one iteration of each run, tiny size only)::

    python benchmarks/async_rollouts.py --sizes tiny --seeds 1 --budgets 1 --iterations 1 --max-iterations 1 \\
        --held-out 4 --sft-steps 2

Needs the ``bench`` extra (``trl``, ``datasets``). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import cpu_name, run_worker, update_results
from learning_report import MODES
from learning_vs_trl import Settings, evaluate, make_env, run_ours, run_trl

SECTION = "## Bounded staleness: max_staleness vs synchronous GRPO and TRL (CPU)"
STALENESS = (0, 1, 2, 4)
SIZES = {"tiny": "tiny", "mid": "medium"}


@dataclass
class Run(Settings):
    """A worker's settings: ``learning_vs_trl``'s, with the built-in model size."""

    size: str = "tiny"


def start_model(settings: Run) -> dict[str, Any]:
    """The built-in model of ``settings.size`` after the cold start, saved to ``settings.folder``."""
    import torch

    from algorithms import GRPO
    from algorithms.common.model.loading import count_parameters

    torch.set_num_threads(settings.threads)
    model = GRPO("TransformerPolicy", make_env(settings, tokenizer=None), policy_kwargs={"model": settings.size},
                 seed=settings.seed, device="cpu", cold_start_kwargs=settings.sft)  # fmt: skip
    start = time.perf_counter()
    model.run_cold_start()
    seconds = time.perf_counter() - start
    model.save_pretrained(settings.folder)
    return {"sft_s": seconds, "parameters": count_parameters(model.policy.model)}


WORKERS = {"start": start_model, "ours": run_ours, "trl": run_trl, "evaluate": evaluate}


def label(k: int | None) -> str:
    return "TRL GRPOTrainer" if k is None else ("synchronous" if k == 0 else f"max_staleness={k}")


def size_report(size: str, start: dict[str, Any], runs: dict[int | None, list[dict]], scores: dict, args) -> str:
    """One size's table: iterations per second, the ratio to synchronous, held-out change at each budget."""
    base = scores["start"]
    header = ["run", "it/s (median, min-max)", "vs synchronous (median)"]
    header += [f"{mode} change at {b:g} s (median / worst)" for b in args.budgets for mode in MODES]
    lines = [f"### {size} ({start['parameters']:,} parameters; cold start {start['sft_s']:.0f} s)", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]  # fmt: skip
    synchronous = [run["iterations"] / run["train_s"] for run in runs[0]]
    for k, seeds in runs.items():
        speeds = [run["iterations"] / run["train_s"] for run in seeds]
        ratios = [mine / theirs for mine, theirs in zip(speeds, synchronous, strict=True)]
        row = [label(k), f"{statistics.median(speeds):.3f} ({min(speeds):.3f}-{max(speeds):.3f})",
               f"{statistics.median(ratios):.2f}x"]  # fmt: skip
        for budget in args.budgets:
            for mode in MODES:
                changes = [
                    scores[s["path"]][mode] - base[mode]
                    for run in seeds
                    for s in run["snapshots"]
                    if ["budget", budget] in [list(r) for r in s["reached"]]
                ]
                row.append(f"{100 * statistics.median(changes):+.1f} / {100 * min(changes):+.1f}" if changes else "-")
        lines.append("| " + " | ".join(row) + " |")
    others = max(run["others"] for seeds in runs.values() for run in seeds)
    lines += ["", f"Start: {100 * base['greedy']:.1f}% greedy, {100 * base['sampled']:.1f}% sampled on "
              f"{args.held_out} held-out problems; other processes used at most {others:.0%} of the CPUs."]  # fmt: skip
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    from algorithms.common.hyperparams import DEFAULT_CONFIG, load_hyperparams, parse_overrides

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["tiny", "mid"])
    parser.add_argument("--budgets", type=float, nargs="+", default=[60, 120, 240], help="training seconds")
    parser.add_argument("--iterations", type=int, nargs="+", default=[50], help="iteration counts (snapshots)")
    parser.add_argument("--max-iterations", type=int, default=4000, help="the most iterations of a run")
    parser.add_argument("--seeds", type=int, default=5, help="runs per configuration (seeds seed, seed+1, ...)")
    parser.add_argument("--seed", type=int, default=0, help="the start models' seed and the first run's")
    parser.add_argument("--held-out", type=int, default=200, help="held-out problems")
    parser.add_argument("--sft-steps", type=int, help="cold-start steps (default: the demo preset's)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each run")
    parser.add_argument("--staleness", type=int, nargs="+", default=list(STALENESS), help="max_staleness values")
    parser.add_argument("--no-trl", action="store_true", help="leave TRL's runs out")
    parser.add_argument("--ours", nargs="*", default=[], help="GRPO arguments for every run of ours, key=value")
    parser.add_argument("--results", type=Path, help="write the section into this RESULTS.md")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return args
    if 0 not in args.staleness:
        parser.error("--staleness must include 0: the synchronous run every ratio is taken against")
    demo = load_hyperparams(DEFAULT_CONFIG, "R1Zero-v0", "demo")
    args.env_kwargs = demo.get("env_kwargs", {})
    cold = demo["cold_start_kwargs"]  # the constructor's cold_start_kwargs, --sft-steps over its steps
    args.sft = {**cold, "steps": cold["steps"] if args.sft_steps is None else args.sft_steps}
    args.ours = parse_overrides(args.ours)
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](Run(**json.loads(args.settings)))))
        return
    sections = []
    configurations: list[int | None] = [*args.staleness, *([] if args.no_trl else [None])]
    for size in args.sizes:
        with tempfile.TemporaryDirectory(prefix="async_rollouts_") as tmp:
            base = Run(folder=os.path.join(tmp, "model"), out=tmp, seed=args.seed, threads=args.threads,
                       budgets=args.budgets, iterations=args.iterations, max_iterations=args.max_iterations,
                       env_kwargs=args.env_kwargs, sft=args.sft, held_out=args.held_out, size=SIZES[size])  # fmt: skip
            start = run_worker(__file__, "start", asdict(base))
            print(f"{size}: start model, cold start in {start['sft_s']:.0f} s", flush=True)
            runs: dict[int | None, list[dict]] = {k: [] for k in configurations}
            for index in range(args.seeds):
                shift = index % len(configurations)
                for k in configurations[shift:] + configurations[:shift]:
                    seed = args.seed + index
                    ours = {"collapse_guard": False, **args.ours, "max_staleness": k}  # no guard with k >= 1
                    worker, settings = ("trl", {}) if k is None else ("ours", {"ours": ours})
                    run = run_worker(__file__, worker, {**asdict(base), "seed": seed, **settings})
                    runs[k].append(run)
                    print(f"{size} {label(k)} seed {seed}: {run['iterations']} iterations in {run['train_s']:.0f} s "
                          f"(others used {run['others']:.0%} of the CPUs)", flush=True)  # fmt: skip
            paths = [s["path"] for seeds in runs.values() for run in seeds for s in run["snapshots"]]
            scores = run_worker(__file__, "evaluate", {**asdict(base), "paths": paths})
            sections.append(size_report(size, start, runs, scores, args))
    body = "\n\n".join([f"Machine: {cpu_name()}, {os.cpu_count()} CPUs, {args.threads} torch threads per run.",
                        *sections])  # fmt: skip
    print(body)
    if args.results:
        budgets = " ".join(f"{b:g}" for b in args.budgets)
        title = f"`--sizes {' '.join(args.sizes)} --budgets {budgets} --seeds {args.seeds}`"
        update_results(args.results, SECTION, title, body)
        print(f"written to {args.results}")


if __name__ == "__main__":
    main()
