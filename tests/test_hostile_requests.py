"""Requests the server must not answer as if they were right, and clients that leave (algorithms/deploy/requests.py,
server.py, issue 37): a misspelt or unknown field is a 400 naming it and the field it meant, never a 200 with the
defaults; 300 clients that disconnect leave nothing in the server's log."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_hostile_server import folder, refused, served, server  # noqa: F401  (the fixtures)
from tests.test_server import ROOT, free_port


@pytest.mark.parametrize(
    ("fields", "param", "meant"),
    [
        ({"max_token": 200}, "max_token", "max_tokens"),
        ({"temperture": 0}, "temperture", "temperature"),
        ({"top-p": 0.5}, "top-p", "top_p"),
        ({"stops": ["\n"]}, "stops", "stop"),
        ({"logprob": 1}, "logprob", "logprobs"),
        ({"Prompt": "x"}, "Prompt", "prompt"),
    ],
)
def test_a_misspelt_field_gets_a_400_naming_it_and_the_field_it_meant(server, fields: dict, param: str, meant: str):  # noqa: F811
    """These were answered 200 with the defaults: 16 tokens at temperature 1."""
    url, _ = server
    answer = httpx.post(f"{url}/v1/completions", json={"prompt": "1+1=", **fields})
    refused(answer, param, f"unknown field {param!r}; did you mean {meant!r}?")


@pytest.mark.parametrize("fields", [{"top_k": 5}, {"repetition_penalty": 1.1}, {"": 1}, {"x" * 10_000: 1}])
def test_a_field_openai_does_not_have_is_refused_listing_the_fields(server, fields: dict) -> None:  # noqa: F811
    """vLLM's extras (top_k, ...) included: the server would ignore them."""
    url, _ = server
    answer = httpx.post(f"{url}/v1/completions", json={"prompt": "1+1=", **fields})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (
        error["message"].startswith("unknown field") and "the fields of a completion request: model" in error["message"]
    )
    assert len(error["message"]) < 500  # a 10,000-character name is cut in the message


def test_openai_fields_that_change_nothing_are_accepted_and_stream_options_refused(server) -> None:  # noqa: F811
    url, _ = server
    body = {"prompt": "1+1=", "max_tokens": 2, "model": "any name", "user": "user-1234"}
    assert httpx.post(f"{url}/v1/completions", json=body).status_code == 200
    answer = httpx.post(f"{url}/v1/completions", json={**body, "stream_options": {"include_usage": True}})
    refused(answer, "stream_options", "not supported")


def _raw_request(port: int, body: bytes, declared: int | None = None) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port))
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    client.sendall(f"{head}Content-Length: {declared or len(body)}\r\n\r\n".encode() + body)
    return client


@pytest.fixture
def serving(folder: Path, tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen, Path]]:  # noqa: F811
    """``grpo-gym serve`` with its log in a file (a pipe nobody reads would fill and stop the server)."""
    port, log = free_port(), tmp_path / "server.log"
    command = [
        sys.executable,
        "-m",
        "algorithms.cli",
        "serve",
        str(folder),
        "--port",
        str(port),
        "--max-wait-ms",
        "400",
    ]
    process = subprocess.Popen(
        command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None and time.monotonic() < deadline, "the server did not start"
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.2)
    try:
        yield port, process, log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=60)


def test_300_clients_that_disconnect_leave_nothing_in_the_log(serving: tuple[int, subprocess.Popen, Path]) -> None:
    """One that left while its body was read left uvicorn's 48-line "Exception in ASGI application" traceback
    (starlette's ClientDisconnect), one that left while waiting three lines of asyncio's "_GatheringFuture exception
    was never retrieved"."""
    port, process, log = serving
    body = json.dumps({"prompt": "1+1=", "max_tokens": 8}).encode()
    for i in range(300):
        client = _raw_request(port, body) if i % 6 else _raw_request(port, body[:5], declared=len(body) + 50)
        time.sleep(0.01)  # received and queued (the batch waits 400 ms), or half its body read
        client.close()
    time.sleep(1.0)
    health: dict[str, Any] = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).json()
    assert health["queued"] == 0 and health["running"] == 0
    process.terminate()
    process.wait(timeout=60)
    text = log.read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith(("INFO:", "Loading weights"))]
    assert lines == [], lines[:12]
