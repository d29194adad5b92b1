"""The completion server over real HTTP on a loopback port: answers, batching, errors, overload, disconnect, SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import httpx
import pytest
import torch
import uvicorn
from stable_baselines3.common.vec_env import DummyVecEnv

import grpo_gym  # noqa: F401
from algorithms import GRPO
from algorithms.common.evaluation import held_out_problems
from algorithms.deploy.loading import load_policy
from algorithms.deploy.server import ServerSettings, create_app
from tests.sizes import ENV_KWARGS, TINY

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model after a short cold start (it writes the template and stops at EOS), as a save_pretrained folder."""
    model = GRPO("TransformerPolicy", gym.make("R1Zero-v0", **ENV_KWARGS), policy_kwargs=TINY, seed=0)
    model.sft_steps, model.sft_batch_size, model.sft_learning_rate = 60, 16, 3e-3
    model.run_cold_start()
    path = tmp_path_factory.mktemp("served") / "model"
    model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    venv = DummyVecEnv([lambda: gym.make("R1Zero-v0", **ENV_KWARGS)])
    problems = held_out_problems(venv, 16, 0.1)
    return [venv.envs[0].unwrapped.formatter.prompt(p.prompt) for p in problems]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Running:
    """A uvicorn server for ``app`` on a free loopback port, in a thread; stopped cleanly on exit."""

    def __init__(self, app) -> None:
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.server.config.port}"

    def __exit__(self, *_) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()


@pytest.fixture(scope="module")
def served(folder: Path) -> tuple:
    return load_policy(folder)


@pytest.fixture
def server(served: tuple) -> Iterator[tuple[str, object]]:
    policy, tokenizer = served
    app = create_app(policy, tokenizer, "tiny-test", ServerSettings(max_wait_ms=30, max_tokens_limit=64))
    with Running(app) as url:
        yield url, app


def alone(served: tuple, prompt: str, max_tokens: int) -> str:
    """What the model generates for ``prompt`` by itself, greedily: the reference batching must not change."""
    return generated(served, prompt, max_tokens)[0]


def generated(served: tuple, prompt: str, max_tokens: int) -> tuple[str, bool]:
    """``(text, ended at EOS)`` of the model's greedy completion of ``prompt`` by itself."""
    policy, tokenizer = served
    ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
    out = policy.generate(ids, torch.ones_like(ids), greedy=True, max_new_tokens=max_tokens)
    tokens = out.tokens[0, : int(out.lengths[0])].tolist()
    return tokenizer.decode(tokens, skip_special_tokens=True), tokens[-1] == policy.eos_token_id


def post_all(url: str, bodies: list[dict], timeout: float = 120) -> list[httpx.Response]:
    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
            return await asyncio.gather(*(client.post("/v1/completions", json=body) for body in bodies))

    return asyncio.run(main())


def test_health_models_and_one_completion(server, served, prompts) -> None:
    url, _ = server
    assert httpx.get(f"{url}/health").json() == {"status": "ok", "model": "tiny-test", "queued": 0, "running": 0}
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "tiny-test"
    answer = httpx.post(f"{url}/v1/completions", json={"prompt": prompts[0], "max_tokens": 24, "temperature": 0})
    assert answer.status_code == 200
    body = answer.json()
    assert body["object"] == "text_completion" and body["model"] == "tiny-test"
    [choice] = body["choices"]
    assert choice["text"] == alone(served, prompts[0], 24) and choice["text"].startswith("<think>")
    assert choice["finish_reason"] in ("stop", "length") and choice["index"] == 0
    usage = body["usage"]
    assert (
        usage["prompt_tokens"] == len(prompts[0])
        and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    )


def test_greedy_answers_under_batching_equal_unbatched_ones(server, served, prompts) -> None:
    url, app = server
    bodies = [{"prompt": p, "max_tokens": 8 + 2 * i, "temperature": 0} for i, p in enumerate(prompts)]
    answers = post_all(url, bodies)
    assert all(a.status_code == 200 for a in answers)
    for body, answer in zip(bodies, answers, strict=True):
        assert answer.json()["choices"][0]["text"] == alone(served, body["prompt"], body["max_tokens"])
    assert app.state.batcher.batches < len(bodies)  # they were batched


def test_several_prompts_n_completions_stop_strings_and_sampling(server, served, prompts) -> None:
    url, _ = server
    body = {"prompt": prompts[:2], "n": 2, "max_tokens": 24, "temperature": 0, "stop": ["</think>", "zzz"]}
    choices = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    for k, prompt in enumerate(prompts[:2]):
        full, ended = generated(served, prompt, 24)
        for choice in choices[2 * k : 2 * k + 2]:
            assert choice["text"] == full.split("</think>")[0]
            assert choice["finish_reason"] == ("stop" if "</think>" in full or ended else "length")
    sampled = httpx.post(f"{url}/v1/completions", json={"prompt": prompts[0], "temperature": 0.8, "top_p": 0.5})
    assert sampled.status_code == 200 and len(sampled.json()["choices"]) == 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 65}, "max_tokens"),
        ({"prompt": "x", "temperature": "hot"}, "temperature"),
        ({"prompt": "x", "temperature": 2.5}, "temperature"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "n": 65}, "n"),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt": "x", "stream": True}, "stream"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x" * 2040, "max_tokens": 16}, "prompt"),
        ({"max_tokens": 3}, "prompt"),
    ],
)
def test_bad_requests_get_400_naming_the_field(server, body: dict, param: str) -> None:
    url, _ = server
    answer = httpx.post(f"{url}/v1/completions", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and param in error["message"]


def test_full_queue_answers_503_with_retry_after(served, prompts) -> None:
    policy, tokenizer = served
    settings = ServerSettings(max_wait_ms=0, max_batch_size=1, max_queue=2)
    with Running(create_app(policy, tokenizer, "m", settings)) as url:
        answers = post_all(url, [{"prompt": p, "max_tokens": 24, "temperature": 0} for p in prompts])
    refused = [a for a in answers if a.status_code == 503]
    assert refused and len(refused) < len(answers)
    assert all(int(a.headers["Retry-After"]) >= 1 and a.json()["error"]["type"] == "server_busy" for a in refused)
    assert all(a.status_code == 200 for a in answers if a not in refused)


def test_a_client_that_disconnects_frees_its_place(served, prompts) -> None:
    policy, tokenizer = served
    app = create_app(policy, tokenizer, "m", ServerSettings(max_wait_ms=0, max_batch_size=1))
    batcher = app.state.batcher
    run_batch, started = batcher.run_batch, threading.Event()

    def slow(jobs):  # the first batch holds the model long enough for the second request to wait in the queue
        started.set()
        time.sleep(1.5)
        return run_batch(jobs)

    batcher.run_batch = slow
    with Running(app) as url:
        first = threading.Thread(target=httpx.post, args=(f"{url}/v1/completions",), kwargs={"json": {"prompt": "a"}})
        first.start()
        started.wait(timeout=30)
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{url}/v1/completions", json={"prompt": "b"}, timeout=0.3)
        deadline = time.monotonic() + 10
        while batcher.queued_rows and time.monotonic() < deadline:
            time.sleep(0.02)
        assert batcher.queued_rows == 0 and batcher.running  # out of the queue while the first still runs
        first.join(timeout=60)
    assert batcher.batches == 1  # the second request never ran


def test_sigterm_drains_requests_in_flight_then_exits(folder: Path, prompts) -> None:
    port = free_port()
    command = [sys.executable, "-m", "algorithms.cli", "serve", str(folder), "--port", str(port)]
    command += ["--max-wait-ms", "1500", "--max-batch-size", "8", "--log-level", "warning"]
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None and time.monotonic() < deadline, "the server did not start"
            try:
                httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        answers: list[httpx.Response] = []

        def ask(prompt: str) -> None:
            body = {"prompt": prompt, "max_tokens": 24, "temperature": 0}
            answers.append(httpx.post(f"{url}/v1/completions", json=body, timeout=120))

        clients = [threading.Thread(target=ask, args=(p,)) for p in prompts[:4]]
        for client in clients:
            client.start()
        while httpx.get(f"{url}/health").json()["queued"] < 4:  # all four wait for their batch (max_wait_ms)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        for client in clients:
            client.join(timeout=120)
        assert process.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once drained
    finally:
        if process.poll() is None:
            process.kill()
    assert len(answers) == 4 and all(a.status_code == 200 for a in answers)
    assert all(a.json()["choices"][0]["text"].startswith("<think>") for a in answers)
