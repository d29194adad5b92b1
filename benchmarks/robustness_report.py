"""The tables, the criteria and the plot of ``learning_robustness.py``."""

from __future__ import annotations

import platform
import shlex
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from common import cpu_flags, cpu_name
from learning_report import MODES

START_NAMES = {
    "a": "start a: built-in tiny after its cold start on arithmetic",
    "b": "start b: pretrained Llama (own character tokenizer) tuned on scratchpad addition",
    "c": "start c: a pretrained Llama (word-level character tokenizer) tuned 300 steps on carry addition",
}


def changes(results: list[dict[str, Any]], scores: dict[str, Any]) -> dict[tuple, dict[str, list[float]]]:
    """``(start, label, lr) -> {mode: [held-out change in points per seed, in seed order], "seconds": [...], ...}``."""
    arms: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in sorted(results, key=lambda r: r["seed"]):
        start = scores[run["start"]]
        final = start[run["snapshots"][-1]["path"]]
        arm = arms[(run["start"], run["label"], run["lr"])]
        for mode in MODES:
            arm[mode].append(100 * (final[mode] - start["start"][mode]))
        arm["seconds"].append(run["train_s"])
        arm["per_iteration"].append(run["train_s"] / max(run["iterations"], 1))
        arm["others"].append(run["others"])
    return arms


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):+.1f} ({min(values):+.1f} to {max(values):+.1f})"


def arm_table(arms: dict[tuple, dict[str, list[float]]], start: str) -> list[str]:
    lines = [
        "| arm | learning rate | seeds | greedy change: median | worst | best | seeds losing > 10 | sampled change: "
        "median (worst to best) | greedy change per seed (seed 0, 1, ...) | run time (s, mean) | s per iteration |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (s, label, lr), arm in sorted(arms.items(), key=lambda item: (item[0][2], item[0][1] != "ours", item[0][1])):
        if s != start:
            continue
        greedy = arm["greedy"]
        per_seed = " ".join(f"{value:+.1f}" for value in greedy)
        lines.append(
            f"| {label} | {lr:g} | {len(greedy)} | **{statistics.median(greedy):+.1f}** | {min(greedy):+.1f} | "
            f"{max(greedy):+.1f} | {sum(value < -10 for value in greedy)} | {_spread(arm['sampled'])} | {per_seed} | "
            f"{statistics.mean(arm['seconds']):.0f} | "
            f"{statistics.mean(arm['per_iteration']):.2f} |"
        )
    return lines


def criteria(arms: dict[tuple, dict[str, list[float]]], start: str) -> list[str]:
    """The issue's criteria per learning rate (greedy): ours' median >= TRL's, ours' worst >= TRL's worst - 2, and
    no seed of ours more than 5 points below its start."""
    lines = [
        "| learning rate | ours median vs TRL median | ours worst vs TRL worst - 2 | ours' worst seed >= -5 |",
        "|---|---|---|---|",
    ]
    for s, label, lr in sorted(arms):
        if s != start or label != "ours" or (s, "trl", lr) not in arms:
            continue
        ours, trl = arms[(s, "ours", lr)]["greedy"], arms[(s, "trl", lr)]["greedy"]
        median = statistics.median(ours) >= statistics.median(trl)
        worst = min(ours) >= min(trl) - 2
        floor = min(ours) >= -5
        lines.append(
            f"| {lr:g} | {statistics.median(ours):+.1f} vs {statistics.median(trl):+.1f}: {_mark(median)} | "
            f"{min(ours):+.1f} vs {min(trl) - 2:+.1f}: {_mark(worst)} | {min(ours):+.1f}: {_mark(floor)} |"
        )
    return lines if len(lines) > 2 else []  # no table when ours and TRL did not both run (``--variants-only``)


def _mark(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def report(
    args: Any, starts: dict[str, Any], results: list[dict[str, Any]], scores: dict[str, Any], load, seconds: float
) -> str:
    import torch
    import transformers
    import trl

    arms = changes(results, scores)
    others = [share for arm in arms.values() for share in arm["others"]]
    command = shlex.join(["python", "benchmarks/learning_robustness.py", *sys.argv[1:]])
    train_hours = sum(run["train_s"] for run in results) / 3600
    lines = [
        f"Command: `{command}`.",
        "",
        f"trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, Python "
        f"{platform.python_version()}; {len(__import__('os').sched_getaffinity(0))}-core {cpu_name()} (flags: "
        f"{cpu_flags()}), no GPU; {args.threads} torch thread(s) per run, {args.workers} run(s) at a time. Other "
        f"processes used {statistics.mean(others):.0%} of the CPUs during the runs (mean); the {len(results)} runs "
        f"trained for {train_hours:.1f} h in all (run time summed). This command took {seconds / 60:.0f} min (load "
        f"average at its start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}); runs and scores already in `--work` "
        "are reused.",
        "",
        f"K=4 x G=8, {args.iterations} iterations (optimizer steps) per run for both trainers, seeds "
        f"0-{args.seeds - 1}, beta 0, clip 0.2, gradient clip 0.5, temperature 1, top-p 0.92; held-out: "
        f"{args.held_out} problems (held-out seeds), scored by one evaluator outside both trainers (float32). "
        f"Ours' arguments beyond those: {args.ours or 'its defaults'}; TRL: GRPOConfig defaults "
        f"(loss_type dapo, AdamW weight decay 0){', ' + str(args.trl) if args.trl else ''}.",
        *_variant_lines(args.variants),
    ]
    for start in starts:
        start_scores = scores[start]["start"]
        built = starts[start]
        a = start == "a"
        if a:
            steps, spent = built["sft"]["cold_start_kwargs"]["steps"], built["sft_s"]
        else:
            steps, spent = built["steps"], built["seconds"]
        how = f"{steps} tuning steps in {spent:.0f} s, {built['parameters'] / 1e6:.2f}M parameters"
        lines += [
            "",
            f"**{START_NAMES[start]}** ({how}): held-out success {start_scores['greedy']:.1%} greedy, "
            f"{start_scores['sampled']:.1%} sampled.",
            "",
            *arm_table(arms, start),
            "",
            *criteria(arms, start),
        ]
    lines += [
        "",
        "Plots: `benchmarks/learning_robustness.png` (every run's greedy held-out change, median marked) and "
        "`benchmarks/learning_robustness_curves.png` (each run's per-iteration training success).",
    ]
    return "\n".join(lines)


def _variant_lines(variants: list[dict[str, Any]]) -> list[str]:
    """What each ``--variant`` arm is: ours with GRPO's defaults but for the shared settings and its own."""
    if not variants:
        return []
    lines = ["", "Variants (each trainer's defaults but for the shared settings above and these):", ""]
    for variant in variants:
        where = f"start {', '.join(variant['starts'])}, lr {', '.join(f'{lr:g}' for lr in variant['learning_rates'])}"
        who = "ours" if variant["trainer"] == "ours" else "TRL"
        lines.append(f"- `{variant['label']}` ({who}): {variant['settings'] or 'nothing else'} ({where})")
    return lines


def plot(path: Path, args: Any, results: list[dict[str, Any]], scores: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = changes(results, scores)
    starts = sorted({start for start, _, _ in arms})
    width = max(7.0, 0.75 * max(sum(key[0] == start for key in arms) for start in starts))  # per start: its arms
    figure, axes = plt.subplots(1, len(starts), figsize=(width * len(starts), 5), squeeze=False)
    for axis, start in zip(axes[0], starts, strict=True):
        keys = sorted((k for k in arms if k[0] == start), key=lambda k: (k[2], k[1] != "ours", k[1]))
        for x, key in enumerate(keys):
            values = arms[key]["greedy"]
            colour = "tab:blue" if key[1] == "ours" else "tab:orange" if key[1] == "trl" else "tab:green"
            axis.scatter([x] * len(values), values, color=colour, alpha=0.7)
            axis.hlines(statistics.median(values), x - 0.3, x + 0.3, color=colour)
        axis.axhline(0, color="grey", linewidth=0.8)
        axis.axhline(-5, color="grey", linewidth=0.8, linestyle=":")
        axis.set_xticks(range(len(keys)), [f"{label}\n{lr:g}" for _, label, lr in keys], fontsize=8, rotation=30)
        axis.set_ylabel("greedy held-out change (points)")
        axis.set_title(START_NAMES[start], fontsize=9)
    figure.suptitle(f"{args.iterations} iterations, {args.seeds} seeds per arm: every run, median marked")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plot_curves(path.with_name(path.stem + "_curves.png"), results)


def plot_curves(path: Path, results: list[dict[str, Any]], smooth: int = 5) -> None:
    """Each run's per-iteration training success (the rollouts' share of right answers, a running mean over
    ``smooth`` iterations), one panel per (start, learning rate, arm), seeds overlaid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    panels = sorted({(r["start"], r["lr"], r["label"]) for r in results if r.get("history")},
                    key=lambda k: (k[0], -k[1], k[2] != "ours", k[2]))  # fmt: skip
    if not panels:
        return
    columns = len({label for _, _, label in panels})
    rows = len({(start, lr) for start, lr, _ in panels})
    figure, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.6 * rows), squeeze=False, sharey=True)
    places = {}
    for start, lr, label in panels:
        row = sorted({(s, -rate) for s, rate, _ in panels}).index((start, -lr))
        places[(start, lr, label)] = axes[row][sum(1 for key in places if (key[0], key[1]) == (start, lr))]
    for key, axis in places.items():
        for run in (r for r in results if (r["start"], r["lr"], r["label"]) == key and r.get("history")):
            success = np.array([h["success"] for h in run["history"]])
            curve = np.convolve(success, np.ones(smooth) / smooth, mode="valid")
            axis.plot(np.arange(len(curve)) + smooth - 1, curve, linewidth=0.9, alpha=0.75)
        axis.set_title(f"start {key[0]}, lr {key[1]:g}: {key[2]}", fontsize=8)
        axis.set_ylim(0, 1)
        axis.tick_params(labelsize=7)
    for axis in axes.flat:
        if axis not in places.values():
            axis.set_visible(False)
    figure.supxlabel("iteration", fontsize=8)
    figure.supylabel(f"training success (mean of {smooth} iterations)", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
