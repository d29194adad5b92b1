"""Distillation and INT8: size on disk, held-out success and tokens/s of the teacher, the student and its INT8 forms.

The teacher is a GRPO-trained model (``grpo-gym train --preset demo --save-path teacher.zip``). It is distilled
twice into the same smaller student (same seed, same steps): once in float (then quantised after training: PTQ)
and once through INT8 rounding (QAT). Four models are measured on the preset's env:

- size on disk: the ``save_pretrained`` folder (float) or the INT8 export folder: weights, config and tokenizer;
- held-out success on ``--problems`` held-out problems at the preset's difficulty, sampled with the policy's own
  settings (temperature 1, top-p 0.92: what ``grpo-gym train`` reports) and greedily;
- KL(teacher || model) per token on the teacher's completions of those problems;
- tokens/s: the problems' completions generated in one batch (as the evaluation does), and one prompt at a time.

Command (what ``benchmarks/RESULTS.md`` records)::

    python benchmarks/distill.py --teacher /tmp/teacher.zip --steps 1500 --out /tmp/distill \\
        --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import cpu_flags, cpu_name, others_share, update_results, usage

SECTION = "## Distillation and INT8: teacher, student, PTQ and QAT"
#: the default student: narrower and shallower than the built-in tiny model (128 wide, 4 layers, 0.80M parameters)
STUDENT = {"hidden_size": 96, "num_hidden_layers": 3, "intermediate_size": 256, "num_attention_heads": 4,
           "num_key_value_heads": 2}  # fmt: skip


def tokens_per_second(policy, ids: torch.Tensor, mask: torch.Tensor, repeats: int, batched: bool) -> float:
    """Generated tokens per second (median of ``repeats``): the whole batch in one call, or row by row."""
    rates = []
    for _ in range(repeats):
        started, tokens = time.perf_counter(), 0
        chunks = [(ids, mask)] if batched else [(ids[i : i + 1], mask[i : i + 1]) for i in range(min(len(ids), 16))]
        for chunk_ids, chunk_mask in chunks:
            keep = chunk_mask.sum(0) > 0  # drop the columns that are padding in every row of the chunk
            out = policy.generate(chunk_ids[:, keep], chunk_mask[:, keep], greedy=True)
            tokens += int(out.lengths.sum())
        rates.append(tokens / (time.perf_counter() - started))
    return statistics.median(rates)


def measure(name: str, path: Path, size_path: Path, env, teacher, problems, repeats: int) -> dict:
    from algorithms.common.evaluation import evaluate_problems
    from algorithms.common.rollout.batch import left_pad
    from algorithms.deploy import distillation_kl, load_policy
    from algorithms.deploy.commands import size_on_disk

    policy, _ = load_policy(path)
    policy.max_new_tokens = teacher.max_new_tokens
    prompts = [torch.as_tensor(env.env_method("encode_example", p.prompt, "", indices=[0])[0][0]) for p in problems]
    ids, mask = left_pad(prompts, policy.pad_token_id)
    row = {
        "model": name,
        "parameters": sum(p.numel() for p in policy.model.parameters())
        + sum(b.numel() for n, b in policy.model.named_buffers() if "weight_int8" in n),
        "size_mib": size_on_disk(size_path) / 2**20,
        "success": evaluate_problems(policy, env, problems, seed=0).success_rate,
        "greedy_success": evaluate_problems(policy, env, problems, seed=0, greedy=True).success_rate,
        "kl": distillation_kl(teacher, policy, env, n=len(problems)),
        "batch_tokens_s": tokens_per_second(policy, ids, mask, repeats, batched=True),
        "single_tokens_s": tokens_per_second(policy, ids, mask, repeats, batched=False),
    }
    print(row, flush=True)
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| model | parameters | size on disk | held-out success (sampled) | (greedy) | KL to teacher / token | "
        "tokens/s, batch | tokens/s, one prompt |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['parameters'] / 1e6:.2f}M | {r['size_mib']:.2f} MiB | {r['success']:.1%} | "
            f"{r['greedy_success']:.1%} | {r['kl']:.3f} | {r['batch_tokens_s']:,.0f} | {r['single_tokens_s']:,.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", required=True, help="a GRPO zip trained with --preset (the teacher)")
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--student", default=json.dumps(STUDENT), help="JSON config fields over the tiny model")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--problems", type=int, default=200, help="held-out problems")
    parser.add_argument("--repeats", type=int, default=3, help="timed generations per model")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="folder for the students and exports")
    parser.add_argument("--results", type=Path, help="write the table into this RESULTS.md")
    args = parser.parse_args()

    from algorithms import GRPO
    from algorithms.common.env_util import make_env
    from algorithms.common.evaluation import held_out_problems
    from algorithms.common.hyperparams import DEFAULT_CONFIG, load_hyperparams
    from algorithms.deploy import distill, quantize_int8, save_int8

    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)  # save_pretrained's atomic folder needs its parent to exist
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    start = usage()
    config = load_hyperparams(DEFAULT_CONFIG, "R1Zero-v0", args.preset)
    env = make_env("R1Zero-v0", 1, config.get("env_kwargs", {}), args.seed)
    tokenizer = env.get_attr("tokenizer", indices=[0])[0]
    teacher = GRPO.load(args.teacher, device="cpu")
    teacher.policy.save_pretrained(args.out / "teacher", tokenizer=tokenizer)
    seconds = {}
    for name, qat in (("student", False), ("student-qat", True)):
        started = time.perf_counter()
        distill(args.teacher, json.loads(args.student), env, steps=args.steps, batch_size=args.batch_size,
                learning_rate=args.learning_rate, int8_qat=qat, save_path=args.out / f"{name}.zip", seed=args.seed,
                progress_bar=True)  # fmt: skip
        seconds[name] = time.perf_counter() - started
    student = GRPO.load(args.out / "student.zip", device="cpu")
    save_int8(quantize_int8(student.policy.model), args.out / "student-ptq-int8", tokenizer)  # PTQ of the float one

    problems = held_out_problems(env, args.problems, float(env.get_attr("difficulty", indices=[0])[0]))
    models = [
        ("teacher fp32", args.out / "teacher"),
        ("student fp32", args.out / "student"),
        ("student PTQ INT8", args.out / "student-ptq-int8"),
        ("student QAT INT8", args.out / "student-qat-int8"),
    ]
    rows = [measure(name, path, path, env, teacher.policy, problems, args.repeats) for name, path in models]
    others = others_share(start, usage())
    body = "\n\n".join([
        f"Command: `python {' '.join(sys.argv)}` ({datetime.date.today()}).",
        f"torch {torch.__version__}, Python {platform.python_version()}; {os.cpu_count()}-core {cpu_name()} "
        f"(flags: {cpu_flags()}), no GPU, {args.threads} torch thread(s); other workers share this machine: their "
        f"processes used {others:.0%} of the CPUs during the run (`uptime` before it: {load}). "
        f"Teacher: `{args.teacher}`; student: `{args.student}`, {args.steps} steps of {args.batch_size} prompts "
        f"(float: {seconds['student']:.0f} s, QAT: {seconds['student-qat']:.0f} s). {args.problems} held-out "
        "problems at the preset's difficulty; tokens/s of greedy generation (batch: all problems in one call; one "
        "prompt: 16 problems one by one).",
        table(rows),
    ])  # fmt: skip
    print(body)
    if args.results:
        update_results(args.results, SECTION, f"`--steps {args.steps}`", body)


if __name__ == "__main__":
    main()
