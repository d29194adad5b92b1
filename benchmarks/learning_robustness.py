"""Learning a user can trust: this project's GRPO against TRL's ``GRPOTrainer`` from the same start, across seeds
and learning rates, judged by one evaluator on one held-out set (issue 23).

- **Starts** (each a Hugging Face folder, model + tokenizer, that both trainers load the way a user's checkpoint
  loads: ``policy_kwargs={"model": folder}`` with ``gym.make("R1Zero-v0", tokenizer=folder)``, and
  ``GRPOTrainer(model=folder)``):

  - ``a``: the built-in tiny model after the demo preset's cold start on ``arithmetic`` (``learning_vs_trl.py``'s
    start: 500 SFT steps; the demo's env: compact template, 32 new tokens, difficulty 0.1, reward 0.2 syntax +
    0.8 task);
  - ``b``: a ~0.8M-parameter Llama with its own character tokenizer, supervised-tuned here on 2–3-digit addition
    with a digit-by-digit scratchpad until greedy validation success reaches 62% (``pretrained_start.py``; env:
    compact template, 40 new tokens, reward 0.2 syntax + 0.8 task).
- **Arms**: for each start and each ``--learning-rates`` value, ours and TRL with the same K x G (4 x 8), reward,
  gradient clip (0.5), temperature (1), top-p (0.92), beta (0) and learning rate, ``--seeds`` seeds each, the
  same problem stream per seed (``learning_vs_trl.py``'s workers), ``--iterations`` iterations each (one optimizer
  step per iteration in both). Ours runs its constructor defaults but for those; ``--ours key=value`` changes
  them. ``--variant label key=value ...`` adds arms of ours with other settings (GRPO's defaults but for those
  and the shared ones above; at ``--variant-learning-rates`` on ``--variant-starts``, or where its own
  ``_starts=a,b`` and ``_learning_rates=1e-5,1e-4`` say), to measure what one setting is worth (``--variant
  defaults`` alone: GRPO's defaults). TRL runs ``GRPOConfig``'s defaults but for
  those (``loss_type="dapo"``, AdamW without weight decay, float32 on a CPU without native bf16).
- **Evaluation**: after training, one process per start scores the start and every run's final weights on the
  same ``--held-out`` problems (held-out seeds, never trained on) through this project's policy and evaluator, in
  float32: greedy (the headline, as the issue measured it) and sampled (temperature 1, top-p 0.92, seed 0).
- **Report**: per arm the median, worst and best held-out change (points, run minus start) over seeds, the wall
  time of a run and of an iteration; the issue's criteria checked per learning rate; a strip plot of every run's
  change (``learning_robustness.png``); the machine's CPU model and flags.

Runs go ``--workers`` at a time, each its own process with ``--threads`` torch threads. Results are kept in ``--work``
(starts, snapshots, one JSON per run and per evaluation), so an interrupted benchmark resumes and new arms add to it.

Ours and TRL only (about 3 hours on 2 shared cores: 42 min building the starts, then 60 runs of about 4 min, 2 at a
time, then scoring)::

    python benchmarks/learning_robustness.py --work /tmp/robustness --workers 2

What RESULTS.md records adds the variants (its command line, quoted as a shell needs it, is in the section).

Smoke run (a few minutes)::

    python benchmarks/learning_robustness.py --work /tmp/robustness_smoke --iterations 2 --seeds 1 --held-out 10 \\
        --learning-rates 1e-4 --sft-steps-a 5 --sft-target-b 0.0

Needs the ``bench`` extra (``trl``, ``datasets``, ``matplotlib``). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import run_worker, update_results
from learning_vs_trl import Settings, evaluate, run_ours, run_trl, start_model
from robustness_report import plot, report

SECTION = "## Learning a user can trust: GRPO vs TRL across seeds and learning rates"
#: what both trainers are given besides K, G, the learning rate and the sampling settings (TRL's names)
SHARED_TRL = {"beta": 0.0, "max_grad_norm": 0.5, "epsilon": 0.2}
SHARED_OURS = {"beta": 0.0, "max_grad_norm": 0.5, "clip_range": 0.2}


def start_b(settings: Settings) -> dict[str, Any]:
    """Start ``b``: the pretrained Llama of ``pretrained_start.py``, tuned to ``settings.sft["target"]``."""
    import torch
    from pretrained_start import supervised_tune

    torch.set_num_threads(settings.threads)
    return supervised_tune(settings.folder, seed=settings.seed, **settings.sft)


def start_c(settings: Settings) -> dict[str, Any]:
    """Start ``c``: issue 30's pretrained Llama (``carry_start.py``), built as the issue describes it."""
    import torch
    from carry_start import supervised_tune

    torch.set_num_threads(settings.threads)
    return supervised_tune(settings.folder, seed=settings.seed, **settings.sft)


WORKERS = {"start_a": start_model, "start_b": start_b, "start_c": start_c, "ours": run_ours, "trl": run_trl,
           "evaluate": evaluate}  # fmt: skip


def start_env_kwargs(start: str) -> dict[str, Any]:
    """The env arguments of a start (both trainers and the evaluator use them)."""
    if start in ("b", "c"):
        module = __import__({"b": "pretrained_start", "c": "carry_start"}[start])
        return dict(module.ENV_KWARGS)
    from algorithms.common.hyperparams import DEFAULT_CONFIG, load_hyperparams

    return dict(load_hyperparams(DEFAULT_CONFIG, "R1Zero-v0", "demo").get("env_kwargs", {}))


def build_start(args: argparse.Namespace, start: str) -> dict[str, Any]:
    """The start's folder under ``--work`` (built once, then reused) and what building it measured."""
    folder = args.work / f"start_{start}"
    record = args.work / f"start_{start}.json"
    if record.exists():
        return json.loads(record.read_text())
    if start == "a":
        sft = {
            "cold_start_kwargs": {"steps": args.sft_steps_a, "batch_size": 32, "learning_rate": 1e-3},
        }
    elif start == "c":
        sft = {"steps": args.sft_steps_c}
    else:
        sft = {"target": args.sft_target_b, "max_steps": args.sft_max_steps_b}
    settings = Settings(folder=str(folder), out=str(args.work), seed=0, threads=args.threads,
                        env_kwargs=start_env_kwargs(start), sft=sft)  # fmt: skip
    result = {"folder": str(folder), "sft": sft, **run_worker(__file__, f"start_{start}", asdict(settings))}
    record.write_text(json.dumps(result))
    return result


def arms(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every run: ``{"start", "label", "trainer", "lr", "seed", "ours", "trl"}``, ours and TRL interleaved."""
    runs = []
    for start in [] if args.variants_only else args.starts:
        for lr in args.learning_rates:
            for seed in range(args.seeds):
                for trainer in ("ours", "trl"):
                    runs.append({"start": start, "label": trainer, "trainer": trainer, "lr": lr, "seed": seed,
                                 "ours": {**SHARED_OURS, **args.ours}, "trl": {**SHARED_TRL, **args.trl}})  # fmt: skip
    for variant in args.variants:
        trainer = variant["trainer"]
        settings = {**(SHARED_OURS if trainer == "ours" else SHARED_TRL), **variant["settings"]}
        for start in variant["starts"]:
            for lr in variant["learning_rates"]:
                for seed in range(args.seeds):
                    runs.append({"start": start, "label": variant["label"], "trainer": trainer, "lr": lr, "seed": seed,
                                 "ours": settings if trainer == "ours" else {},
                                 "trl": settings if trainer == "trl" else {}})  # fmt: skip
    return runs


def run_key(run: dict[str, Any]) -> str:
    """The run's name in ``--work``: start, label, learning rate, seed and a hash of its trainer's settings (so a
    changed setting is a new run, never a stale result; the other trainer's settings play no part)."""
    settings = json.dumps({"settings": run[run["trainer"]], "trainer": run["trainer"]}, sort_keys=True)
    digest = hashlib.sha256(settings.encode()).hexdigest()[:8]
    return f"{run['start']}_{run['label']}_lr{run['lr']:g}_seed{run['seed']}_{digest}"


def train(args: argparse.Namespace, run: dict[str, Any], starts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One run in its own process (skipped when ``--work`` holds its result already)."""
    record = args.work / "runs" / f"{run_key(run)}.json"
    if record.exists():
        return json.loads(record.read_text())
    out = args.work / "snapshots" / run_key(run)
    out.mkdir(parents=True, exist_ok=True)
    settings = Settings(folder=starts[run["start"]]["folder"], out=str(out), seed=run["seed"], threads=args.threads,
                        budgets=[],
                        iterations=[args.iterations], max_iterations=args.iterations,
                        env_kwargs=start_env_kwargs(run["start"]), ours={**run["ours"], "learning_rate": run["lr"]},
                        trl=run["trl"])  # fmt: skip
    result = {**run, **run_worker(__file__, run["trainer"], asdict(settings))}
    record.write_text(json.dumps(result))
    print(f"{run_key(run)}: {result['iterations']} iterations in {result['train_s']:.0f} s", flush=True)
    return result


def score(args: argparse.Namespace, start: str, folder: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Held-out success of the start and of every run's final weights (one evaluation process, cached)."""
    record = args.work / f"scores_{start}_{args.held_out}.json"
    scores = json.loads(record.read_text()) if record.exists() else {}
    paths = [r["snapshots"][-1]["path"] for r in results if r["start"] == start]
    missing = [path for path in paths if path not in scores]
    if missing or "start" not in scores:
        settings = Settings(folder=folder, out=str(args.work), env_kwargs=start_env_kwargs(start), threads=args.threads,
                            held_out=args.held_out, paths=missing)  # fmt: skip
        scores.update(run_worker(__file__, "evaluate", asdict(settings)))
        record.write_text(json.dumps(scores))
    return scores


def _listed(value: Any) -> list[Any]:
    """``"a,b"``, ``("a", "b")`` or ``"a"`` (a parsed ``key=value``) as a list."""
    return value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else [value]


def parse_variant(
    label: str, pairs: list[str], starts: list[str], learning_rates: list[float], trainer: str = "ours"
) -> dict[str, Any]:
    """One ``--variant`` (``trainer="ours"``: GRPO arguments) or ``--trl-variant`` (GRPOConfig arguments): its label,
    its arguments, and the starts and learning rates it runs at (its ``_starts=a,b`` and ``_learning_rates=1e-5,1e-4``
    pairs, else ``--variant-starts`` and ``--variant-learning-rates``)."""
    from algorithms.common.hyperparams import parse_overrides

    settings = parse_overrides(pairs)
    starts = _listed(settings.pop("_starts", starts))
    learning_rates = [float(lr) for lr in _listed(settings.pop("_learning_rates", learning_rates))]
    if not set(starts) <= {"a", "b", "c"}:
        raise ValueError(f"--variant {label}: _starts={','.join(starts)} names a start other than a, b and c")
    return {"label": label, "trainer": trainer, "settings": settings, "starts": starts,
            "learning_rates": learning_rates}  # fmt: skip


def parse_args() -> argparse.Namespace:
    from algorithms.common.hyperparams import parse_overrides

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/learning_robustness"), help="kept between runs")
    parser.add_argument("--starts", nargs="+", default=["a", "b"], choices=["a", "b", "c"])
    parser.add_argument("--learning-rates", type=float, nargs="+", default=[1e-5, 3e-5, 1e-4])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0 .. n-1 per arm")
    parser.add_argument("--iterations", type=int, default=30, help="iterations (optimizer steps) per run")
    parser.add_argument("--held-out", type=int, default=200, help="held-out problems")
    parser.add_argument("--workers", type=int, default=2, help="runs at a time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each run")
    parser.add_argument("--sft-steps-a", type=int, default=500, help="start a's cold-start steps")
    parser.add_argument("--sft-target-b", type=float, default=0.62, help="start b's validation success target")
    parser.add_argument("--sft-max-steps-b", type=int, default=4000, help="start b's most tuning steps")
    parser.add_argument("--sft-steps-c", type=int, default=300, help="start c's tuning steps")
    parser.add_argument("--ours", nargs="*", default=[], help="GRPO arguments of ours' arms, key=value")
    parser.add_argument("--trl", nargs="*", default=[], help="GRPOConfig arguments of TRL's arms, key=value")
    parser.add_argument("--variant", nargs="+", action="append", default=[], metavar=("LABEL", "KEY=VALUE"),
                        help="an extra arm of ours: a label, then GRPO arguments (_starts=a,b and "
                             "_learning_rates=1e-5,1e-4: where this one runs)")  # fmt: skip
    parser.add_argument(
        "--trl-variant",
        nargs="+",
        action="append",
        default=[],
        metavar=("LABEL", "KEY=VALUE"),
        help="an extra arm of TRL's: a label, then GRPOConfig arguments (and _starts, _learning_rates)",
    )
    parser.add_argument("--variant-starts", nargs="+", default=["b"], choices=["a", "b", "c"], help="variants' default")
    parser.add_argument("--variant-learning-rates", type=float, nargs="+", default=[1e-4], help="variants' default")
    parser.add_argument("--variants-only", action="store_true", help="run the variants, not ours' and TRL's arms")
    parser.add_argument("--results", type=Path, help="write the section into this RESULTS.md")
    parser.add_argument("--title", help="the RESULTS.md subsection's title (default: the command's settings)")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return args
    args.ours, args.trl = parse_overrides(args.ours), parse_overrides(args.trl)
    args.variants = [
        parse_variant(label, pairs, args.variant_starts, args.variant_learning_rates) for label, *pairs in args.variant
    ] + [
        parse_variant(label, pairs, args.variant_starts, args.variant_learning_rates, "trl")
        for label, *pairs in args.trl_variant
    ]
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](Settings(**json.loads(args.settings)))))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "runs").mkdir(exist_ok=True)
    load, began = os.getloadavg(), time.time()
    needed = sorted({*args.starts, *(start for variant in args.variants for start in variant["starts"])})
    starts = {start: build_start(args, start) for start in needed}
    for start, built in starts.items():
        print(f"start {start}: {built['folder']}", flush=True)
    planned = [run for run in arms(args) if run["start"] in starts]
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(lambda run: train(args, run, starts), planned))
    scores = {start: score(args, start, starts[start]["folder"], results) for start in starts}
    body = report(args, starts, results, scores, load, time.time() - began)
    print(body)
    if args.results:
        image = args.results.parent / "learning_robustness.png"
        plot(image, args, results, scores)
        title = args.title or f"`--iterations {args.iterations} --seeds {args.seeds} --held-out {args.held_out}`"
        update_results(args.results, SECTION, title, body)
        print(f"written to {args.results} and {image}")


if __name__ == "__main__":
    main()
