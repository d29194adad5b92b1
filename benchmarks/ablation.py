"""Ablation of the seed's training controls: what each one is worth on R1Zero-v0 with the embedded default.

Every arm starts from one shared cold-start SFT checkpoint (the built-in tiny model after ``--sft-steps`` steps
on the task's gold solutions) and trains with GRPO for the same budget of completions (``--iterations`` x K x G),
with ``--seeds`` seeds per arm. Arms: ``vanilla`` (published GRPO: every control off), each control alone, and
``all`` (every control on, as the ``seed`` preset). The env: ``arithmetic`` with the compact template, 32 new
tokens, starting at difficulty 0.1, the reward 0.2 syntax + 0.2 consistency + 0.6 task (a non-zero reward-model
weight, so that the reward ramp has something to ramp).

Reported per arm: held-out success on the same 200 problems at difficulty 0.1 after training (mean and range
over seeds), the completions needed until the rollout success rate (averaged over the last 5 iterations) first
reached ``--target``, the final difficulty (it moves only under the curriculum), and wall time. Learning curves
(rollout success rate against completions, mean over seeds) go to ``benchmarks/ablation_curves.png``.

Command (what ``benchmarks/RESULTS.md`` records; about 15 minutes on 2 cores)::

    python benchmarks/ablation.py --iterations 150 --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import cpu_name, update_results

SECTION = "## Ablation of the original design's training controls"
WEIGHTS = {"syntax": 0.2, "consistency": 0.2, "task": 0.6}
ARMS: dict[str, dict] = {
    "vanilla": {},
    "competition coefficient": {"controls_kwargs": {"competition": "fixed"}},
    "adaptive competition": {"controls_kwargs": {"competition": "adaptive"}},
    "diversity guard": {"controls_kwargs": {"diversity_guard": True}},
    "sequential updates": {"controls_kwargs": {"update_mode": "sequential"}},
    "value baseline": {"advantage_baseline": "value", "value_head": True},
    "reward-model ramp": {"controls_kwargs": {"reward_ramp": True}},
    "protected rollouts": {"controls_kwargs": {"protected_rollouts": 3}},
    "curriculum": {"controls_kwargs": {"curriculum": True}},
    "replay 0.25": {"controls_kwargs": {"replay_ratio": 0.25}},
}
ARMS["all"] = {  # every arm's settings together (the controls merged), adaptive competition of the two
    "advantage_baseline": "value",
    "value_head": True,
    "controls_kwargs": {
        key: value for arm in list(ARMS.values())[1:] for key, value in arm.get("controls_kwargs", {}).items()
    }
    | {"competition": "adaptive"},
}


def make_env():
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    import grpo_gym

    kwargs = {"template": "compact", "max_new_tokens": 32, "difficulty": 0.1, "reward_weights": WEIGHTS}
    return DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**kwargs))])


def run_arm(arm: dict, seed: int, checkpoint: dict, args: argparse.Namespace) -> dict:
    """Train one arm from the shared checkpoint; return its curve, held-out success, final level and time."""
    from stable_baselines3.common.callbacks import BaseCallback

    from algorithms import GRPO
    from algorithms.common.evaluation import evaluate_problems, held_out_problems

    arm = dict(arm)
    policy_kwargs = {"model": "tiny", "value_head": arm.pop("value_head", False)}
    env = make_env()
    settings = {"n_groups": args.groups, "group_size": 8, "learning_rate": 5e-5, "beta": 0.04, "ent_coef": 0.0}
    model = GRPO("TransformerPolicy", env, cold_start=False, policy_kwargs=policy_kwargs, seed=seed, device="cpu",
                 **settings, **arm)  # fmt: skip
    model.policy.model.load_state_dict(checkpoint)
    if model.ref_model is not None:
        model.ref_model.load_state_dict(checkpoint)
    curve: list[float] = []

    class Record(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            infos = self.locals["rows"].infos
            curve.append(float(np.mean([info["is_success"] for info in infos])))

    start = time.perf_counter()
    model.learn(args.iterations * args.groups * 8, callback=Record())
    seconds = time.perf_counter() - start
    problems = held_out_problems(env, 200, 0.1)
    success = evaluate_problems(model.policy, env, problems, seed=0).success_rate
    return {"curve": curve, "success": success, "difficulty": env.get_attr("difficulty")[0], "seconds": seconds}


def completions_to_target(curve: list[float], per_iteration: int, target: float, window: int = 5) -> int | None:
    """Completions until the rolling mean (over ``window`` iterations) of the success rate first reaches target."""
    for end in range(window, len(curve) + 1):
        if np.mean(curve[end - window : end]) >= target:
            return end * per_iteration
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=150)
    parser.add_argument("--groups", type=int, default=8, help="K problems per iteration (G = 8)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--sft-steps", type=int, default=500)
    parser.add_argument("--target", type=float, default=0.5)
    parser.add_argument("--arms", nargs="*", default=list(ARMS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", type=Path)
    args = parser.parse_args()

    import torch

    from algorithms import GRPO
    from algorithms.common.evaluation import evaluate_problems, held_out_problems

    torch.set_num_threads(args.threads)
    env = make_env()
    sft = GRPO(
        "TransformerPolicy",
        env,
        cold_start_kwargs={"steps": args.sft_steps, "batch_size": 32, "learning_rate": 1e-3},
        policy_kwargs={"model": "tiny"},
        seed=0,
        device="cpu",
    )
    sft.run_cold_start()
    checkpoint = copy.deepcopy(sft.policy.model.state_dict())
    before = evaluate_problems(sft.policy, env, held_out_problems(env, 200, 0.1), seed=0).success_rate
    print(f"cold start: held-out success {before:.1%}", flush=True)

    results: dict[str, list[dict]] = {}
    for name in args.arms:
        results[name] = []
        for seed in range(args.seeds):
            results[name].append(run_arm(ARMS[name], seed, checkpoint, args))
            r = results[name][-1]
            print(f"{name} seed {seed}: success {r['success']:.1%}, {r['seconds']:.0f} s", flush=True)

    per_iteration = args.groups * 8
    vanilla = statistics.mean(r["success"] for r in results.get("vanilla", results[args.arms[0]]))
    lines = [
        f"Command: `python benchmarks/ablation.py {' '.join(sys.argv[1:])}` ({datetime.date.today().isoformat()}).",
        "",
        f"torch {torch.__version__}, Python {platform.python_version()}; {os.cpu_count()}-core {cpu_name()}, no GPU. "
        f"Built-in tiny model, one shared {args.sft_steps}-step cold start (held-out success {before:.1%}); then "
        f"{args.iterations} GRPO iterations of K={args.groups} x G=8 ({args.iterations * per_iteration} completions) "
        f"per run, lr 5e-5, beta 0.04, {args.seeds} seeds per arm. Held-out: 200 problems at difficulty 0.1, "
        f"sampled (temperature 1, top-p 0.92). Target for 'completions to target': rolling rollout success "
        f">= {args.target:.0%}.",
        "",
        "| arm | held-out success (mean) | range over seeds | vs vanilla | completions to target | final difficulty "
        "| wall time per run |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        successes = [r["success"] for r in runs]
        reached = [completions_to_target(r["curve"], per_iteration, args.target) for r in runs]
        reached_text = ", ".join("never" if n is None else f"{n}" for n in reached)
        level, seconds = statistics.mean(r["difficulty"] for r in runs), statistics.mean(r["seconds"] for r in runs)
        lines.append(
            f"| {name} | {statistics.mean(successes):.1%} | {min(successes):.1%} – {max(successes):.1%} | "
            f"{statistics.mean(successes) - vanilla:+.1%} | {reached_text} | "
            f"{level:.2f} | {seconds:.0f} s |"
        )
    here = Path(__file__).resolve().parent
    (here / "ablation_runs.json").write_text(json.dumps(results))  # the raw curves, to re-plot without re-running
    plot(results, per_iteration, here / "ablation_curves.png")
    body = "\n".join(lines) + "\n\n![ablation learning curves](ablation_curves.png)"
    print(body)
    if args.results:
        update_results(args.results, SECTION, f"`--iterations {args.iterations} --seeds {args.seeds}`", body)
        print(f"written to {args.results}")


def plot(results: dict[str, list[dict]], per_iteration: int, path: Path) -> None:
    """Rollout success rate against completions, mean over seeds, one line per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    colors = plt.get_cmap("tab20").colors
    for i, (name, runs) in enumerate(results.items()):
        curve = np.mean([r["curve"] for r in runs], axis=0)
        smooth = np.convolve(curve, np.ones(5) / 5, mode="valid")
        x = (np.arange(len(smooth)) + 5) * per_iteration
        color = {"vanilla": "tab:blue", "all": "black"}.get(name, colors[(2 * i + 2) % len(colors)])
        ax.plot(x, smooth, label=name, color=color, linewidth=2.5 if name in ("vanilla", "all") else 1.2)
    ax.set_xlabel("completions")
    ax.set_ylabel("rollout success rate (5-iteration mean, mean over seeds)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
