"""The `tools` preset, with the calculator and without it: held-out success at difficulties 0.5 and 1.0 before and
after GRPO, per seed, and the time each run took.

Each run is ``grpo-gym train --preset tools --seed S`` in its own process (the "without" arm: the same preset with
``tools`` removed from ``env_kwargs``, so the cold start trains on the step-by-step gold reasoning instead); the
tables it prints are parsed. The machine is shared, so each run also records the share of the CPUs other processes
used while it ran.

    python benchmarks/tools_preset.py --seeds 0 1 2 3 4 --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from common import busy_cpu_seconds, cpu_flags, cpu_name, update_results

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^(before GRPO|after GRPO)\s+([\d.]+)\s+(\d+)\s+([\d.]+)%\s+(-?[\d.]+)\s+([\d.]+)", re.MULTILINE)
TIME = re.compile(r"time: cold start (\d+) s, GRPO (\d+) s, total (\d+) s")
SECTION = "## Episodes with tools"


def preset_env_kwargs() -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "zoo_configs" / "grpo.yml").read_text())
    return dict(document["R1Zero-v0-tools"]["env_kwargs"])


def run(arm: str, seed: int, threads: int, extra: list[str], logs: Path) -> dict[str, Any]:
    """One ``grpo-gym train --preset tools`` run (its output in ``logs/<arm>_seed<seed>.log``); its tables, times
    and the others' CPU share."""
    arguments = ["train", "--preset", "tools", "--seed", str(seed), "--no-progress-bar", "--checkpoint-every", "0"]
    overrides = list(extra)
    if arm == "without":
        kwargs = {k: v for k, v in preset_env_kwargs().items() if k != "tools"}
        overrides.append(f"env_kwargs:{kwargs!r}")
    if overrides:
        arguments += ["-params", *overrides]
    command = [sys.executable, "-m", "algorithms.cli", *arguments, "--checkpoint-dir", tempfile.mkdtemp()]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    wall0, machine0, children0 = time.perf_counter(), busy_cpu_seconds(), _children_cpu()
    log = logs / f"{arm}_seed{seed}.log"
    with log.open("w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, check=False, cwd=ROOT).returncode
    wall, machine, own = time.perf_counter() - wall0, busy_cpu_seconds() - machine0, _children_cpu() - children0
    output = log.read_text()
    if code != 0:
        sys.stderr.write(output[-4000:])
        raise SystemExit(f"the {arm} run of seed {seed} failed (exit {code}); its output: {log}")
    rows = [
        {"stage": m[1], "difficulty": float(m[2]), "n": int(m[3]), "success": float(m[4]) / 100, "reward": float(m[5])}
        for m in ROW.finditer(output)
    ]
    times = TIME.search(output)
    return {
        "arm": arm,
        "seed": seed,
        "rows": rows,
        "sft_s": int(times[1]),
        "grpo_s": int(times[2]),
        "total_s": int(times[3]),
        "wall_s": wall,
        "cpu_s": own,
        "others_share": max(0.0, machine - own) / (wall * (os.cpu_count() or 1)),
        "command": "grpo-gym " + " ".join(arguments),
    }


def _children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


def success(run: dict[str, Any], stage: str, difficulty: float) -> float:
    """A run's held-out success at ``stage`` ("before GRPO" / "after GRPO") and ``difficulty``."""
    return next(row["success"] for row in run["rows"] if (row["stage"], row["difficulty"]) == (stage, difficulty))


def table(runs: list[dict[str, Any]]) -> str:
    """Median (worst) held-out success over the seeds, per arm, stage and difficulty."""
    lines = ["| calculator | stage | difficulty 0.5 | difficulty 1.0 |", "|---|---|---|---|"]
    for arm in ("with", "without"):
        mine = [r for r in runs if r["arm"] == arm]
        for stage in ("before GRPO", "after GRPO") if mine else ():
            cells = []
            for difficulty in (0.5, 1.0):
                values = [success(r, stage, difficulty) for r in mine]
                cells.append(f"{100 * statistics.median(values):.1f}% ({100 * min(values):.1f}%)")
            label = "after the cold start" if stage == "before GRPO" else "after GRPO"
            lines.append(f"| {arm} | {label} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def per_run(runs: list[dict[str, Any]]) -> str:
    """One line per run: success before -> after at each difficulty, the times, the others' CPU share."""
    header = "| calculator | seed | d 0.5 before -> after | d 1.0 before -> after | cold start s | GRPO s | run s |"
    lines = [header + " CPU s | others' CPU share |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        cells = [
            f"{100 * success(r, 'before GRPO', d):.1f}% -> {100 * success(r, 'after GRPO', d):.1f}%" for d in (0.5, 1.0)
        ]
        times = f"{r['sft_s']} | {r['grpo_s']} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} | {100 * r['others_share']:.0f}%"
        lines.append(f"| {r['arm']} | {r['seed']} | {cells[0]} | {cells[1]} | {times} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0], help="seeds to run (none: report --runs)")
    parser.add_argument("--arms", nargs="+", choices=("with", "without"), default=["with", "without"])
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each run")
    parser.add_argument("-params", dest="params", nargs="*", default=[], help="overrides for every run")
    parser.add_argument("--runs", default=None, help="JSON file the runs are appended to (and read back from)")
    parser.add_argument("--logs", default=".", help="folder for each run's output")
    parser.add_argument("--results", default=None, help="write the section into this RESULTS.md")
    args = parser.parse_args()
    runs = json.loads(Path(args.runs).read_text()) if args.runs and Path(args.runs).exists() else []
    if not args.seeds and not runs:
        parser.error("no runs to report: pass --seeds to run some, or --runs FILE with runs saved by an earlier call")
    for seed in args.seeds:
        for arm in args.arms:
            runs.append(run(arm, seed, args.threads, args.params, Path(args.logs)))
            print(json.dumps(runs[-1]), flush=True)
            if args.runs:
                Path(args.runs).write_text(json.dumps(runs, indent=1))
    seeds = sorted({r["seed"] for r in runs})
    body = "\n\n".join(
        [
            f"Command: `python benchmarks/tools_preset.py --seeds {' '.join(str(s) for s in seeds)}` "
            f"({datetime.date.today()}); each run: `{runs[0]['command']}`.",
            f"Machine: {os.cpu_count()} cores of a {cpu_name()} ({cpu_flags()}), torch threads {args.threads}, one run "
            "at a time (the other processes' CPU share per run below). Each run takes "
            f"{max(r['wall_s'] for r in runs) / 60:.1f} minutes at most (cold start included); all "
            f"{len(runs)} took {sum(r['wall_s'] for r in runs) / 60:.1f}.",
            f"Held-out success ({runs[0]['rows'][0]['n']} problems per difficulty, sampled as in training), median "
            "(worst) over the seeds:",
            table(runs),
            "Per run:",
            per_run(runs),
        ]
    )
    print(body)
    if args.results:
        update_results(Path(args.results), SECTION, "The `tools` preset: with the calculator vs without", body)


if __name__ == "__main__":
    main()
