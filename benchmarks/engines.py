"""Rollout engines: tokens/s of our sampler vs Hugging Face ``generate`` vs vLLM (CPU build), colocated and served.

One batch is a GRPO rollout: K=8 prompts x G=8 completions (each prompt repeated G times), the prompts of
``R1Zero-v0`` (arithmetic, ``template="compact"``) encoded with the built-in tokenizer and left-padded; the model
is a randomly initialised built-in Llama-style model (``tiny``, ``medium`` as the mid size, ``base``). Every engine
samples through the engine seam (:mod:`algorithms.common.generation.engines`) with temperature 1 and top-p 0.92,
and with no EOS, so every row generates ``--new-tokens`` tokens and the engines do the same work. Tokens/s is the
generated tokens of one call over its wall time, the median of ``--repeats`` calls after a warm-up call. Each engine
runs in a fresh process (its own memory, threads and imports); ``OMP_NUM_THREADS`` is ``--threads`` in each.
``weight sync`` is the median seconds of ``update_weights`` with the model's own weights (vLLM: the in-place reload,
or the file written and read by the server); ``start`` is the engine's construction (vLLM: its start, the server's
included for ``vllm-server``).

Engines: ``builtin`` (this project's KV-cache sampler), ``hf`` (``model.generate``), ``vllm`` (``vllm.LLM`` in the
process), ``vllm-server`` (a vLLM OpenAI server on 127.0.0.1 and its client). The vLLM ones need vLLM
(``bash .ci/install_vllm.sh``; run this script with that venv's python) and are left out without it.

**GRPO iterations** (the same run, a second table): one GRPO iteration (rollout of K=8 x G=8 completions of up to
``--new-tokens`` tokens on ``R1Zero-v0``, the update, the weight push) with each engine as ``rollout_engine`` (and
``rollout_engine_kwargs={"mode": "server"}`` for ``vllm-server``), float32, beta 0, no cold start: the median
seconds of ``--iterations`` iterations after a warm-up one, and the median push seconds, each engine and model in
its own process.

Commands (what ``benchmarks/RESULTS.md`` records; run on a quiet machine)::

    python benchmarks/engines.py --results benchmarks/RESULTS.md
    python benchmarks/engines.py --smoke            # tiny only, 16 tokens, 1 timed call: checks the script runs
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from common import cpu_flags, cpu_name, others_share, run_worker, update_results, usage

SECTION = "## Rollout engines: our sampler vs HF generate vs vLLM (CPU)"
N_GROUPS, GROUP_SIZE = 8, 8
ENGINES = ("builtin", "hf", "vllm", "vllm-server")
#: the same engines in bf16 on a CPU with native bf16 (ours: the sampling stage under autocast; vLLM: its dtype)
BF16_ENGINES = ("builtin-bf16", "vllm-bf16")
MODELS = ("tiny", "medium", "base")


def env_kwargs(model: str) -> dict[str, Any]:
    """The env of a model: a built-in one with the built-in tokenizer and the compact template; a model from a file
    or folder with its own tokenizer, chat template and the R1-Zero instructions (what ``grpo-gym train --model``
    trains it on)."""
    from algorithms.common.model.loading import is_builtin_model

    return {"template": "compact", "difficulty": 0.5} if is_builtin_model(model) else {"tokenizer": model}


def prompts(seed: int, model: str = "tiny"):
    """K distinct env prompts, each repeated G times, left-padded: ``(ids, mask, pad_id, vocab_size)``."""
    import torch

    import grpo_gym
    from algorithms.common.rollout.batch import left_pad

    env = grpo_gym.R1ZeroEnv(**env_kwargs(model))
    rows = []
    for k in range(N_GROUPS):
        observation, _ = env.reset(seed=seed + k)
        rows.extend([torch.as_tensor(observation["input_ids"][observation["attention_mask"] == 1])] * GROUP_SIZE)
    ids, mask = left_pad(rows, env.codec.pad_id)
    return ids, mask, env.codec.pad_id, env.codec.vocab_size


def kv_bytes(model, rows: int, columns: int) -> int:
    """Room in vLLM's KV cache for ``rows`` sequences of ``columns`` tokens (float32, keys and values), plus a half."""
    config = model.config
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head * 4
    return int(1.5 * rows * (columns + 64) * per_token) + (16 << 20)


class OwnSampler:
    """``rollout_engine="builtin"``: no engine object, the policy's own sampler
    (:func:`~algorithms.common.generation.sampler.sample`) on the live model, behind the engines' calls."""

    def __init__(self, model, sampling) -> None:
        self.model, self.sampling = model, sampling

    def generate(self, ids, mask, max_new_tokens: int, generator=None):
        from algorithms.common.generation.sampler import sample

        # the settings' fields are the sampler's keyword arguments, unchanged
        return sample(self.model, ids, mask, max_new_tokens=max_new_tokens, generator=generator, **vars(self.sampling))

    def update_weights(self, model) -> float:
        return 0.0  # it samples with the live weights

    def close(self) -> None:
        pass


def build_engine(name: str, model, sampling, columns: int, rows: int, dtype: str = "float32"):
    """The engine ``name`` on ``model``, and what to call once it is closed (None, or stopping the server);
    ``dtype``: vLLM's."""
    from algorithms.common.generation.engines.hf import HFGenerateEngine

    if name == "builtin":
        return OwnSampler(model, sampling), None
    if name == "hf":
        return HFGenerateEngine(model, sampling), None
    options = {"kv_cache_memory_bytes": kv_bytes(model, rows, columns), "max_model_len": columns + 16, "dtype": dtype}
    if name == "vllm":
        from algorithms.common.generation.engines.vllm_colocate import VLLMColocateEngine

        return VLLMColocateEngine(model, sampling, **options), None
    import socket
    import tempfile

    from algorithms.common.generation.engines.vllm_folder import export_folder
    from algorithms.common.generation.engines.vllm_launcher import start_vllm_server
    from algorithms.common.generation.engines.vllm_server import VLLMServerEngine

    scratch = Path(tempfile.mkdtemp(prefix="engines-bench-"))
    folder, _ = export_folder(model, sampling, scratch / "model")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = start_vllm_server(folder, port=port, startup_timeout=600, log_path=scratch / "server.log", **options)

    def stop() -> None:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    return VLLMServerEngine(server.base_url, model, sampling, push_on_connect=False), stop


def worker(name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Time one engine on one model (in this fresh process)."""
    import torch

    from algorithms.common.generation.engines.base import SamplingSettings
    from algorithms.common.model.loading import count_parameters, load_model

    torch.set_num_threads(settings["threads"])
    device = torch.device(settings.get("device", "cpu"))
    ids, mask, pad_id, vocab = prompts(settings["seed"], settings["model"])
    ids, mask = ids.to(device), mask.to(device)
    gpu = device.type == "cuda"  # bf16 for every engine on a GPU, float32 on a CPU (or bf16 for the -bf16 engines)
    bf16 = gpu or name.endswith("-bf16")
    name = name.removesuffix("-bf16")
    model = load_model(settings["model"], vocab_size=vocab, seed=settings["seed"]).eval()
    model = model.to(device, torch.bfloat16) if gpu else model
    sampling = SamplingSettings(eos_token_id=(), pad_token_id=pad_id, top_p=0.92, vocab_size=vocab)
    new_tokens = settings["new_tokens"]
    start = time.perf_counter()
    dtype = "bfloat16" if bf16 else "float32"
    engine, stop = build_engine(name, model, sampling, ids.shape[1] + new_tokens, ids.shape[0], dtype)
    started = time.perf_counter() - start
    generator = torch.Generator(device).manual_seed(settings["seed"])
    speeds, seconds, syncs = [], [], []
    # ours in bf16 on a CPU: the sampling stage's autocast (its decoder casts the weights once per call)
    precision = torch.autocast("cpu", torch.bfloat16) if bf16 and not gpu and name == "builtin" else nullcontext()
    try:
        with torch.no_grad(), precision:
            engine.generate(ids, mask, max_new_tokens=new_tokens, generator=generator)  # warm-up
            for _ in range(settings["repeats"]):
                begin = time.perf_counter()
                out = engine.generate(ids, mask, max_new_tokens=new_tokens, generator=generator)
                took = time.perf_counter() - begin
                speeds.append(int(out.lengths.sum()) / took)
                seconds.append(took)
                syncs.append(engine.update_weights(model))
    finally:
        engine.close()
        if stop is not None:
            stop()
    return {
        "tokens_per_s": statistics.median(speeds),
        "seconds": statistics.median(seconds),
        "sync_seconds": statistics.median(syncs),
        "start_seconds": started,
        "parameters": count_parameters(model),
        "prompt_width": int(ids.shape[1]),
    }


def iteration_worker(name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Time GRPO iterations with the engine ``name`` on one model (in this fresh process)."""
    import torch
    from stable_baselines3.common.callbacks import BaseCallback

    import grpo_gym
    from algorithms import GRPO

    torch.set_num_threads(settings["threads"])
    env = {**env_kwargs(settings["model"]), "max_new_tokens": settings["new_tokens"]}
    gpu = settings.get("device", "cpu") == "cuda"  # bf16 sampling and update on a GPU (mixed_precision auto)
    kwargs: dict[str, Any] = {
        "n_groups": N_GROUPS,
        "group_size": GROUP_SIZE,
        "cold_start": False,
        "beta": 0.0,
        "mixed_precision": "auto" if gpu else "no",
        "seed": settings["seed"],
        "device": settings.get("device", "cpu"),
        "policy_kwargs": {"model": settings["model"]},
        "rollout_engine_kwargs": {"enable_sleep_mode": gpu and settings.get("sleep", False)},
    }
    stop = None
    if name == "builtin-bf16":  # ours with bf16 sampling and a float32 update, corrected (sampler_correction auto)
        kwargs["mixed_precision"], name = {"sampling": "bf16"}, "builtin"
    if name != "builtin":
        kwargs["rollout_engine"] = "vllm" if name.startswith("vllm") else name
    if name == "vllm-server":
        from algorithms.common.model.loading import load_model

        model = load_model(settings["model"], vocab_size=grpo_gym.R1ZeroEnv().codec.vocab_size, seed=0).eval()
        url, stop = serve(model, settings["new_tokens"], gpu)
        kwargs["rollout_engine_kwargs"].update(mode="server", server_base_url=url)
    times: list[float] = []

    class Clock(BaseCallback):
        def _on_rollout_start(self) -> None:
            times.append(time.perf_counter())

        def _on_step(self) -> bool:
            return True

    try:
        with GRPO("TransformerPolicy", grpo_gym.R1ZeroEnv(**env), **kwargs) as grpo:
            engine, syncs = grpo.policy.rollout_engine, []
            for _ in range(settings["iterations"] + 1):  # the first is the warm-up
                grpo.learn(N_GROUPS * GROUP_SIZE, callback=Clock(), reset_num_timesteps=False)
                times.append(time.perf_counter())
                syncs.append(engine.last_sync_seconds if engine is not None else 0.0)
    finally:
        if stop is not None:
            stop()
    seconds = [end - begin for begin, end in zip(times[2::2], times[3::2], strict=True)]
    return {"iteration_seconds": statistics.median(seconds), "sync_seconds": statistics.median(syncs[1:])}


def serve(model, new_tokens: int, gpu: bool = False) -> tuple[str, Any]:
    """A vLLM server on ``model``'s folder (this run's format) on a free port: its URL and what stops it."""
    import socket
    import tempfile

    from algorithms.common.generation.engines.base import SamplingSettings
    from algorithms.common.generation.engines.vllm_folder import export_folder
    from algorithms.common.generation.engines.vllm_launcher import start_vllm_server

    scratch = Path(tempfile.mkdtemp(prefix="engines-bench-"))
    settings = SamplingSettings(1, 0, vocab_size=model.config.vocab_size)
    folder, _ = export_folder(model, settings, scratch / "model")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = {"kv_cache_memory_bytes": kv_bytes(model, N_GROUPS * GROUP_SIZE, 256 + new_tokens)}
    options.update({"dtype": "bfloat16", "gpu_memory_utilization": 0.3} if gpu else {})
    server = start_vllm_server(folder, port=port, startup_timeout=600, log_path=scratch / "server.log", **options)

    def stop() -> None:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    return server.base_url, stop


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


def table(args: argparse.Namespace, results: dict[tuple[str, str], dict[str, Any]], others: float) -> str:
    import torch

    versions = f"torch {torch.__version__}, Python {platform.python_version()}"
    if vllm_available():
        import vllm

        versions += f", vLLM {vllm.__version__}"
    lines = [
        f"Command: `python benchmarks/engines.py {' '.join(sys.argv[1:])}` ({datetime.date.today().isoformat()}).",
        "",
        f"{versions}; {os.cpu_count()}-core {cpu_name()} ({cpu_flags()}), no GPU; OMP_NUM_THREADS={args.threads}. "
        f"K={N_GROUPS} x G={GROUP_SIZE} rows, {args.new_tokens} new tokens each (no EOS), {args.repeats} timed "
        f"calls per engine, each engine in its own process. Other processes used {others:.0%} of the CPUs meanwhile.",
        "",
        "| model | engine | tokens/s (median) | s/call | vs builtin | weight sync (s) | start (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in args.models:
        base = results.get((model, "builtin"), {}).get("tokens_per_s")
        for engine in args.engines:
            r = results.get((model, engine))
            if r is None:
                continue
            ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
            size = f"{Path(model).name} ({r['parameters'] / 1e6:.1f}M)"
            lines.append(
                f"| {size} | {engine} | {r['tokens_per_s']:,.0f} | {r['seconds']:.3f} | {ratio} | "
                f"{r['sync_seconds']:.3f} | {r['start_seconds']:.1f} |"
            )
    return "\n".join(lines)


def iteration_table(args: argparse.Namespace, results: dict[tuple[str, str], dict[str, Any]]) -> str:
    """The GRPO iteration table: seconds per iteration and per push, per model and engine."""
    lines = [
        "",
        f"GRPO iterations: K={N_GROUPS} x G={GROUP_SIZE}, up to {args.new_tokens} new tokens, float32, beta 0; median "
        f"of {args.iterations} iterations after a warm-up one.",
        "",
        "| model | engine | s per iteration (median) | vs builtin | weight push (s) |",
        "|---|---|---|---|---|",
    ]
    for model in args.models:
        base = results.get((model, "builtin"), {}).get("iteration_seconds")
        for engine in args.engines:
            r = results.get((model, engine))
            if r is None:
                continue
            ratio = f"{r['iteration_seconds'] / base:.2f}x" if base else "-"
            lines.append(f"| {model} | {engine} | {r['iteration_seconds']:.2f} | {ratio} | {r['sync_seconds']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), help=f"{', '.join(MODELS)}, or a .gguf / folder")
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES + BF16_ENGINES)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per engine")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (every engine in bf16 there)")
    parser.add_argument("--sleep", action="store_true", help="GRPO on a GPU: vLLM's sleep mode between rollouts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=3, help="timed GRPO iterations per engine (0: none)")
    parser.add_argument("--smoke", action="store_true", help="tiny only, 16 tokens, 1 timed call, 1 iteration")
    parser.add_argument("--results", type=Path, help="write the table into this RESULTS.md")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, _, engine = args.worker.partition(":")
        job = iteration_worker if kind == "iteration" else worker
        print(json.dumps(job(engine or kind, json.loads(args.settings))), flush=True)
        return
    if args.smoke:
        args.models, args.new_tokens, args.repeats, args.iterations = ["tiny"], 16, 1, 1
    if not vllm_available():
        print("vLLM cannot be imported: the vllm engines are left out (bash .ci/install_vllm.sh)")
        args.engines = [e for e in args.engines if not e.startswith("vllm")]
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the workers' (vLLM's worker binds its own)
    begin, results = usage(), {}
    for model in args.models:
        for engine in args.engines:
            settings = {"model": model, "new_tokens": args.new_tokens, "repeats": args.repeats,
                        "threads": args.threads, "seed": args.seed, "device": args.device}  # fmt: skip
            results[(model, engine)] = run_worker(__file__, engine, settings)
            print(model, engine, results[(model, engine)], flush=True)
    iterations = {}
    for model in args.models if args.iterations else []:
        for engine in (e for e in args.engines if e != "vllm-bf16"):  # vLLM's dtype is the float32 update's
            settings = {"model": model, "new_tokens": args.new_tokens, "iterations": args.iterations,
                        "threads": args.threads, "seed": args.seed, "device": args.device,
                        "sleep": args.sleep}  # fmt: skip
            iterations[(model, engine)] = run_worker(__file__, f"iteration:{engine}", settings)
            print(model, engine, "GRPO", iterations[(model, engine)], flush=True)
    body = table(args, results, others_share(begin, usage()))
    body += "\n" + iteration_table(args, iterations) if iterations else ""
    print(body)
    if args.results and not args.smoke:
        update_results(args.results, SECTION, f"`--new-tokens {args.new_tokens}`", body)
        print(f"written to {args.results}")


if __name__ == "__main__":
    main()
