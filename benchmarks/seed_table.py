"""The seed's comparison table measured on our tasks: PPO vs published GRPO vs the seed preset vs RLOO.

The seed claims, on SuperGLUE (not reachable offline): accuracy 82.3 / 85.7 / 86.1 %, training time 72 / 68 / 54 h and
sample efficiency 1.0 / 1.32 / 1.45 for a PPO baseline, GRPO and the "optimised" GRPO. Here, per task (the embedded
default ``arithmetic`` and ``countdown``): one shared cold start (the built-in tiny model after ``--sft-steps`` SFT
steps on the task's gold solutions), then each algorithm trains from it for the same budget of ``--completions``
completions, ``--seeds`` seeds each, at one learning rate (``--lr``) for all:

- ``PPO``: :class:`~algorithms.LMPPO` with its defaults (32 prompts x 1 completion per rollout, 4 epochs, per-token
  value head, GAE, KL 0.05 as a reward penalty);
- ``GRPO``: published GRPO, ``GRPO()``'s defaults (K=4 x G=8, beta 0.04), the zoo's default preset;
- ``seed preset``: ``zoo_configs/grpo.yml``'s ``R1Zero-v0-seed`` (every control of the seed on), but its cold start
  (the shared one) and its learning rate (the shared one);
- ``RLOO``: GRPO with ``advantage_baseline="leave_one_out"``, ``advantage_scale="none"``.

Reported: held-out success after training (mean and range over seeds, ``--eval-problems`` problems of the task at
its training difficulty, sampled at temperature 1, top-p 0.92), training wall time per run, peak resident memory
of the worker process that ran the arm's seeds, and sample efficiency as the seed defines it: the completions PPO needs
to reach a held-out success threshold (the cold start's success + ``--gain``) divided by the completions the
algorithm needs (so PPO is 1.0; linear interpolation on the seeds' mean held-out curve, measured at ``--evals``
points). A plot of held-out success vs completions goes to ``benchmarks/seed_table.png``, the raw curves to
``benchmarks/seed_table_runs.json``. Each arm runs in its own process (its own peak memory), one torch thread each
(two threads per process thrash on a 2-core machine shared with other jobs); the two tasks run side by side.

Command (what ``benchmarks/RESULTS.md`` records)::

    OMP_NUM_THREADS=1 python benchmarks/seed_table.py --completions 960 --evals 3 --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import cpu_name, memory_mib, run_worker, update_results
from learning_report import cell, time_to_reach

SECTION = "## The seed's comparison table: PPO vs GRPO vs the seed preset vs RLOO"
WEIGHTS = {"syntax": 0.2, "consistency": 0.2, "task": 0.6}  # the ablation's: the reward ramp has a weight to ramp
TASKS: dict[str, dict[str, Any]] = {
    "arithmetic": {"task": "arithmetic", "difficulty": 0.1},
    "countdown": {"task": "countdown", "difficulty": 0.1},
}
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "PPO": ("ppo", {}),
    "GRPO": ("grpo", {}),
    "seed preset": ("grpo", {"preset": "seed"}),
    "RLOO": ("grpo", {"advantage_baseline": "leave_one_out", "advantage_scale": "none"}),
}
#: the seed's figures, in the order PPO, GRPO, optimised GRPO (our seed preset)
SEED_S22 = {
    "PPO": ("82.3%", "72 h", "1.0"),
    "GRPO": ("85.7%", "68 h", "1.32"),
    "seed preset": ("86.1%", "54 h", "1.45"),
}


def make_env(task: str):
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    import grpo_gym

    kwargs = {"template": "compact", "max_new_tokens": 32, "reward_weights": WEIGHTS, **TASKS[task]}
    return DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**kwargs))])


def seed_preset() -> dict[str, Any]:
    """The ``seed`` preset's constructor arguments, without what the table sets for every arm."""
    from algorithms.common.hyperparams import DEFAULT_CONFIG, RUN_KEYS, load_hyperparams

    config = load_hyperparams(DEFAULT_CONFIG, "R1Zero-v0", "seed")
    return {k: v for k, v in config.items() if k not in (*RUN_KEYS, "sft_steps", "learning_rate")}


def build(arm: str, task: str, seed: int, args: dict[str, Any]):
    """The arm's model on a fresh env, its weights (and reference) set to the shared cold start."""
    import torch

    from algorithms import GRPO, LMPPO

    kind, settings = ARMS[arm]
    settings = seed_preset() if settings.get("preset") == "seed" else dict(settings)
    policy_kwargs = {"model": "tiny", **settings.pop("policy_kwargs", {})}
    common = {"learning_rate": args["lr"], "cold_start": False, "seed": seed, "device": "cpu"}
    algorithm = LMPPO if kind == "ppo" else GRPO
    model = algorithm("TransformerPolicy", make_env(task), policy_kwargs=policy_kwargs, **common, **settings)
    checkpoint = torch.load(args["checkpoint"], weights_only=True)
    model.policy.model.load_state_dict(checkpoint)
    if model.ref_model is not None:
        model.ref_model.load_state_dict(checkpoint)
    return model


def worker(settings: dict[str, Any]) -> dict[str, Any]:
    """One arm on one task, every seed in turn: the held-out curve, the final success and the training time (or,
    with ``cold_start`` in the settings, the task's cold start)."""
    import numpy as np
    import torch

    from algorithms.common.evaluation import evaluate_problems, held_out_problems

    torch.set_num_threads(settings["threads"])
    if settings.get("cold_start"):
        names = ("task", "sft_steps", "eval_problems", "folder")
        path, success = cold_start(*(settings[name] for name in names))
        return {"checkpoint": path, "success": success}
    task, arm = settings["task"], settings["arm"]
    eval_env = make_env(task)
    problems = held_out_problems(eval_env, settings["eval_problems"], TASKS[task]["difficulty"])
    runs = []
    for seed in range(settings["seeds"]):
        model = build(arm, task, seed, settings)
        points, seconds = [], 0.0
        for end in settings["points"]:
            start = time.perf_counter()
            model.learn(end - model.num_timesteps, reset_num_timesteps=model.num_timesteps == 0)
            seconds += time.perf_counter() - start
            success = evaluate_problems(model.policy, eval_env, problems, seed=0).success_rate
            points.append((model.num_timesteps, success))
        runs.append({"seed": seed, "points": points, "success": points[-1][1], "seconds": seconds})
        print(f"{task} {arm} seed {seed}: {points[-1][1]:.1%}, {seconds:.0f} s", file=sys.stderr, flush=True)
    return {"runs": runs, "peak_mib": memory_mib()["peak"], "mean": float(np.mean([r["success"] for r in runs]))}


def cold_start(task: str, steps: int, eval_problems: int, folder: str) -> tuple[str, float]:
    """The task's shared cold start: its weights' file and its held-out success."""
    import torch

    from algorithms import GRPO
    from algorithms.common.evaluation import evaluate_problems, held_out_problems

    env = make_env(task)
    sft = GRPO("TransformerPolicy", env, cold_start_kwargs={"steps": steps, "batch_size": 32, "learning_rate": 1e-3},  
               policy_kwargs={"model": "tiny"}, seed=0, device="cpu")  # fmt: skip
    sft.run_cold_start()
    path = Path(folder) / f"{task}.pt"
    torch.save(sft.policy.model.state_dict(), path)
    problems = held_out_problems(env, eval_problems, TASKS[task]["difficulty"])
    return str(path), evaluate_problems(sft.policy, env, problems, seed=0).success_rate


def run_task(task: str, args: argparse.Namespace, points: list[int], folder: str, began: float) -> tuple[float, dict]:
    """The task's cold start, then every arm from it in turn, each in a process of its own."""
    settings: dict[str, Any] = {"task": task, "eval_problems": args.eval_problems, "threads": args.threads}
    cold = run_worker(
        __file__,
        f"{task}/cold start",
        {**settings, "cold_start": True, "cold_start_kwargs": {"steps": args.sft_steps}, "folder": folder},
    )
    print(f"{task}: cold start {cold['success']:.1%} held-out ({time.perf_counter() - began:.0f} s)", flush=True)
    results = {}
    for arm in args.arms:
        arm_settings = {**settings, "arm": arm, "checkpoint": cold["checkpoint"], "points": points, "lr": args.lr}
        results[arm] = result = run_worker(__file__, f"{task}/{arm}", {**arm_settings, "seeds": args.seeds})
        print(f"{task} {arm}: {result['mean']:.1%} ({time.perf_counter() - began:.0f} s so far)", flush=True)
    return cold["success"], results


def mean_curve(runs: list[dict[str, Any]], start: float) -> list[tuple[float, float]]:
    """(completions, mean held-out success over seeds), from 0 (the cold start) to the end."""
    columns = zip(*(run["points"] for run in runs), strict=True)
    return [(0.0, start)] + [(float(c[0][0]), statistics.fmean(p[1] for p in c)) for c in columns]


def task_table(task: str, results: dict[str, dict], start: float, args: argparse.Namespace) -> list[str]:
    """The task's rows: success, wall time, peak memory, completions to the threshold and efficiency vs PPO."""
    target = start + args.gain
    reach = {arm: time_to_reach(mean_curve(r["runs"], start), target) for arm, r in results.items()}
    ppo = reach.get("PPO")
    lines = [
        f"**{task}** (cold start: {start:.1%} held-out; threshold {target:.1%})",
        "",
        "| algorithm | held-out success (mean, range over seeds) | vs cold start | completions to threshold "
        "| sample efficiency vs PPO | wall time per run | peak RSS | the seed's claim (accuracy, time, efficiency) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, result in results.items():
        successes = [run["success"] for run in result["runs"]]
        seconds = statistics.fmean(run["seconds"] for run in result["runs"])
        needed = "never" if reach[arm] is None else f"{reach[arm]:.0f}"
        if reach[arm] is None or ppo is None:
            efficiency = "–" if reach[arm] is None else "PPO never reached it"
        else:
            efficiency = f"{ppo / max(reach[arm], 1.0):.2f}"
        seed = " / ".join(SEED_S22.get(arm, ("–", "–", "–")))
        lines.append(
            f"| {arm} | {cell(successes)} | {statistics.fmean(successes) - start:+.1%} | {needed} | {efficiency} "
            f"| {seconds:.0f} s | {result['peak_mib']:.0f} MiB | {seed} |"
        )
    return lines


def _better(results: dict[str, dict], a: str, b: str) -> str:
    """Whether ``a``'s mean held-out success beats ``b``'s, and whether the seeds' ranges overlap."""
    if a not in results or b not in results:
        return ""
    ra, rb = ([run["success"] for run in results[x]["runs"]] for x in (a, b))
    verdict = "holds" if statistics.fmean(ra) > statistics.fmean(rb) else "does not hold"
    overlap = min(ra) <= max(rb) and min(rb) <= max(ra)
    return f"{a} > {b} in success {verdict}" + (" (within the seeds' spread)" if overlap else "")


def _faster(results: dict[str, dict], a: str, b: str) -> str:
    """Whether ``a`` trains faster than ``b`` for the same completions."""
    if a not in results or b not in results:
        return ""
    ta, tb = (statistics.fmean(run["seconds"] for run in results[x]["runs"]) for x in (a, b))
    return f"{a} faster than {b}: {'holds' if ta < tb else 'does not hold'} ({ta:.0f} s vs {tb:.0f} s)"


def reading(all_results: dict[str, dict[str, dict]]) -> list[str]:
    """The seed's ordering claims checked per task, by the means over seeds."""
    lines = []
    for task, results in all_results.items():
        claims = [_better(results, "GRPO", "PPO"), _better(results, "seed preset", "GRPO"),
                  _faster(results, "GRPO", "PPO"), _faster(results, "seed preset", "GRPO")]  # fmt: skip
        lines.append(f"- {task}: " + "; ".join(c for c in claims if c) + ".")
    return lines


def plot(all_results: dict[str, dict[str, dict]], starts: dict[str, float], path: Path) -> None:
    """Held-out success vs completions per task: the mean over seeds, the seeds' range shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(all_results), figsize=(6 * len(all_results), 4.5), squeeze=False)
    for ax, (task, results) in zip(axes[0], all_results.items(), strict=True):
        for arm, result in results.items():
            curve = mean_curve(result["runs"], starts[task])
            xs = [x for x, _ in curve]
            lows = [starts[task]] + [min(r["points"][i][1] for r in result["runs"]) for i in range(len(xs) - 1)]
            highs = [starts[task]] + [max(r["points"][i][1] for r in result["runs"]) for i in range(len(xs) - 1)]
            line = ax.plot(xs, [y for _, y in curve], marker="o", label=arm)[0]
            ax.fill_between(xs, lows, highs, color=line.get_color(), alpha=0.15)
        ax.set_title(task)
        ax.set_xlabel("completions")
        ax.set_ylabel("held-out success (mean over seeds, range shaded)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--completions", type=int, default=3200, help="training budget per run, in completions")
    parser.add_argument("--evals", type=int, default=4, help="held-out evaluations along each run (the last: the end)")
    parser.add_argument("--eval-problems", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--sft-steps", type=int, default=500)
    parser.add_argument("--lr", type=float, default=5e-5, help="one learning rate for every algorithm")
    parser.add_argument("--gain", type=float, default=0.05, help="threshold = cold-start success + gain")
    parser.add_argument("--tasks", nargs="*", default=list(TASKS))
    parser.add_argument("--arms", nargs="*", default=list(ARMS))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (2 thrash on a shared 2-core machine)")
    parser.add_argument("--results", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.settings))))
        return

    import torch

    began = time.perf_counter()
    points = [round(args.completions * (i + 1) / args.evals) for i in range(args.evals)]
    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(len(args.tasks)) as pool:  # the tasks side by side
        futures = {task: pool.submit(run_task, task, args, points, folder, began) for task in args.tasks}
        done = {task: future.result() for task, future in futures.items()}
    starts = {task: start for task, (start, _) in done.items()}
    all_results = {task: results for task, (_, results) in done.items()}
    minutes = (time.perf_counter() - began) / 60
    here = Path(__file__).resolve().parent
    (here / "seed_table_runs.json").write_text(json.dumps({"starts": starts, "results": all_results}))
    plot(all_results, starts, here / "seed_table.png")
    lines = [
        f"Command: `python benchmarks/seed_table.py {' '.join(sys.argv[1:])}` ({datetime.date.today().isoformat()}), "
        f"{minutes:.0f} minutes in all.",
        "",
        f"torch {torch.__version__}, Python {platform.python_version()}; {os.cpu_count()}-core {cpu_name()} shared "
        f"with other jobs, no GPU, {args.threads} thread per process, the two tasks run side by side (one process "
        "each at a time, so every wall time is measured beside one other run of the table). Built-in tiny model; "
        "per task one shared "
        f"{args.sft_steps}-step cold start; then {args.completions} completions per run, lr {args.lr} for every "
        f"algorithm, {args.seeds} seeds; held-out success on {args.eval_problems} problems at the training "
        f"difficulty, sampled (temperature 1, top-p 0.92), measured at {', '.join(map(str, points))} completions. "
        "Reward 0.2 syntax + 0.2 consistency + 0.6 task (the ablation's). The seed's column is its claim on "
        "SuperGLUE, PPO baseline / GRPO / optimised GRPO (our seed preset); RLOO is not in the seed.",
        "",
    ]
    for task in all_results:
        lines += [*task_table(task, all_results[task], starts[task], args), ""]
    lines += ["What the measurements say about the seed's claims (by the means over seeds):", "", *reading(all_results)]
    body = "\n".join(lines) + "\n\n![held-out success vs completions](seed_table.png)"
    print(body)
    if args.results:
        title = f"`--completions {args.completions} --seeds {args.seeds}`"
        update_results(args.results, SECTION, title, body)
        print(f"written to {args.results}")


if __name__ == "__main__":
    main()
