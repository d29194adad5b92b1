"""This project's GRPO against Hugging Face TRL's ``GRPOTrainer``, side by side on CPU: seconds per iteration
and peak memory.

Both train the same locally built Llama-style model (saved with ``save_pretrained`` together with the built-in
character tokenizer to a temporary folder, which both load) on the same task (``R1Zero-v0`` arithmetic
prompts, ``template="compact"``) with the same reward (the env's composite reward, called on each TRL
completion for its problem). One iteration = K=4 prompts x G=8 completions sampled in one batch, scored, and
one optimizer step on the 32 completions, with a k3 KL penalty (beta 0.04) to a frozen reference model, the
same learning rate, temperature and top-p, fp32, no gradient checkpointing, the same number of torch threads
and the same seed. Each framework runs in its own subprocess so that their peak RSS do not mix; each process
reports its RSS after its imports, after its setup (model, reference model and trainer built) and its peak
(``VmHWM``) at the end.

Objective settings matched on TRL's side (its defaults differ): ``loss_type="grpo"`` (ours: per-sequence
mean, ``loss_aggregation="sequence"``), ``max_grad_norm=0.5``, constant learning rate, plain AdamW with weight
decay 0.01 (``torch.optim.AdamW``'s default, which ours uses), no entropy bonus (ours: ``ent_coef=0``),
top-p 0.92 (ours' default).

The runs alternate (ours, TRL, TRL, ours for ``--rounds 2``) and each states the share of the CPUs that other
processes used meanwhile: with 2 torch threads on 2 cores, any other busy process slows both frameworks many
times over, so only compare runs made on an otherwise idle machine.

Command (what ``benchmarks/RESULTS.md`` records; about 1 minute on an idle 2-core machine)::

    python benchmarks/vs_trl.py --model tiny --new-tokens 64 --iterations 8 --warmup 2 --results benchmarks/RESULTS.md

The optional mid-size variant (about 2.5 minutes; add ``--results benchmarks/RESULTS.md`` to record it)::

    python benchmarks/vs_trl.py --model medium --new-tokens 256 --iterations 2 --warmup 1 --rounds 1

Needs the ``bench`` extra (``pip install -e ".[bench]"``: ``trl``, ``datasets``). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import cpu_flags, cpu_name, memory_mib, others_share, run_worker, trl_dataset, update_results, usage

N_GROUPS, GROUP_SIZE = 4, 8  # K prompts x G completions per iteration
SECTION = "## GRPO vs TRL GRPOTrainer (CPU)"


@dataclass
class Settings:
    """What both frameworks are given (one JSON object on the command line of each worker)."""

    model: str = "tiny"
    new_tokens: int = 64
    iterations: int = 8
    warmup: int = 2
    threads: int = 2
    seed: int = 0
    learning_rate: float = 1e-5
    beta: float = 0.04
    temperature: float = 1.0
    top_p: float = 0.92  # ours' default; passed to TRL too
    folder: str = ""  # the saved model + tokenizer

    @property
    def total_iterations(self) -> int:
        return self.warmup + self.iterations


# ---------------------------------------------------------------------------------------------- measuring
class Stopwatch:
    """Wall and CPU timestamps of iteration boundaries, and the wall time spent inside a wrapped ``generate``."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, float, float]] = []  # (wall, own CPU, machine busy CPU) seconds
        self.generation: list[float] = []

    def mark(self) -> None:
        self.marks.append(usage())

    def wrap_generate(self, owner: Any) -> None:
        """Time every call of ``owner.generate`` (an instance attribute shadows the method)."""
        generate = owner.generate

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = generate(*args, **kwargs)
            self.generation.append(time.perf_counter() - start)
            return out

        owner.generate = timed

    def result(self, warmup: int) -> dict[str, Any]:
        """Per-iteration wall, CPU and generation seconds, warm-up iterations dropped, and the share of the
        machine's CPUs that other processes used during the timed iterations (the noise on the figures)."""
        pairs = list(itertools.pairwise(self.marks))
        return {
            "iteration_s": [b[0] - a[0] for a, b in pairs][warmup:],
            "cpu_s": [b[1] - a[1] for a, b in pairs][warmup:],
            "generation_s": self.generation[warmup:],
            "others": others_share(self.marks[warmup], self.marks[-1]),
        }


def make_env(settings: Settings) -> Any:
    import gymnasium as gym

    import grpo_gym  # noqa: F401  (registers R1Zero-v0)

    return gym.make("R1Zero-v0", template="compact", max_new_tokens=settings.new_tokens, tokenizer=settings.folder)


# ---------------------------------------------------------------------------------------------- workers
def run_ours(settings: Settings) -> dict[str, Any]:
    """This project's GRPO: ``learn()`` for warm-up + timed iterations, boundaries at ``on_rollout_start``."""
    import torch
    from stable_baselines3.common.callbacks import BaseCallback

    from algorithms import GRPO

    torch.set_num_threads(settings.threads)
    memory = {"imports": memory_mib()["rss"]}
    env = make_env(settings)
    model = GRPO(
        "TransformerPolicy",
        env,
        learning_rate=settings.learning_rate,
        n_groups=N_GROUPS,
        group_size=GROUP_SIZE,
        beta=settings.beta,
        ent_coef=0.0,
        max_grad_norm=0.5,
        cold_start=False,
        policy_kwargs={"model": settings.folder, "temperature": settings.temperature, "top_p": settings.top_p},
        seed=settings.seed,
        device="cpu",
    )
    memory["setup"] = memory_mib()["rss"]
    watch = Stopwatch()
    watch.wrap_generate(model.policy)
    lengths: list[float] = []

    class Clock(BaseCallback):
        def _on_rollout_start(self) -> None:
            watch.mark()

        def _on_rollout_end(self) -> None:
            lengths.append(self.logger.name_to_value["rollout/completion_length"])

        def _on_step(self) -> bool:
            return True

        def _on_training_end(self) -> None:
            watch.mark()

    model.learn(settings.total_iterations * N_GROUPS * GROUP_SIZE, callback=Clock())
    memory["peak"] = memory_mib()["peak"]
    return {**watch.result(settings.warmup), "lengths": lengths[settings.warmup :], "memory": memory}


def run_trl(settings: Settings) -> dict[str, Any]:
    """TRL's ``GRPOTrainer`` for warm-up + timed steps, boundaries at ``on_step_end``."""
    import torch
    import transformers
    import trl
    from transformers import TrainerCallback

    torch.set_num_threads(settings.threads)
    memory = {"imports": memory_mib()["rss"]}
    env = make_env(settings).unwrapped
    env.reset(seed=settings.seed)
    problems = [env.sample_problem() for _ in range(settings.total_iterations * N_GROUPS)]
    dataset, composite_reward = trl_dataset(env, problems)

    args = trl.GRPOConfig(
        output_dir=os.path.join(os.path.dirname(settings.folder), "trl"),
        seed=settings.seed,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=N_GROUPS * GROUP_SIZE,  # one optimizer step per generation batch
        gradient_accumulation_steps=1,
        num_generations=GROUP_SIZE,
        max_completion_length=settings.new_tokens,
        max_steps=settings.total_iterations,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="constant",
        optim="adamw_torch",
        weight_decay=0.01,
        max_grad_norm=0.5,
        beta=settings.beta,
        loss_type="grpo",
        temperature=settings.temperature,
        top_p=settings.top_p,
        use_vllm=False,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
    )
    watch = Stopwatch()
    lengths: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            watch.mark()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            watch.mark()
            # TRL keeps its metrics until it logs (at the end only, logging being off)
            lengths.append(trainer._metrics["train"]["completions/mean_length"][-1])

    trainer = trl.GRPOTrainer(
        model=settings.folder, reward_funcs=composite_reward, args=args, train_dataset=dataset, callbacks=[Clock()]
    )
    torch.set_num_threads(settings.threads)  # in case the trainer's setup changed it
    memory["setup"] = memory_mib()["rss"]
    watch.wrap_generate(trainer.model)
    trainer.train()
    memory["peak"] = memory_mib()["peak"]
    return {
        **watch.result(settings.warmup),
        "lengths": lengths[settings.warmup :],
        "memory": memory,
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
    }


WORKERS = {"ours": run_ours, "trl": run_trl}


# ---------------------------------------------------------------------------------------------- reporting
def summarize(runs: list[dict[str, Any]]) -> dict[str, float]:
    """One framework's figures: timed iterations pooled over its runs (median and range), memory of the run
    with the highest peak."""
    seconds = [s for run in runs for s in run["iteration_s"]]
    cpu = [s for run in runs for s in run["cpu_s"]]
    generation = [s for run in runs for s in run["generation_s"]]
    length = statistics.fmean(x for run in runs for x in run["lengths"])
    median = statistics.median(seconds)
    memory = max((run["memory"] for run in runs), key=lambda m: m["peak"])
    tokens = N_GROUPS * GROUP_SIZE * length
    return {
        "median_s": median,
        "min_s": min(seconds),
        "max_s": max(seconds),
        "cpu_s": statistics.median(cpu),
        "generation_s": statistics.median(generation),
        "length": length,
        "tokens_per_s": tokens / median,
        "generation_tokens_per_s": tokens / statistics.median(generation),
        "imports_mib": memory["imports"],
        "setup_mib": memory["setup"],
        "peak_mib": memory["peak"],
        "overhead_mib": memory["peak"] - memory["setup"],
        "samples": len(seconds),
    }


def table(rows: dict[str, dict[str, float]]) -> str:
    """A markdown table, one row per framework."""
    lines = [
        "| framework | s/iteration (median) | min – max | CPU s/iteration | generation s/it | mean completion "
        "length | tokens/s (iteration) | tokens/s (generation) | RSS after imports | RSS after setup | peak RSS "
        "| peak − setup |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in rows.items():
        lines.append(
            f"| {name} | {s['median_s']:.3f} | {s['min_s']:.3f} – {s['max_s']:.3f} | {s['cpu_s']:.3f} "
            f"| {s['generation_s']:.3f} | {s['length']:.1f} | {s['tokens_per_s']:.0f} "
            f"| {s['generation_tokens_per_s']:.0f} | {s['imports_mib']:.0f} MiB | {s['setup_mib']:.0f} MiB "
            f"| {s['peak_mib']:.0f} MiB | {s['overhead_mib']:.0f} MiB |"
        )
    return "\n".join(lines)


def ratios(ours: dict[str, float], theirs: dict[str, float]) -> str:
    """Ours / TRL for time and memory (below 1: ours is faster / smaller)."""

    def ratio(key: str) -> str:
        return f"{ours[key] / theirs[key]:.2f}x"

    rest = (ours["median_s"] - ours["generation_s"]) / (theirs["median_s"] - theirs["generation_s"])
    return (
        f"Ours/TRL: time per iteration **{ratio('median_s')}** (CPU time {ratio('cpu_s')}, generation "
        f"{ratio('generation_s')}, the rest of the iteration {rest:.2f}x); peak RSS **{ratio('peak_mib')}**, RSS after "
        f"setup {ratio('setup_mib')}, training overhead (peak − setup) {ratio('overhead_mib')}."
    )


def save_model(settings: Settings) -> int:
    """Build the built-in model (random init, ``seed``), write it with the built-in tokenizer to the folder, and
    return its number of parameters."""
    import grpo_gym
    from algorithms.common.model.loading import count_parameters, load_model

    model = load_model(settings.model, seed=settings.seed)
    model.save_pretrained(settings.folder)
    grpo_gym.build_char_tokenizer().save_pretrained(settings.folder)
    return count_parameters(model)


def report(args: argparse.Namespace, parameters: int, runs: dict[str, list[dict[str, Any]]]) -> str:
    """The markdown written to RESULTS.md: command, versions, machine, table, ratios."""
    rows = {"ours (grpo-gym GRPO)": summarize(runs["ours"]), "TRL GRPOTrainer": summarize(runs["trl"])}
    versions = runs["trl"][0]["versions"]
    samples = next(iter(rows.values()))["samples"]
    per_run = "; ".join(
        f"{name}: "
        + ", ".join(f"{statistics.median(run['iteration_s']):.3f} s ({run['others']:.0%})" for run in runs[name])
        for name in runs
    )
    return "\n".join(
        [
            f"Command: `python benchmarks/vs_trl.py {' '.join(sys.argv[1:])}` ({datetime.date.today().isoformat()}).",
            "",
            f"trl {versions['trl']}, transformers {versions['transformers']}, torch {versions['torch']}, Python "
            f"{platform.python_version()}; {os.cpu_count()}-core {cpu_name()} (flags: {cpu_flags()}), no GPU; torch "
            f"threads {args.threads} in "
            f"each process. Model {args.model!r} ({parameters / 1e6:.2f}M parameters), {args.new_tokens} new tokens, "
            f"K={N_GROUPS} x G={GROUP_SIZE}; {samples} timed iterations per framework (runs per framework: "
            f"{args.rounds}, alternating; each {args.iterations} timed after {args.warmup} warm-up).",
            "",
            table(rows),
            "",
            ratios(*rows.values()),
            "",
            "Median s/iteration of each run (runs alternate ours, TRL, TRL, ours, …) and, in brackets, the share of "
            f"the machine's CPUs that other processes used during its timed iterations (the machine is shared): "
            f"{per_run}.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=["tiny", "small", "medium"], help="built-in model")
    parser.add_argument("--new-tokens", type=int, default=64, help="max new tokens per completion")
    parser.add_argument("--iterations", type=int, default=8, help="timed iterations per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations at the start of each run")
    parser.add_argument("--rounds", type=int, default=2, help="runs per framework, alternating: ours, TRL, TRL, ours")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each framework")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", type=Path, help="write the table into this RESULTS.md")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](Settings(**json.loads(args.settings)))))
        return

    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "trl": []}
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as tmp:
        settings = Settings(
            model=args.model,
            new_tokens=args.new_tokens,
            iterations=args.iterations,
            warmup=args.warmup,
            threads=args.threads,
            seed=args.seed,
            folder=os.path.join(tmp, "model"),
        )
        parameters = save_model(settings)
        for round_ in range(args.rounds):
            for name in ("ours", "trl") if round_ % 2 == 0 else ("trl", "ours"):
                start = time.perf_counter()
                runs[name].append(run_worker(__file__, name, asdict(settings)))
                median = statistics.median(runs[name][-1]["iteration_s"])
                print(f"{name}: {median:.3f} s/iteration (median), run took {time.perf_counter() - start:.0f} s")
    body = report(args, parameters, runs)
    print(body)
    if args.results:
        update_results(
            args.results,
            SECTION,
            f"`--model {args.model} --new-tokens {args.new_tokens} --threads {args.threads}`",
            body,
        )
        print(f"written to {args.results}")


if __name__ == "__main__":
    main()
