"""The report of ``learning_vs_trl.py``: held-out success per budget and per iteration count, ours' time to
reach TRL's success, the machine, and the plot (held-out success vs training seconds)."""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

from common import cpu_flags, cpu_name

MODES = ("sampled", "greedy")


LABELS = {"ours": "ours (grpo-gym GRPO)", "trl": "TRL GRPOTrainer"}


def points(runs: list[dict[str, Any]], scores: dict[str, dict[str, float]], kind: str, value: float) -> list[dict]:
    """Per seed, the snapshot that reached ``(kind, value)`` (a budget or an iteration count) with its scores."""
    found = []
    for run in runs:
        for snapshot in run["snapshots"]:
            if [kind, value] in [list(r) for r in snapshot["reached"]]:
                found.append({**snapshot, **scores[snapshot["path"]]})
    return found


def cell(values: list[float], percent: bool = True) -> str:
    """Mean, and the range over seeds when there are several."""
    if not values:
        return "–"
    show = (lambda x: f"{100 * x:.1f}%") if percent else (lambda x: f"{x:.0f}")
    spread = f" ({show(min(values))} – {show(max(values))})" if len(values) > 1 else ""
    return show(statistics.fmean(values)) + spread


def curve(runs, scores, budgets: list[float], start: float, mode: str) -> list[tuple[float, float]]:
    """(mean seconds, mean success) at 0 (the start model) and at each budget every seed reached."""
    out = [(0.0, start)]
    for budget in budgets:
        found = points(runs, scores, "budget", budget)
        if len(found) == len(runs):
            out.append((statistics.fmean(p["seconds"] for p in found), statistics.fmean(p[mode] for p in found)))
    return out


def time_to_reach(line: list[tuple[float, float]], target: float) -> float | None:
    """The first time the piecewise-linear curve reaches ``target`` (None: never within it)."""
    for (t0, y0), (t1, y1) in itertools.pairwise(line):
        if y1 >= target:
            return t0 if y0 >= target else t0 + (target - y0) / (y1 - y0) * (t1 - t0)
    return None


def tables(args: argparse.Namespace, runs: dict[str, list[dict]], scores: dict[str, dict[str, float]]) -> list[str]:
    """The equal-time and equal-iterations tables."""
    lines = [
        "| training time budget | ours sampled | TRL sampled | ours greedy | TRL greedy | ours iterations "
        "| TRL iterations |",
        "|---|---|---|---|---|---|---|",
    ]
    for budget in args.budgets:
        found = {name: points(runs[name], scores, "budget", budget) for name in runs}
        values = [cell([p[mode] for p in found[name]]) for mode in MODES for name in ("ours", "trl")]
        counts = [cell([p["iteration"] for p in found[name]], percent=False) for name in ("ours", "trl")]
        lines.append(f"| {budget:g} s | " + " | ".join(values + counts) + " |")
    lines += [
        "",
        "| iterations | ours sampled | TRL sampled | ours greedy | TRL greedy | ours seconds | TRL seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for count in args.iterations:
        found = {name: points(runs[name], scores, "iteration", count) for name in runs}
        values = [cell([p[mode] for p in found[name]]) for mode in MODES for name in ("ours", "trl")]
        seconds = [cell([p["seconds"] for p in found[name]], percent=False) for name in ("ours", "trl")]
        lines.append(f"| {count} | " + " | ".join(values + seconds) + " |")
    return lines


def verdict(args: argparse.Namespace, runs: dict[str, list[dict]], scores: dict[str, dict[str, float]]) -> str:
    """Ours' time to reach TRL's held-out success at the largest budget, as a share of TRL's time."""
    budget, parts = max(args.budgets), []
    for mode in MODES:
        theirs = curve(runs["trl"], scores, [budget], scores["start"][mode], mode)
        if len(theirs) < 2:
            return f"TRL did not reach the {budget:g}-s budget in every seed."
        (their_s, target) = theirs[-1]
        if target <= scores["start"][mode]:
            parts.append(f"{mode}: TRL is not above the start model at {budget:g} s ({100 * target:.1f}%)")
            continue
        reached = time_to_reach(curve(runs["ours"], scores, args.budgets, scores["start"][mode], mode), target)
        if reached is None:
            parts.append(f"{mode}: ours does not reach TRL's {100 * target:.1f}% within {budget:g} s")
        else:
            ratio = reached / their_s
            parts.append(f"{mode}: TRL's {100 * target:.1f}% after {reached:.0f} s, **{ratio:.2f}x** TRL's time")
    return (
        f"Ours' time to reach TRL's held-out success at {budget:g} s (mean over seeds, interpolated between the "
        f"snapshots; target: at most 0.5x): " + "; ".join(parts) + "."
    )


def plot(path: Path, args: argparse.Namespace, runs: dict[str, list[dict]], scores: dict[str, dict[str, float]]):
    """Held-out success vs training seconds, both frameworks, sampled and greedy (mean and range over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for axis, mode in zip(axes, MODES, strict=True):
        for name, color in (("ours", "C0"), ("trl", "C1")):
            line = curve(runs[name], scores, args.budgets, scores["start"][mode], mode)
            spread = [(scores["start"][mode],) * 2] + [
                (min(p[mode] for p in found), max(p[mode] for p in found))
                for found in (points(runs[name], scores, "budget", b) for b in args.budgets)
                if len(found) == len(runs[name])
            ]
            axis.plot(*zip(*line, strict=True), marker="o", color=color, label=LABELS[name])
            axis.fill_between([x for x, _ in line], *zip(*spread, strict=True), color=color, alpha=0.2)
        axis.set_title(f"held-out success, {mode}")
        axis.set_ylim(0, 1)
        axis.set_xlabel("training seconds")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel(f"success rate ({args.held_out} problems)")
    axes[0].legend()
    figure.savefig(path, dpi=120, bbox_inches="tight")


def settings_text(settings: dict[str, Any]) -> str:
    """``key value, ...``, the precision's description last."""
    text = ", ".join(f"{key} {value}" for key, value in settings.items() if key != "precision")
    return text + (f". Precision: {settings['precision']}" if "precision" in settings else "")


def report(args, start: dict[str, Any], runs: dict[str, list[dict]], scores: dict, load: tuple) -> str:
    """The markdown written to RESULTS.md."""
    versions, ours, theirs = runs["trl"][0]["versions"], runs["ours"][0]["settings"], runs["trl"][0]["settings"]
    per_run = "; ".join(
        f"{name}: " + ", ".join(f"{run['others']:.0%}" for run in runs[name]) for name in ("ours", "trl")
    )

    def speed(name: str) -> str:
        setup = statistics.fmean(run["setup_s"] for run in runs[name])
        per_iteration = statistics.fmean(run["train_s"] / max(run["iterations"], 1) for run in runs[name])
        return f"setup {setup:.1f} s, {per_iteration:.3f} s per iteration"

    same = all(a["first_problems"] == b["first_problems"] for a, b in zip(runs["ours"], runs["trl"], strict=True))
    return "\n".join(
        [
            f"Command: `python benchmarks/learning_vs_trl.py {' '.join(sys.argv[1:])}` "
            f"({datetime.date.today().isoformat()}).",
            "",
            f"trl {versions['trl']}, transformers {versions['transformers']}, torch {versions['torch']}, Python "
            f"{platform.python_version()}; {os.cpu_count()}-core {cpu_name()} (flags: {cpu_flags()}), no GPU; torch "
            f"threads {args.threads} in each process. Load average when the benchmark started: "
            f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}; share of the CPUs other processes used during each "
            f"run: {per_run} (only an idle machine gives comparable figures).",
            "",
            f"Start model: built-in tiny ({start['parameters'] / 1e6:.2f}M parameters) after a {args.sft_steps}-step "
            f"cold start ({start['sft_s']:.0f} s); env: {args.env_kwargs}. Held-out: {args.held_out} problems; "
            f"start model {100 * scores['start']['sampled']:.1f}% sampled, {100 * scores['start']['greedy']:.1f}% "
            f"greedy. Seeds: {args.seeds}. Same problem stream on the first iteration: {'yes' if same else 'NO'}.",
            "",
            f"Ours: {settings_text(ours)}; {speed('ours')}.",
            "",
            f"TRL: {settings_text(theirs)}; {speed('trl')}.",
            "",
            *tables(args, runs, scores),
            "",
            verdict(args, runs, scores),
            "",
            f"Plot: `{args.plot}`.",
        ]
    )
