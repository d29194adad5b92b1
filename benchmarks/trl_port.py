"""A TRL user's GRPO script, ported with ``GRPO.from_trl`` and nothing else: does it learn accuracy?

The script a TRL user would write: a conversational dataset (``prompt`` = system + user messages, ``solution`` =
the answer; no gold reasoning), two TRL reward functions in their conversational form (``accuracy``: the
``<answer>`` block equals the solution; ``think_format``: ``<think>...</think><answer>...</answer>``), and
``GRPOTrainer(model, reward_funcs=[accuracy, think_format], args=GRPOConfig(...), train_dataset=...)``, turned into
``GRPO.from_trl(model_folder, [accuracy, think_format], args={...}, train_dataset=..., eval_dataset=...)`` as the
docs document. The model plays a TRL user's pretrained model: the built-in tiny one (0.8M parameters) taught the
task's format once, by ``--pretrain-steps`` supervised steps on the arithmetic task's gold solutions in the same
prompt layout, and exported with ``save_pretrained`` (model + tokenizer) to a folder, shared by every seed; a model
from a folder is taken as pretrained (no cold start in the port). The problems are the ``arithmetic`` task's at
difficulty 0.1 (train rows and a disjoint held-out split). The tokenizer (the built-in one) has no chat template,
so the conversations take the plain layout (``SYSTEM\nUser: ...\nAssistant: ``).

Measured per seed: the mean ``accuracy`` reward of GRPO's rollouts over its first and last ``--window``
iterations (the reward the user asked GRPO to raise), and the held-out success (the env's verifier on the eval
split, sampled) before and after GRPO. Reported: median and worst over seeds of the rise.

Command (what ``benchmarks/RESULTS.md`` records)::

    python benchmarks/trl_port.py --seeds 0 1 2 3 4 --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import cpu_flags, cpu_name, update_results

SECTION = "## A TRL script ported with GRPO.from_trl"
SYSTEM = "Think in <think> </think>, then answer in <answer> </answer>."
ANSWER = re.compile(r"<answer>(.*?)</answer>\s*$", re.DOTALL)
FORMAT = re.compile(r"^<think>.*?</think><answer>.*?</answer>$", re.DOTALL)


def accuracy(completions: list[list[dict[str, str]]], solution: list[str], **kwargs: Any) -> list[float]:
    """TRL style, conversational: 1 when the answer block holds the solution."""
    contents = [completion[0]["content"] for completion in completions]
    found = [ANSWER.search(content) for content in contents]
    return [float(m is not None and m.group(1).strip() == s) for m, s in zip(found, solution, strict=True)]


def think_format(completions: list[list[dict[str, str]]], **kwargs: Any) -> list[float]:
    """TRL style, conversational: 1 for ``<think>...</think><answer>...</answer>``."""
    return [float(FORMAT.match(completion[0]["content"].strip()) is not None) for completion in completions]


def rows(n: int, seed_base: int) -> list[dict[str, Any]]:
    """``n`` conversational rows of the arithmetic task at difficulty 0.1 (problems of seeds ``seed_base + i``)."""
    from grpo_gym.tasks import ArithmeticTask

    task = ArithmeticTask()
    problems = [task.sample_seeded(0.1, seed_base + i) for i in range(n)]
    return [
        {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p.prompt}], "solution": p.answer}
        for p in problems
    ]


def pretrained_folder(folder: Path, steps: int) -> Path:
    """The "user's pretrained model": the built-in tiny model after ``steps`` SFT steps on gold solutions in the
    conversations' plain layout, saved with its tokenizer (once; the folder is reused when it exists)."""
    import gymnasium as gym

    import grpo_gym  # noqa: F401
    from algorithms import GRPO

    if (folder / "config.json").is_file():
        return folder
    env = gym.make("R1Zero-v0", template=SYSTEM + "\nUser: {prompt}\nAssistant: ", max_new_tokens=32, difficulty=0.1)
    teacher = GRPO(
        "TransformerPolicy", env, cold_start_kwargs={"steps": steps}, seed=1234, policy_kwargs={"model": "tiny"}
    )
    teacher.start_run("GRPO")
    teacher.run_cold_start()
    teacher.save_pretrained(str(folder))
    return folder


def run(seed: int, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One seed: the TRL script through from_trl, held-out success, GRPO with the accuracy reward recorded, held-out
    success again."""
    from datasets import Dataset
    from stable_baselines3.common.callbacks import BaseCallback

    from algorithms import GRPO
    from algorithms.common.evaluation import evaluate_difficulties

    class AccuracyPerRollout(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.means: list[float] = []

        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            scores = [info["reward_components"]["accuracy"] for info in self.locals["rows"].infos]
            self.means.append(sum(scores) / len(scores))

    train = Dataset.from_list(rows(args.train_rows, 0))
    held_out = Dataset.from_list(rows(args.eval_rows, 10**9))
    trl_args = {  # what the user's GRPOConfig said, as a dict of its fields
        "num_generations": args.group_size,
        "per_device_train_batch_size": args.groups * args.group_size,
        "max_completion_length": 32,
        "learning_rate": 5e-5,
        "beta": 0.0,
        "entropy_coef": 0.0,
        "seed": seed,
    }
    model = GRPO.from_trl(str(folder), [accuracy, think_format], trl_args, train, eval_dataset=held_out)
    env = model.get_env()
    before = evaluate_difficulties(model.policy, env, [0.1], args.eval_rows, seed=0)[0].success_rate
    recorder = AccuracyPerRollout()
    started = time.perf_counter()
    model.learn(args.iterations * args.groups * args.group_size, callback=recorder)
    seconds = time.perf_counter() - started
    after = evaluate_difficulties(model.policy, env, [0.1], args.eval_rows, seed=0)[0].success_rate
    w = args.window
    first, last = statistics.mean(recorder.means[:w]), statistics.mean(recorder.means[-w:])
    return {
        "seed": seed,
        "accuracy_first": first,
        "accuracy_last": last,
        "rise": last - first,
        "held_out_before": before,
        "held_out_after": after,
        "curve": recorder.means,
        "grpo_seconds": seconds,
        "cold_start": model._cold_start_done,
    }


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    import torch

    rises = [r["rise"] for r in results]
    held = [r["held_out_after"] - r["held_out_before"] for r in results]
    lines = [
        f"Command: `python benchmarks/trl_port.py --seeds {' '.join(map(str, args.seeds))} --results "
        f"benchmarks/RESULTS.md` ({datetime.date.today()}).",
        "",
        f"torch {torch.__version__}, Python {platform.python_version()}; CPU {cpu_name()} ({cpu_flags()}), "
        f"{torch.get_num_threads()} torch threads, a machine shared with other jobs. The user's model: the built-in "
        f"tiny model after {args.pretrain_steps} SFT steps on gold solutions, from a folder (no cold start in the "
        f"port); then {args.iterations} GRPO iterations of "
        f"K={args.groups} x G={args.group_size}; {args.train_rows} training rows, {args.eval_rows} held-out rows "
        "(arithmetic, difficulty 0.1); TRL args: num_generations, per_device_train_batch_size, "
        "max_completion_length 32, learning_rate 5e-5, beta 0, entropy_coef 0.",
        "",
        f"| seed | accuracy reward, first {args.window} iterations | last {args.window} | rise | held-out success "
        "before GRPO | after GRPO | GRPO seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['seed']} | {r['accuracy_first']:.3f} | {r['accuracy_last']:.3f} | {r['rise']:+.3f} | "
            f"{r['held_out_before']:.1%} | {r['held_out_after']:.1%} | "
            f"{r['grpo_seconds']:.0f} |"
        )
    lines += [
        "",
        f"Rise of the accuracy reward over {len(results)} seeds: median **{statistics.median(rises):+.3f}**, worst "
        f"**{min(rises):+.3f}**; held-out success after GRPO minus before: median "
        f"{100 * statistics.median(held):+.1f} points, worst {100 * min(held):+.1f}.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--groups", type=int, default=8, help="K, prompts per rollout")
    parser.add_argument("--group-size", type=int, default=8, help="G, TRL's num_generations")
    parser.add_argument("--pretrain-steps", type=int, default=500, help="SFT steps of the 'pretrained' model")
    parser.add_argument("--folder", type=Path, default=Path("/tmp/grpo-gym-trl-port-model"), help="its folder")
    parser.add_argument("--train-rows", type=int, default=2000)
    parser.add_argument("--eval-rows", type=int, default=200)
    parser.add_argument("--window", type=int, default=20, help="iterations averaged at the start and the end")
    parser.add_argument("--results", type=Path, default=None, help="RESULTS.md to update")
    parser.add_argument("--runs", type=Path, default=Path(__file__).with_name("trl_port_runs.json"))
    args = parser.parse_args()
    folder = pretrained_folder(args.folder, args.pretrain_steps)
    results = []
    for seed in args.seeds:
        results.append(run(seed, folder, args))
        print(json.dumps({k: v for k, v in results[-1].items() if k != "curve"}), flush=True)
        args.runs.write_text(json.dumps(results) + "\n")
    text = report(results, args)
    print(text)
    if args.results is not None:
        title = f"`--iterations {args.iterations} --pretrain-steps {args.pretrain_steps}`, {len(args.seeds)} seeds"
        update_results(args.results, SECTION, title, text)


if __name__ == "__main__":
    main()
