"""Episodes per second of R1Zero-v0 through OpenEnv (1 and 16 concurrent sessions) vs the in-process env.

An episode is one reset (a seeded problem) and one step (a whole completion, single-turn arithmetic: a third gold, a
third wrong answers, a third malformed, fixed up front). The server is ``grpo-gym openenv-serve`` in its own process
on 127.0.0.1, serving the env a served env gets by default (``TEXT_DEFAULTS``: 4096 new tokens, a 16384-token
window); the in-process rows use the same env. Rows:

- in-process: ``R1ZeroEnv`` stepped with token actions (as GRPO drives it), and ``R1ZeroText`` (the same env driven
  with text: the work the server does per episode);
- openenv-core's own ``GenericEnvClient``: N sessions, one thread each, each playing episodes back to back;
- the training path: :func:`~grpo_gym.interop.openenv.openenv_vec_env` (``LMEnvWrapper`` over each session) reset and
  stepped as GRPO's rollout does (``set_options`` + ``reset`` + ``step``), in ``ThreadedVecEnv`` (all sessions at
  once) and, for comparison, in SB3's ``DummyVecEnv`` (one session after another).

    python benchmarks/openenv_throughput.py --seconds 5 --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_gym.interop.r1zero_text import R1ZeroText, text_env  # noqa: E402

ENV_KWARGS: dict[str, Any] = {"task": "arithmetic"}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def episodes(n: int) -> list[tuple[int, str]]:
    """``n`` (seed, completion) pairs: a third gold, a third wrong answers, a third malformed."""
    env = text_env(ENV_KWARGS)
    pairs = []
    for seed in range(n):
        env.reset(seed=seed)
        reasoning, answer = env.task.solution(env.problem)
        text = [
            f"<think>{reasoning}</think><answer>{answer}</answer>",
            f"<think>{reasoning}</think><answer>{answer}1</answer>",
            f"{reasoning} <answer>{answer}",
        ][seed % 3]
        pairs.append((seed, text))
    return pairs


def timed(play: Any, seconds: float) -> float:
    """Episodes per second of ``play()`` (which returns the episodes it played) run until ``seconds`` pass."""
    play()  # warm-up
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        done += play()
    return done / (time.perf_counter() - start)


def in_process(pairs: list[tuple[int, str]], seconds: float) -> dict[str, float]:
    text = R1ZeroText(text_env(ENV_KWARGS))
    env = text.env
    actions = [(env.sample_problem(seed=seed), env.encode_action(completion)) for seed, completion in pairs]

    def tokens() -> int:
        for problem, action in actions:
            env.reset(options={"problem": problem})
            env.step(action)
        return len(actions)

    def texts() -> int:
        for seed, completion in pairs:
            text.reset(seed=seed)
            text.step(completion)
        return len(pairs)

    return {"R1ZeroEnv, token actions": timed(tokens, seconds), "R1ZeroText, text in and out": timed(texts, seconds)}


def client_rate(url: str, sessions: int, pairs: list[tuple[int, str]], seconds: float) -> float:
    """Episodes per second of ``sessions`` GenericEnvClient sessions, one thread each, for ``seconds``."""
    from openenv.core import GenericEnvClient

    clients = [GenericEnvClient(base_url=url).sync() for _ in range(sessions)]
    for client in clients:
        client.connect()
        client.reset(seed=0)
    counts = [0] * sessions
    barrier = threading.Barrier(sessions + 1)
    stop = [0.0]

    def run(i: int) -> None:
        barrier.wait()
        k = i
        while time.perf_counter() < stop[0]:
            seed, completion = pairs[k % len(pairs)]
            clients[i].reset(seed=seed)
            clients[i].step({"completion": completion})
            counts[i] += 1
            k += sessions

    threads = [threading.Thread(target=run, args=(i,)) for i in range(sessions)]
    for thread in threads:
        thread.start()
    start = time.perf_counter()
    stop[0] = start + seconds
    barrier.wait()
    for thread in threads:
        thread.join()
    rate = sum(counts) / (time.perf_counter() - start)
    for client in clients:
        client.close()
    return rate


def training_path_rate(url: str, sessions: int, pairs: list[tuple[int, str]], seconds: float, threaded: bool) -> float:
    """Episodes per second through ``openenv_vec_env``'s envs, reset and stepped as GRPO's rollout does."""
    import numpy as np
    from stable_baselines3.common.vec_env import DummyVecEnv

    from grpo_gym.interop.openenv import openenv_vec_env

    venv = openenv_vec_env(url, n_envs=sessions, tools=False, max_new_tokens=64, context_length=1024)
    if not threaded:
        envs = list(venv.envs)
        venv = DummyVecEnv([lambda env=env: env for env in envs])
    first = venv.envs[0]
    problems = [first.get_wrapper_attr("sample_problem")(seed=seed) for seed, _ in pairs]
    actions = [first.get_wrapper_attr("encode_action")(completion) for _, completion in pairs]
    cursor = [0]

    def batch() -> int:
        picks = [(cursor[0] + i) % len(pairs) for i in range(sessions)]
        cursor[0] += sessions
        venv.set_options([{"problem": problems[k]} for k in picks])
        venv.reset()
        venv.step(np.stack([actions[k] for k in picks]))
        return sessions

    rate = timed(batch, seconds)
    venv.close()
    return rate


def start_server(port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "algorithms.cli", "openenv-serve", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--env-kwargs", json.dumps(ENV_KWARGS), "--max-concurrent-envs", "64", "--log-level", "warning"]
    process = subprocess.Popen(command, cwd=ROOT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit("grpo-gym openenv-serve exited")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit("grpo-gym openenv-serve did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per row")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--results", default=None, help="append the table to this markdown file")
    args = parser.parse_args()
    pairs = episodes(300)
    load_before = load()
    rows: list[tuple[str, str, float]] = [
        ("in-process", name, rate) for name, rate in in_process(pairs, args.seconds).items()
    ]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = start_server(port)
    url = f"http://127.0.0.1:{port}"
    try:
        for n in args.sessions:
            where = f"OpenEnv, {n} session{'s' * (n > 1)}"
            rows.append((where, "GenericEnvClient, a thread each", client_rate(url, n, pairs, args.seconds)))
            rate = training_path_rate(url, n, pairs, args.seconds, threaded=True)
            rows.append((where, "openenv_vec_env (ThreadedVecEnv)", rate))
            if n > 1:
                rate = training_path_rate(url, n, pairs, args.seconds, threaded=False)
                rows.append((where, "the same envs in DummyVecEnv", rate))
    finally:
        server.terminate()
        server.wait(30)
    load_after = load()
    base = rows[0][2]
    lines = ["| where | driven by | episodes/s | vs in-process R1ZeroEnv |", "|---|---|---|---|"]
    lines += [f"| {where} | {how} | {rate:,.0f} | {rate / base:.3f}x |" for where, how, rate in rows]
    machine = f"{os.cpu_count()} cores of {cpu_model()}, Python {platform.python_version()}"
    footer = f"Machine: {machine}. Load average (1/5/15 min) before: {load_before}; after: {load_after}."
    table = "\n".join(lines)
    print(table + "\n\n" + footer)
    if args.results:
        command = "python benchmarks/openenv_throughput.py " + " ".join(sys.argv[1:])
        text = f"\nCommand: `{command}` ({time.strftime('%Y-%m-%d')})\n\n{table}\n\n{footer}\n"
        with open(args.results, "a", encoding="utf-8") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
