"""Time per multi-turn iteration with the KV cache kept across turns (``turn_cache=True``) and without it
(``turn_cache=False``: every later turn prefills its whole context), measured side by side in one run.

Two workloads, each GRPO on the built-in tiny model with K x G episodes on as many envs:

- ``feedback``: ``R1Zero-v0`` with ``max_turns`` answers per episode; a wrong answer gets the env's feedback and
  the model answers again (the untrained model is wrong, so every episode plays every turn);
- ``tools``: the ``tools`` preset's env (the calculator), after ``--sft-steps`` steps of the preset's cold start
  (batch 32, learning rate 2e-3), which teach the model to call the tool, so episodes play two turns.

The two settings alternate rollout by rollout on the same model from the same run state (the same problems and
sampler noise; no update, so both sample the same policy), so a shared machine's load falls on both alike. Reported:
the seconds of a rollout (sampling + env steps, every turn) and of its later turns' sampling, per setting (median
over the rollouts), and the share of the CPUs other processes used meanwhile.

    python benchmarks/multiturn.py --iterations 6 --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch as th

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from common import cpu_flags, cpu_name, others_share, update_results, usage
from stable_baselines3.common.callbacks import CallbackList

SECTION = "## Episodes with tools"
TITLE = "KV cache kept across turns: time per multi-turn iteration"


class GenerationTimer:
    """Wraps ``policy.generate``: the seconds of each call of a rollout (call 0: the first turns, in one batch when
    the envs hold every episode; the rest: the later turns) and the rows each sampled."""

    def __init__(self, policy: Any) -> None:
        self.calls: list[tuple[float, int]] = []
        self._generate = policy.generate
        policy.generate = self

    def __call__(self, ids: th.Tensor, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = self._generate(ids, *args, **kwargs)
        self.calls.append((time.perf_counter() - start, len(ids)))
        return out


def build(workload: str, args: argparse.Namespace) -> Any:
    from stable_baselines3.common.env_util import make_vec_env

    import grpo_gym  # noqa: F401  (registers R1Zero-v0)
    from algorithms import GRPO

    if workload == "feedback":
        env_kwargs = {"template": "compact", "max_new_tokens": 32, "context_length": 512, "max_turns": args.max_turns}
    else:
        env_kwargs = {"template": "compact", "max_new_tokens": 112, "context_length": 512, "difficulty": 0.5,
                      "tools": ["calculator"]}  # fmt: skip
    episodes = args.groups * args.group_size
    env = make_vec_env("R1Zero-v0", n_envs=episodes, env_kwargs=env_kwargs, seed=args.seed)
    sft_steps = args.sft_steps if workload == "tools" else 0
    return GRPO(
        "TransformerPolicy",
        env,
        n_groups=args.groups,
        group_size=args.group_size,
        cold_start_kwargs={"steps": sft_steps, "batch_size": 32, "learning_rate": 2e-3},
        policy_kwargs={"model": "tiny"},
        mixed_precision="no",
        seed=args.seed,
    )


def rollout_seconds(model: Any, setting: bool, timer: GenerationTimer) -> tuple[float, float, int]:
    """One rollout with ``turn_cache=setting``: its wall seconds, the seconds of its later turns' sampling and their
    completions."""
    model.turn_cache = setting
    timer.calls = []
    callback = CallbackList([])
    callback.init_callback(model)
    start = time.perf_counter()
    model.collect_rollouts(model.env, callback)
    seconds = time.perf_counter() - start
    later = timer.calls[1:]
    return seconds, sum(t for t, _ in later), sum(n for _, n in later)


def measure(workload: str, args: argparse.Namespace) -> dict[str, Any]:
    """Rollouts of ``workload`` with the cache kept and without, alternating; each pair from the same run state
    (problems and sampler noise)."""
    model = build(workload, args)
    model.start_run()
    if model.needs_cold_start():
        model.run_cold_start()
    timer = GenerationTimer(model.policy)
    times: dict[bool, list[tuple[float, float, int]]] = {True: [], False: []}
    begin = usage()
    for iteration in range(args.iterations):
        order = (True, False) if iteration % 2 == 0 else (False, True)
        state = model.get_run_state()
        for setting in order:
            model.set_run_state(*state)
            times[setting].append(rollout_seconds(model, setting, timer))
    share = others_share(begin, usage())
    result = {"workload": workload, "others_share": share}
    for setting, label in ((True, "cache"), (False, "fresh")):
        result[label] = {
            "rollout_s": statistics.median(t[0] for t in times[setting]),
            "later_s": statistics.median(t[1] for t in times[setting]),
            "later_completions": statistics.median(t[2] for t in times[setting]),
        }
    return result


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | later-turn completions / rollout | rollout s, fresh prefill | rollout s, KV cache kept | "
        "speed-up | later turns' sampling s, fresh | later turns' sampling s, cache | others' CPU share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        fresh, cache = r["fresh"], r["cache"]
        lines.append(
            f"| {r['workload']} | {cache['later_completions']:.0f} | {fresh['rollout_s']:.2f} | "
            f"{cache['rollout_s']:.2f} | {fresh['rollout_s'] / cache['rollout_s']:.2f}x | {fresh['later_s']:.2f} | "
            f"{cache['later_s']:.2f} | {100 * r['others_share']:.0f}% |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", choices=("feedback", "tools"), default=["feedback", "tools"])
    parser.add_argument("--iterations", type=int, default=6, help="rollouts per setting")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-turns", type=int, default=3, help="answers per feedback episode")
    parser.add_argument("--sft-steps", type=int, default=300, help="cold-start steps before the tools workload")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", default=None, help="write the table into this RESULTS.md")
    args = parser.parse_args()
    th.set_num_threads(args.threads)
    results = [measure(workload, args) for workload in args.workloads]
    body = "\n\n".join(
        [
            f"Command: `python benchmarks/multiturn.py {' '.join(sys.argv[1:])}` ({datetime.date.today()}); K x G = "
            f"{args.groups} x {args.group_size} episodes on as many envs, the built-in tiny model, torch threads "
            f"{args.threads}, the tools workload after a {args.sft_steps}-step cold start, median over "
            f"{args.iterations} rollouts per setting, the two settings alternating.",
            f"Machine: {os.cpu_count()} cores of a {cpu_name()} ({cpu_flags()}), shared (the others' CPU share below).",
            table(results),
        ]
    )
    print(body)
    if args.results:
        update_results(Path(args.results), SECTION, TITLE, body)


if __name__ == "__main__":
    main()
