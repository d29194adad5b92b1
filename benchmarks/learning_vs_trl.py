"""Learning per wall-clock second: this project's GRPO against TRL's ``GRPOTrainer`` from the same SFT'd start,
judged on held-out problems.

- **Start model**: the built-in tiny model (``--seed``) after the cold start of the demo preset
  (``R1Zero-v0-demo`` in ``zoo_configs/grpo.yml``: its ``cold_start_kwargs``;
  ``--sft-steps`` overrides), saved with the built-in character tokenizer as a Hugging Face folder that both
  frameworks load.
- **Task and reward**: the demo preset's env (its ``env_kwargs``: task, template, ``max_new_tokens``,
  difficulty, reward weights). TRL's reward function is the env's composite reward of each completion for its
  problem (``score_completion``), the reward ours gets from ``env.step``.
- **The same problems**: GRPO with seed ``s`` draws each iteration's K problem seeds from
  ``numpy.random.default_rng(s)`` (``RolloutCollector.draw_problems``); TRL's dataset is that stream, in order
  (``shuffle_dataset=False``), so iteration t of both trains on the same K problems (checked on the first
  iteration). Held-out: ``--held-out`` problems from :func:`~algorithms.common.evaluation.held_out_problems`
  (seeds training never draws), at the env's difficulty.
- **The same sampling**: temperature, top-p and top-k of ours' ``TransformerPolicy`` defaults, and the env's
  ``max_new_tokens``, are given to TRL.
- **Ours**: ``GRPO`` with its constructor defaults (``mixed_precision="auto"`` included); ``--ours key=value``
  changes some (to compare candidate defaults).
- **TRL**: ``GRPOConfig``'s defaults (trl 1.16: ``loss_type="dapo"``, ``beta=0``, ``scale_rewards="group"``,
  ``epsilon=0.2``, one update per generation batch, AdamW without weight decay, gradient clip 1.0), except
  what this budget calls for: one iteration is ours' K x G completions (G per prompt) and one optimizer step,
  ours' learning rate (TRL's 1e-6 default is meant for pretrained billion-parameter models: the rate is the
  model's, not the trainer's), a constant schedule (a time budget has no known number of steps), no gradient
  checkpointing (it only saves memory, and costs time, at this size), bf16 (TRL's default) only on a CPU
  with native bf16, float32 elsewhere (emulated bf16 is slower). ``--trl key=value`` changes any of them.
- **Clocks**: training time runs from the start of ``learn()`` / ``trainer.train()``; writing a snapshot
  of the weights is left out of it; setup (building the model, the trainer, ours' precision probe) is
  reported apart. Snapshots are taken at the first iteration boundary at or after each ``--budgets`` second
  and at each ``--iterations`` count; a run ends when it has passed both the largest budget and the largest
  iteration count (or ``--max-iterations``).
- **Evaluation**: after training, one process loads every snapshot (TRL's weights too) into ours'
  ``TransformerPolicy`` (float32) and scores the same held-out problems through
  ``algorithms.common.evaluation`` (``evaluate_problems``): sampled (the policy's sampling settings, one
  sample per problem, a fixed sampler seed) and greedy.

Each framework and the evaluation run in their own subprocess (as ``vs_trl.py``), seeds alternating the
order (ours first for even seeds). Runs with ``--seeds`` seeds; reports held-out success per budget and per
iteration count (mean and range over seeds), ours' time to reach TRL's held-out success at the largest budget
(interpolated between snapshots), the machine (CPU model and flags) and the share of its CPUs other processes
used during each run (the machine may be shared: only runs on an idle machine compare), and a plot.

Full measurement (what ``benchmarks/RESULTS.md`` records; about 35 minutes on an idle 2-core machine: 3 seeds
x 2 frameworks x 300 s, plus the cold start and the evaluation)::

    python benchmarks/learning_vs_trl.py --results benchmarks/RESULTS.md

Smoke run (about 3 minutes)::

    python benchmarks/learning_vs_trl.py --budgets 10 20 --iterations 5 --seeds 1 --held-out 20 --sft-steps 20

Needs the ``bench`` extra (``trl``, ``datasets``, ``matplotlib``). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import (
    others_share,
    record_optimizer_steps,
    rollout_stats,
    run_worker,
    trl_dataset,
    update_results,
    usage,
)
from learning_report import MODES, plot, report

SECTION = "## Learning per wall-clock second: GRPO vs TRL GRPOTrainer (CPU)"


@dataclass
class Settings:
    """What a worker is given (one JSON object on its command line)."""

    folder: str  # the start model + tokenizer
    out: str  # where snapshots go
    seed: int = 0
    threads: int = 2
    budgets: list[float] = field(default_factory=lambda: [60.0, 120.0, 300.0])
    iterations: list[int] = field(default_factory=lambda: [100, 300])
    max_iterations: int = 4000
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    sft: dict[str, Any] = field(default_factory=dict)
    ours: dict[str, Any] = field(default_factory=dict)
    trl: dict[str, Any] = field(default_factory=dict)
    held_out: int = 200
    paths: list[str] = field(default_factory=list)  # the snapshots the evaluation scores
    diagnose: bool = False  # record each iteration's internals (TensorBoard scalars / TRL's log history)


def make_env(settings: Settings, tokenizer: str | None = "folder") -> Any:
    """The benchmark's env, with the start model's tokenizer (``tokenizer=None``: the built-in one)."""
    import gymnasium as gym

    import grpo_gym  # noqa: F401  (registers R1Zero-v0)

    tokenizer = settings.folder if tokenizer == "folder" else tokenizer
    return gym.make("R1Zero-v0", tokenizer=tokenizer, **settings.env_kwargs)


class Checkpoints:
    """The training clock (snapshot writes left out) and the snapshots taken at the budgets and iteration counts."""

    def __init__(self, settings: Settings, name: str) -> None:
        self.budgets, self.iterations = sorted(settings.budgets), sorted(settings.iterations)
        self.prefix = os.path.join(settings.out, f"{name}_seed{settings.seed}")
        self.snapshots: list[dict[str, Any]] = []
        self.start: tuple[float, float, float] | None = None
        self.paused = 0.0

    def begin(self) -> None:
        self.start = usage()

    def seconds(self) -> float:
        assert self.start is not None
        return time.perf_counter() - self.start[0] - self.paused

    def boundary(self, iteration: int, model: Any) -> bool:
        """At an iteration boundary (``iteration`` done): a snapshot when a budget or an iteration count is reached.
        False once every one is reached (the run ends)."""
        import torch

        elapsed, reached = self.seconds(), []
        while self.budgets and elapsed >= self.budgets[0]:
            reached.append(("budget", self.budgets.pop(0)))
        while self.iterations and iteration >= self.iterations[0]:
            reached.append(("iteration", self.iterations.pop(0)))
        if reached:
            start = time.perf_counter()
            path = f"{self.prefix}_{len(self.snapshots)}.pt"
            torch.save({key: value.detach().cpu().clone() for key, value in model.state_dict().items()}, path)
            self.snapshots.append({"seconds": elapsed, "iteration": iteration, "reached": reached, "path": path})
            self.paused += time.perf_counter() - start
        return bool(self.budgets or self.iterations)

    def result(self, setup_s: float, iterations: int) -> dict[str, Any]:
        assert self.start is not None
        return {
            "snapshots": self.snapshots,
            "setup_s": setup_s,
            "train_s": self.seconds(),
            "iterations": iterations,
            "others": others_share(self.start, usage()),
        }


# ---------------------------------------------------------------------------------------------- workers
def start_model(settings: Settings) -> dict[str, Any]:
    """The built-in tiny model after the cold start, saved to ``settings.folder`` with the env's tokenizer."""
    import torch

    from algorithms import GRPO
    from algorithms.common.model.loading import count_parameters

    torch.set_num_threads(settings.threads)
    env = make_env(settings, tokenizer=None)  # the built-in character tokenizer
    model = GRPO("TransformerPolicy", env, policy_kwargs={"model": "tiny"}, seed=settings.seed, device="cpu",
                 cold_start_kwargs=settings.sft)  # fmt: skip
    start = time.perf_counter()
    model.run_cold_start()
    seconds = time.perf_counter() - start
    model.save_pretrained(settings.folder)
    return {"sft_s": seconds, "parameters": count_parameters(model.policy.model)}


def run_ours(settings: Settings) -> dict[str, Any]:
    """This project's GRPO with its defaults from the start model; snapshots at the budgets."""
    import torch
    from stable_baselines3.common.callbacks import BaseCallback

    from algorithms import GRPO

    torch.set_num_threads(settings.threads)
    setup = time.perf_counter()
    kwargs = {"cold_start": False, "seed": settings.seed, "device": "cpu", **settings.ours}
    if settings.diagnose:
        kwargs["tensorboard_log"] = os.path.join(settings.out, f"tb_seed{settings.seed}")
    policy_kwargs = {"model": settings.folder, **kwargs.pop("policy_kwargs", {})}
    model = GRPO("TransformerPolicy", make_env(settings), policy_kwargs=policy_kwargs, **kwargs)
    setup_s = time.perf_counter() - setup
    checkpoints = Checkpoints(settings, "ours")
    first: list[str] = []
    history: list[dict[str, float]] = []

    class Clock(BaseCallback):
        running = True

        def _on_training_start(self) -> None:
            checkpoints.begin()

        def _on_rollout_start(self) -> None:
            self.running = checkpoints.boundary(model._iteration, model.policy.model)
            self.rewards, self.infos, self.lengths = [], [], []

        def _on_step(self) -> bool:
            if not first:
                first.extend(problem.prompt for problem in self.locals["episode_problems"][:: model.group_size])
            self.rewards.extend(float(r) for r in self.locals["rewards"])
            self.infos.extend(self.locals["infos"])
            self.lengths.extend(int(n) for n in self.locals["played"][1][1].sum(-1))
            return self.running

        def _on_rollout_end(self) -> None:
            history.append(rollout_stats(self.rewards, self.infos, self.lengths, model.group_size))

    completions = settings.max_iterations * model.n_groups * model.group_size
    steps: list[dict[str, float]] = []
    remove_hooks = record_optimizer_steps(steps)
    model.learn(completions, callback=Clock())
    remove_hooks()
    checkpoints.boundary(model._iteration, model.policy.model)  # a run cut by max_iterations
    settings_used = {
        "K": model.n_groups,
        "G": model.group_size,
        "learning_rate": model.learning_rate,
        "beta": model.beta,
        "loss_aggregation": model.loss_aggregation,
        "clip_range": model.clip_range(1.0),
        "clip_range_high": None if model.clip_range_high is None else model.clip_range_high(1.0),
        "precision": model.precision.describe().replace("\n", " "),
    }
    result = checkpoints.result(setup_s, model._iteration)
    result |= {"first_problems": first, "settings": settings_used, "history": history, "optimizer_steps": steps}
    if settings.diagnose:
        result["scalars"] = tensorboard_scalars(kwargs["tensorboard_log"])
    return result


def tensorboard_scalars(folder: str) -> dict[str, list[float]]:
    """Every scalar tag of the run in ``folder`` (its one ``GRPO_1`` run), in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(os.path.join(folder, "GRPO_1"), size_guidance={"scalars": 0}).Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def problem_stream(env: Any, seed: int, n_groups: int, iterations: int) -> list[Any]:
    """The problems ``GRPO(seed=seed)`` trains on, in order: K seeds per iteration from ``default_rng(seed)``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [env.sample_problem(seed=int(s)) for _ in range(iterations) for s in rng.integers(2**63 - 1, size=n_groups)]


def ours_defaults(settings: Settings) -> dict[str, Any]:
    """What ours trains with that TRL is given too: K, G, the learning rate, the sampling settings."""
    import inspect

    from algorithms import GRPO
    from algorithms.common.policies import TransformerPolicy

    grpo = {k: p.default for k, p in inspect.signature(GRPO.__init__).parameters.items()} | settings.ours
    policy = inspect.signature(TransformerPolicy.__init__).parameters
    if not isinstance(grpo["learning_rate"], float):
        raise SystemExit("--ours learning_rate must be a number (TRL is given the same one)")
    sampling = {name: policy[name].default for name in ("temperature", "top_p", "top_k")}
    return {"K": grpo["n_groups"], "G": grpo["group_size"], "learning_rate": grpo["learning_rate"], **sampling}


def run_trl(settings: Settings) -> dict[str, Any]:
    """TRL's ``GRPOTrainer`` (see the module doc for its settings) from the start model; snapshots at the budgets."""
    import torch
    import transformers
    import trl
    from transformers import TrainerCallback

    from algorithms.common.runtime.precision import cpu_has_native_bf16

    torch.set_num_threads(settings.threads)
    setup = time.perf_counter()
    env = make_env(settings).unwrapped
    ours = ours_defaults(settings)
    problems = problem_stream(env, settings.seed, ours["K"], settings.max_iterations)
    dataset, composite_reward = trl_dataset(env, problems, ours["G"])
    first: list[int] = []  # the problems of TRL's first generation batch, as its reward function sees them

    def reward(completion_ids: list[list[int]], problem_id: list[int], **kwargs: Any) -> list[float]:
        first.extend([] if first else problem_id[:: ours["G"]])
        return composite_reward(completion_ids, problem_id, **kwargs)

    config = {
        "output_dir": os.path.join(settings.out, f"trl_seed{settings.seed}"),
        "seed": settings.seed,
        "use_cpu": True,
        "bf16": cpu_has_native_bf16(),
        "fp16": False,
        "gradient_checkpointing": False,
        "per_device_train_batch_size": ours["K"] * ours["G"],  # one optimizer step per generation batch
        "gradient_accumulation_steps": 1,
        "num_generations": ours["G"],
        "shuffle_dataset": False,
        "max_completion_length": env.max_new_tokens,
        "max_steps": settings.max_iterations,
        "learning_rate": ours["learning_rate"],
        "lr_scheduler_type": "constant",
        "temperature": ours["temperature"],
        "top_p": ours["top_p"],
        "top_k": ours["top_k"],
        "use_vllm": False,
        "report_to": "none",
        "logging_strategy": "steps" if settings.diagnose else "no",
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
        **settings.trl,
    }
    checkpoints = Checkpoints(settings, "trl")

    class Clock(TrainerCallback):
        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            torch.set_num_threads(settings.threads)  # in case the trainer's setup changed it
            checkpoints.begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if not checkpoints.boundary(state.global_step, trainer.model):
                control.should_training_stop = True

    trainer = trl.GRPOTrainer(model=settings.folder, reward_funcs=reward, args=trl.GRPOConfig(**config),
                              train_dataset=dataset, callbacks=[Clock()])  # fmt: skip
    setup_s = time.perf_counter() - setup
    steps: list[dict[str, float]] = []
    remove_hooks = record_optimizer_steps(steps)
    trainer.train()
    remove_hooks()
    checkpoints.boundary(trainer.state.global_step, trainer.model)  # a run cut by max_steps
    used = {key: getattr(trainer.args, key) for key in ("loss_type", "beta", "epsilon", "epsilon_high", "bf16")}
    used |= {"scale_rewards": str(trainer.args.scale_rewards), "max_grad_norm": trainer.args.max_grad_norm}
    return {
        **checkpoints.result(setup_s, trainer.state.global_step),
        "first_problems": [problems[index].prompt for index in first],
        "settings": {**ours, **used},
        "history": composite_reward.history,
        "optimizer_steps": steps,
        **({"log_history": trainer.state.log_history} if settings.diagnose else {}),
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
    }


def evaluate(settings: Settings) -> dict[str, dict[str, float]]:
    """Held-out success of the start model and of every snapshot, through ours' policy and evaluation."""
    import torch

    from algorithms import GRPO
    from algorithms.common.evaluation import evaluate_problems, held_out_problems

    torch.set_num_threads(settings.threads)
    model = GRPO("TransformerPolicy", make_env(settings), policy_kwargs={"model": settings.folder}, cold_start=False,
                 mixed_precision="no", seed=0, device="cpu")  # fmt: skip
    env = model.env
    problems = held_out_problems(env, settings.held_out, env.get_attr("difficulty", indices=[0])[0])
    results = {}
    for path in ["start", *settings.paths]:  # the start model first, as loaded
        if path != "start":
            model.policy.model.load_state_dict(torch.load(path))
        results[path] = {
            mode: evaluate_problems(model.policy, env, problems, seed=0, greedy=mode == "greedy").success_rate
            for mode in MODES
        }
    return results


WORKERS = {"start": start_model, "ours": run_ours, "trl": run_trl, "evaluate": evaluate}


def parse_args() -> argparse.Namespace:
    from algorithms.common.hyperparams import DEFAULT_CONFIG, load_hyperparams, parse_overrides

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=float, nargs="+", default=[60, 120, 300], help="training seconds")
    parser.add_argument("--iterations", type=int, nargs="+", default=[100, 300], help="iteration counts")
    parser.add_argument("--max-iterations", type=int, default=4000, help="the most iterations of a run")
    parser.add_argument("--seeds", type=int, default=3, help="runs per framework (seeds seed, seed+1, ...)")
    parser.add_argument("--seed", type=int, default=0, help="the start model's seed and the first run's")
    parser.add_argument("--held-out", type=int, default=200, help="held-out problems")
    parser.add_argument("--sft-steps", type=int, help="cold-start steps (default: the demo preset's)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each process")
    parser.add_argument("--ours", nargs="*", default=[], help="GRPO arguments, key=value (default: its defaults)")
    parser.add_argument("--trl", nargs="*", default=[], help="GRPOConfig arguments, key=value")
    parser.add_argument("--results", type=Path, help="write the section into this RESULTS.md")
    parser.add_argument("--plot", type=Path, help="the plot (default: learning_vs_trl.png next to --results)")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return args
    demo = load_hyperparams(DEFAULT_CONFIG, "R1Zero-v0", "demo")
    args.env_kwargs = demo.get("env_kwargs", {})
    cold = demo["cold_start_kwargs"]
    args.sft_steps = cold["steps"] if args.sft_steps is None else args.sft_steps
    args.sft = {**cold, "steps": args.sft_steps}  # the constructor's cold_start_kwargs
    args.ours, args.trl = parse_overrides(args.ours), parse_overrides(args.trl)
    if args.plot is None and args.results is not None:
        args.plot = args.results.parent / "learning_vs_trl.png"
    return args


def main() -> None:
    import json

    args = parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](Settings(**json.loads(args.settings)))))
        return
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="learning_vs_trl_") as tmp:
        base = Settings(folder=os.path.join(tmp, "model"), out=tmp, seed=args.seed, threads=args.threads,
                        budgets=args.budgets, iterations=args.iterations, max_iterations=args.max_iterations,
                        env_kwargs=args.env_kwargs, sft=args.sft, ours=args.ours, trl=args.trl,
                        held_out=args.held_out)  # fmt: skip
        start = run_worker(__file__, "start", asdict(base))
        print(f"start model: {args.sft_steps} SFT steps in {start['sft_s']:.0f} s", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {"ours": [], "trl": []}
        for index in range(args.seeds):
            for name in ("ours", "trl") if index % 2 == 0 else ("trl", "ours"):
                run = run_worker(__file__, name, {**asdict(base), "seed": args.seed + index})
                runs[name].append(run)
                print(f"{name} seed {args.seed + index}: {run['iterations']} iterations in {run['train_s']:.0f} s "
                      f"(others used {run['others']:.0%} of the CPUs)", flush=True)  # fmt: skip
        paths = [s["path"] for name in runs for run in runs[name] for s in run["snapshots"]]
        scores = run_worker(__file__, "evaluate", {**asdict(base), "paths": paths})
    body = report(args, start, runs, scores, load)
    print(body)
    if args.plot:
        plot(args.plot, args, runs, scores)
        print(f"plot written to {args.plot}")
    if args.results:
        title = f"`--budgets {' '.join(f'{b:g}' for b in args.budgets)} --seeds {args.seeds}`"
        update_results(args.results, SECTION, title, body)
        print(f"written to {args.results}")


if __name__ == "__main__":
    main()
