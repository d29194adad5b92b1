"""Serving load test: dynamic batching vs one-at-a-time, and the INT8 student, over real HTTP on loopback.

Each configuration starts ``grpo-gym serve`` in its own process on a free loopback port, then a bounded async httpx
client drives it at 1, 8, 32 and 128 concurrent clients for ``--duration`` seconds each: every client sends a
request, waits for the answer, sends the next. Prompts are the env's (``--preset``'s template and task) at mixed
difficulties, hence mixed prompt lengths; requests are greedy (temperature 0) with ``--max-tokens`` new tokens, so
every answer is checked against what the model generates for that prompt alone (the same model loaded here,
``policy.generate`` on the one prompt): batching must not change greedy outputs.

Configurations: ``batched`` (the server's defaults: dynamic batching by prompt-length bucket), ``one-at-a-time``
(the same server with ``--max-batch-size 1 --max-wait-ms 0``) and, with ``--int8``, the INT8 student batched.
Throughput counts completions (and their completion tokens) per second of the window; latency is per request,
from sending to the full answer. The target: batched >= 4x one-at-a-time throughput at 32 clients, with the
batched p99 latency at 32 clients <= 2x the p50 latency at 1 client.

Command (what ``benchmarks/RESULTS.md`` records)::

    python benchmarks/serving.py --model /tmp/teacher.zip --int8 /tmp/student-int8 --preset demo \\
        --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import busy_cpu_seconds, cpu_flags, cpu_name, update_results

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Serving: dynamic batching vs one at a time"
CLIENTS = (1, 8, 32, 128)


def prompt_pool(preset: str | None, n: int) -> list[str]:
    """``n`` env prompts at difficulties 0.1 ... 1.0 (mixed lengths), in a fixed order."""
    from algorithms.common.hyperparams import DEFAULT_CONFIG, load_hyperparams
    from grpo_gym import R1ZeroEnv

    env_kwargs = dict(load_hyperparams(DEFAULT_CONFIG, "R1Zero-v0", preset).get("env_kwargs", {}))
    env_kwargs.pop("difficulty", None)
    env = R1ZeroEnv(**env_kwargs)
    levels = [0.1 * (1 + i % 10) for i in range(n)]
    return [env.formatter.prompt(env.sample_problem(level, seed=10**9 + i).prompt) for i, level in enumerate(levels)]


def expected_answers(model: str, prompts: list[str], max_tokens: int) -> dict[str, str]:
    """What the model generates for each prompt alone, greedily (the reference every served answer must equal)."""
    from algorithms.deploy.loading import load_policy

    policy, tokenizer = load_policy(model)
    answers = {}
    for prompt in prompts:
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        out = policy.generate(ids, torch.ones_like(ids), greedy=True, max_new_tokens=max_tokens)
        tokens = out.tokens[0, : int(out.lengths[0])].tolist()
        answers[prompt] = tokenizer.decode(tokens, skip_special_tokens=True)
    return answers


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(model: str, flags: list[str], threads: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "algorithms.cli", "serve", model, "--port", str(port), "--log-level", "warning"]
    command += ["--threads", str(threads), *flags]
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start: {' '.join(command)}")
        try:
            httpx.get(f"{url}/health", timeout=1)
            return process, url
        except httpx.TransportError:
            time.sleep(0.2)


async def drive(url: str, prompts: list[str], expected: dict[str, str], clients: int, duration: float, max_tokens):
    """``clients`` closed-loop clients for ``duration`` seconds: latencies, completion tokens, mismatches, errors."""
    latencies: list[float] = []
    tokens, mismatches, errors = [0], [0], [0]
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        started = time.monotonic()
        stop = started + duration

        async def one_client(offset: int) -> None:
            k = offset
            while time.monotonic() < stop:
                prompt = prompts[k % len(prompts)]
                k += clients
                sent = time.monotonic()
                body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
                answer = await client.post("/v1/completions", json=body)
                if answer.status_code != 200:
                    errors[0] += 1
                    continue
                latencies.append(time.monotonic() - sent)
                result = answer.json()
                tokens[0] += result["usage"]["completion_tokens"]
                mismatches[0] += result["choices"][0]["text"] != expected[prompt]

        await asyncio.gather(*(one_client(i) for i in range(clients)))
        elapsed = time.monotonic() - started
    return {"elapsed": elapsed, "latencies": latencies, "tokens": tokens[0], "mismatches": mismatches[0],
            "errors": errors[0]}  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def run_config(label, model, flags, args, prompts, expected) -> list[dict]:
    process, url = start_server(model, flags, args.threads)
    rows = []
    try:
        asyncio.run(drive(url, prompts, expected, 8, args.warmup, args.max_tokens))
        for clients in CLIENTS:
            result = asyncio.run(drive(url, prompts, expected, clients, args.duration, args.max_tokens))
            lat = result["latencies"]
            rows.append({
                "config": label, "clients": clients, "completions": len(lat),
                "per_s": len(lat) / result["elapsed"], "tokens_per_s": result["tokens"] / result["elapsed"],
                "p50": percentile(lat, 50) * 1000, "p99": percentile(lat, 99) * 1000,
                "mismatches": result["mismatches"], "errors": result["errors"],
            })  # fmt: skip
            print(rows[-1], flush=True)
    finally:
        process.terminate()
        process.wait(timeout=120)
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| server | clients | completions | completions/s | tokens/s | p50 ms | p99 ms | vs one-at-a-time | "
        "greedy answers differing | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    single = {r["clients"]: r["per_s"] for r in rows if r["config"] == "one-at-a-time"}
    for r in rows:
        ratio = f"{r['per_s'] / single[r['clients']]:.2f}x" if single.get(r["clients"]) else "-"
        lines.append(
            f"| {r['config']} | {r['clients']} | {r['completions']} | {r['per_s']:.1f} | {r['tokens_per_s']:.0f} | "
            f"{r['p50']:.0f} | {r['p99']:.0f} | {ratio} | {r['mismatches']} | {r['errors']} |"
        )
    return "\n".join(lines)


def verdict(rows: list[dict]) -> str:
    pick = {(r["config"], r["clients"]): r for r in rows}
    batched, single, alone = pick[("batched", 32)], pick[("one-at-a-time", 32)], pick[("batched", 1)]
    speedup = batched["per_s"] / single["per_s"]
    bound = 2 * alone["p50"]
    return (
        f"At 32 clients dynamic batching serves {speedup:.2f}x the completions/s of one-at-a-time (target >= 4x: "
        f"{'met' if speedup >= 4 else 'not met'}); its p99 latency there is {batched['p99']:.0f} ms against 2x the "
        f"1-client p50 = {bound:.0f} ms (target: {'met' if batched['p99'] <= bound else 'not met'})."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the model to serve (zip or folder)")
    parser.add_argument("--int8", default=None, help="an INT8 export to serve batched as well")
    parser.add_argument("--preset", default="demo", help="the zoo preset whose env makes the prompts")
    parser.add_argument("--prompts", type=int, default=64, help="distinct prompts in the pool")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per concurrency level")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of warm-up per server")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server process")
    parser.add_argument("--results", type=Path, help="write the table into this RESULTS.md")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    prompts = prompt_pool(args.preset, args.prompts)
    lengths = sorted(len(p) for p in prompts)
    load, busy, mine, started = uptime(), busy_cpu_seconds(), own_cpu_seconds(), time.monotonic()
    expected = expected_answers(args.model, prompts, args.max_tokens)
    rows = run_config("batched", args.model, [], args, prompts, expected)
    rows += run_config("one-at-a-time", args.model, ["--max-batch-size", "1", "--max-wait-ms", "0"], args, prompts,
                       expected)  # fmt: skip
    if args.int8:
        expected_int8 = expected_answers(args.int8, prompts, args.max_tokens)
        rows += run_config("INT8 student, batched", args.int8, [], args, prompts, expected_int8)
    wall = time.monotonic() - started
    others = max(0.0, busy_cpu_seconds() - busy - (own_cpu_seconds() - mine)) / (wall * os.cpu_count()) * 100
    body = "\n\n".join([
        f"Command: `python {' '.join(sys.argv)}` ({datetime.date.today()}).",
        f"torch {torch.__version__}, Python {platform.python_version()}; {os.cpu_count()}-core {cpu_name()} "
        f"(flags: {cpu_flags()}), no GPU; server: 1 process, {args.threads} torch thread(s); the client runs on the "
        "same machine. Prompts: "
        f"{len(prompts)} distinct, {lengths[0]}-{lengths[-1]} characters (tokens), max_tokens {args.max_tokens}, "
        f"greedy; {args.duration:.0f} s per level. Other workers share this machine: their processes used "
        f"{others:.0f}% of the CPUs during the run (`uptime` before it: {load}).",
        table(rows),
        verdict(rows),
    ])  # fmt: skip
    print(body)
    if args.results:
        update_results(args.results, SECTION, f"`{Path(args.model).name}`, --duration {args.duration:.0f}", body)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def own_cpu_seconds() -> float:
    """CPU seconds used by this process and its finished children (the servers)."""
    import resource

    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


if __name__ == "__main__":
    main()
