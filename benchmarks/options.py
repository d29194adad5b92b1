"""Algorithm options of issue 16 on the learning benchmark: vanilla GRPO vs GSPO vs dynamic sampling (refilling)
vs learnability-prioritised prompts vs all of them, judged on held-out problems per wall-clock second and per
completion.

- **Tasks**: the embedded default (built-in tiny model, built-in tokenizer, ``arithmetic``) and ``countdown``, both
  with the demo preset's env (compact template, 32 new tokens, difficulty 0.1, reward syntax 0.2 + task 0.8).
- **Start**: one shared cold start per task (``--sft-steps`` SFT steps of the tiny model on the task's gold
  solutions, seed 0); every run of that task starts from it.
- **Vanilla**: GRPO's constructor defaults (published GRPO: token ratios clipped at 0.2, sequence aggregation,
  beta 0.04, one epoch, K = 4 x G = 8) with the demo preset's learning rate (5e-5, the tiny model's), in two
  minibatches of 16 (``batch_size=16``) for every arm: with one update per rollout the update is on-policy, every
  ratio is 1 and GSPO with sequence aggregation is exactly GRPO; the second minibatch makes the ratio matter.
- **Arms**: ``gspo`` (``importance_level="sequence"``, the paper's clip 3e-4 / 4e-4), ``dynamic sampling``
  (``dynamic_sampling=True``, 3 refill rounds), ``learnability`` (``prompt_sampling="learnability"``, pool 256,
  a quarter fresh), ``all`` (the three + ``mask_truncated=True``).
- **Budget**: ``--seconds`` of training per run (the clock pauses while a snapshot is evaluated), snapshots at
  ``--checkpoints`` equal steps of it, each scored on the same ``--held-out`` problems (sampled, seed 0).
  ``--seeds`` seeds per arm. Runs go one after the other in this process, with one torch thread: on the
  2-core machine shared with other jobs (load average 6-10), two threads made a GRPO iteration about 10x slower
  (OpenMP threads spin-waiting for each other), one thread ran the cold start 3x and GRPO 10x faster.

Command (what ``benchmarks/RESULTS.md`` records; about 35 minutes on 2 cores shared with other jobs)::

    python benchmarks/options.py --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import cpu_flags, cpu_name, others_share, update_results, usage

SECTION = "## Algorithm options: GSPO, dynamic sampling, learnability-prioritised prompts"
ENV = {"template": "compact", "max_new_tokens": 32, "difficulty": 0.1,
       "reward_weights": {"syntax": 0.2, "consistency": 0.0, "task": 0.8}}  # fmt: skip
TASKS = {"arithmetic (embedded default)": {}, "countdown": {"task": "countdown"}}
BASE = {"learning_rate": 5e-5, "batch_size": 16}
ARMS: dict[str, dict[str, Any]] = {
    "vanilla": {},
    "gspo": {"importance_level": "sequence", "clip_range": 3e-4, "clip_range_high": 4e-4},
    "dynamic sampling": {"dynamic_sampling": True},
    "learnability": {"controls_kwargs": {"prompt_sampling": "learnability"}},
}
ARMS["all"] = {k: v for arm in list(ARMS.values())[1:] for k, v in arm.items()} | {"mask_truncated": True}


def make_env(task: dict[str, Any]):
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    import grpo_gym

    return DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**ENV, **task))])


def cold_start(task: dict[str, Any], steps: int, held_out: int) -> tuple[dict, dict[str, float], float]:
    """The task's shared start: the tiny model after ``steps`` SFT steps; its weights, held-out success and mean
    reward, seconds."""
    from algorithms import GRPO
    from algorithms.common.evaluation import evaluate_problems, held_out_problems

    env = make_env(task)
    sft = GRPO("TransformerPolicy", env, cold_start_kwargs={"steps": steps, "batch_size": 32, "learning_rate": 1e-3},  
               policy_kwargs={"model": "tiny"}, seed=0, device="cpu")  # fmt: skip
    start = time.perf_counter()
    sft.run_cold_start()
    seconds = time.perf_counter() - start
    result = evaluate_problems(sft.policy, env, held_out_problems(env, held_out, 0.1), seed=0)
    success = {"success": result.success_rate, "reward": result.mean_reward}
    return copy.deepcopy(sft.policy.model.state_dict()), success, seconds


def run(task: dict[str, Any], arm: dict[str, Any], seed: int, checkpoint: dict, args: argparse.Namespace) -> dict:
    """Train one arm from the shared start for ``args.seconds`` of training; held-out success at each snapshot."""
    from stable_baselines3.common.callbacks import BaseCallback

    from algorithms import GRPO
    from algorithms.common.evaluation import evaluate_problems, held_out_problems

    env = make_env(task)
    problems = held_out_problems(env, args.held_out, 0.1)
    model = GRPO("TransformerPolicy", env, cold_start=False, policy_kwargs={"model": "tiny"}, seed=seed,
                 device="cpu", **BASE, **arm)  # fmt: skip
    model.policy.model.load_state_dict(checkpoint)
    if model.ref_model is not None:
        model.ref_model.load_state_dict(checkpoint)
    marks = [args.seconds * (i + 1) / args.checkpoints for i in range(args.checkpoints)]
    snapshots: list[dict[str, float]] = []
    clock = {"start": 0.0, "paused": 0.0}

    class Clock(BaseCallback):
        def _on_training_start(self) -> None:
            clock["start"] = time.perf_counter()

        def _on_rollout_start(self) -> None:
            elapsed = time.perf_counter() - clock["start"] - clock["paused"]
            if marks and elapsed >= marks[0]:
                marks.pop(0)
                pause = time.perf_counter()
                result = evaluate_problems(model.policy, env, problems, seed=0)
                snapshots.append({"seconds": elapsed, "completions": model.num_timesteps,
                                  "success": result.success_rate, "reward": result.mean_reward})  # fmt: skip
                clock["paused"] += time.perf_counter() - pause

        def _on_step(self) -> bool:
            return bool(marks)

    before = usage()
    model.learn(10**9, callback=Clock())
    logged = model.logger.name_to_value
    return {"snapshots": snapshots, "iterations": model._iteration, "others": others_share(before, usage()),
            "frac_uniform": logged.get("rollout/frac_uniform_groups")}  # fmt: skip


def cell(values: list[float]) -> str:
    """Mean ± standard deviation over seeds, and the range."""
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    mean, low, high = (100 * statistics.fmean(values), 100 * min(values), 100 * max(values))
    return f"{mean:.1f} ± {100 * spread:.1f}% ({low:.0f} – {high:.0f})"


def table(name: str, runs: dict[str, list[dict]], start: dict[str, float]) -> list[str]:
    """One task's table: held-out success at the end, completions and iterations, and the verdict against vanilla."""
    vanilla = [r["snapshots"][-1]["success"] for r in runs["vanilla"]]
    lines = [
        f"**{name}** (cold start: held-out success {100 * start['success']:.1f}%, mean reward {start['reward']:.3f})",
        "",
        "| arm | held-out success at the end (mean ± sd, range) | held-out mean reward | completions | iterations "
        "| training s | success beyond vanilla's spread? |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, arm_runs in runs.items():
        final = [r["snapshots"][-1]["success"] for r in arm_runs]
        completions = statistics.fmean(r["snapshots"][-1]["completions"] for r in arm_runs)
        iterations = statistics.fmean(r["iterations"] for r in arm_runs)
        seconds = statistics.fmean(r["snapshots"][-1]["seconds"] for r in arm_runs)
        rewards = [r["snapshots"][-1]["reward"] for r in arm_runs]
        reward = f"{statistics.fmean(rewards):.3f} ({min(rewards):.3f} – {max(rewards):.3f})"
        if arm == "vanilla":
            verdict = "–"
        elif min(final) > max(vanilla):
            verdict = "better"
        elif max(final) < min(vanilla):
            verdict = "worse"
        else:
            verdict = "no (ranges overlap)"
        lines.append(
            f"| {arm} | {cell(final)} | {reward} | {completions:.0f} | {iterations:.1f} | {seconds:.0f} | {verdict} |"
        )
    return lines


def plot(results: dict[str, dict[str, list[dict]]], starts: dict[str, dict[str, float]], path: Path) -> None:
    """Held-out success against training seconds and against completions, mean over seeds, one panel per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(11, 4.2 * len(results)), squeeze=False)
    for row, (task, runs) in enumerate(results.items()):
        for col, key in enumerate(("seconds", "completions")):
            ax = axes[row][col]
            for arm, arm_runs in runs.items():
                x = [0.0] + [statistics.fmean(r["snapshots"][i][key] for r in arm_runs)
                             for i in range(len(arm_runs[0]["snapshots"]))]  # fmt: skip
                y = [starts[task]["success"]] + [statistics.fmean(r["snapshots"][i]["success"] for r in arm_runs)
                                      for i in range(len(arm_runs[0]["snapshots"]))]  # fmt: skip
                ax.plot(x, [100 * v for v in y], marker="o", label=arm, linewidth=2.5 if arm == "vanilla" else 1.3)
            ax.set_xlabel("training seconds" if key == "seconds" else "completions")
            ax.set_ylabel("held-out success (%), mean over seeds")
            ax.set_title(task)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="training seconds per run")
    parser.add_argument("--checkpoints", type=int, default=3, help="held-out evaluations per run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--held-out", type=int, default=100)
    parser.add_argument("--tasks", nargs="*", default=list(TASKS))
    parser.add_argument("--arms", nargs="*", default=list(ARMS))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (see the module docstring)")
    parser.add_argument("--results", type=Path)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    wall = time.perf_counter()
    results: dict[str, dict[str, list[dict]]] = {}
    starts: dict[str, dict[str, float]] = {}
    for task in args.tasks:
        checkpoint, starts[task], sft_seconds = cold_start(TASKS[task], args.sft_steps, args.held_out)
        print(f"{task}: cold start {sft_seconds:.0f} s, held-out {starts[task]}", flush=True)
        results[task] = {}
        for arm in args.arms:
            results[task][arm] = [run(TASKS[task], ARMS[arm], seed, checkpoint, args) for seed in range(args.seeds)]
            finals = [r["snapshots"][-1]["success"] for r in results[task][arm]]
            seconds = [round(r["snapshots"][-1]["seconds"]) for r in results[task][arm]]
            print(f"  {arm}: {', '.join(f'{s:.1%}' for s in finals)} ({seconds} s)", flush=True)
    minutes = (time.perf_counter() - wall) / 60
    others = statistics.fmean(r["others"] for runs in results.values() for arm in runs.values() for r in arm)
    iterations = statistics.fmean(r["iterations"] for runs in results.values() for arm in runs.values() for r in arm)
    here = Path(__file__).resolve().parent
    (here / "options_runs.json").write_text(json.dumps({"starts": starts, "results": results}))
    plot(results, starts, here / "options_curves.png")
    lines = [
        f"Command: `python benchmarks/options.py {' '.join(sys.argv[1:])}` ({datetime.date.today().isoformat()}), "
        f"{minutes:.0f} minutes in all.",
        "",
        f"torch {torch.__version__}, Python {platform.python_version()}; CPU {cpu_name()} ({cpu_flags()}), "
        f"{args.threads} torch thread(s), no GPU; other processes used {100 * others:.0f}% of the machine's CPUs "
        f"during the runs (a shared machine: seconds are noisy). Built-in tiny model, one shared {args.sft_steps}-step "
        f"cold start per task; then {args.seconds:g} s of GRPO training per run (K=4 x G=8, lr 5e-5, "
        f"batch_size 16, otherwise GRPO's defaults), {args.seeds} seeds per arm, held-out success on the same "
        f"{args.held_out} problems at difficulty 0.1 (sampled, seed 0) at {args.checkpoints} snapshots. The "
        f"budget is set so that the whole benchmark fits in about 35 minutes on 2 shared cores: {iterations:.1f} "
        "iterations per run on average, far too short to separate options whose effects the papers measure over "
        "hundreds to thousands of steps; it checks that every option runs end to end and what it costs.",
        "",
    ]
    for task, runs in results.items():
        lines += [*table(task, runs, starts[task]), ""]
    lines.append("![held-out success vs seconds and completions](options_curves.png)")
    body = "\n".join(lines)
    print(body)
    if args.results:
        title = f"`--seconds {args.seconds:g} --seeds {args.seeds}`"
        update_results(args.results, SECTION, title, body)
        print(f"written to {args.results}")


if __name__ == "__main__":
    main()
