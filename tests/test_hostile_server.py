"""Hostile input to the deployment surfaces: the server's requests (size, encoding, JSON, types, tiny temperatures,
rows the queue can never hold), its flags, corrupt models and INT8 exports, quantize's output folder, distill's
numbers. Each ends in a clear error naming the input (or the right answer), before any work."""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

import grpo_gym  # noqa: F401
from algorithms import GRPO
from algorithms.cli import main as cli_main
from algorithms.common.policies import TransformerPolicy
from algorithms.deploy.distill import distill
from algorithms.deploy.loading import load_policy
from algorithms.deploy.quantize import (
    WEIGHTS_FILE,
    Int8Linear,
    check_int8_scales,
    is_int8_folder,
    load_int8,
    quantize_int8,
    save_int8,
)
from algorithms.deploy.server import ServerSettings, create_app, serve
from grpo_gym.tokenizer import build_char_tokenizer
from grpo_gym.validation import ArgumentError
from tests.sizes import ENV_KWARGS, TINY
from tests.test_server import Running


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "model"
    GRPO("TransformerPolicy", gym.make("R1Zero-v0", **ENV_KWARGS), policy_kwargs=TINY, seed=0).save_pretrained(
        str(path)
    )
    return path


@pytest.fixture(scope="module")
def served(folder: Path) -> tuple:
    return load_policy(folder)


@pytest.fixture
def server(served: tuple) -> Iterator[tuple[str, Any]]:
    policy, tokenizer = served
    settings = ServerSettings(max_wait_ms=5, max_tokens_limit=32, max_queue=8, max_batch_size=4, max_body_bytes=2**16)
    app = create_app(policy, tokenizer, "hostile", settings)
    with Running(app) as url:
        yield url, app


def post_raw(url: str, content: bytes) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", content=content, headers={"content-type": "application/json"})


def refused(answer: httpx.Response, param: str | None, words: str, status: int = 400) -> None:
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and words in error["message"], error


# ---------------------------------------------------------------------------------------------- prompt size, loop
def test_a_huge_prompt_is_refused_before_tokenizing(served) -> None:
    policy, tokenizer = served
    app = create_app(policy, tokenizer, "m", ServerSettings(max_wait_ms=5))
    calls: list[int] = []
    encode = app.state.runner.encode
    app.state.runner.encode = lambda text: calls.append(len(text)) or encode(text)
    with Running(app) as url:
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": "x" * 5_000_000}, timeout=60)
        refused(answer, "prompt", "5000000 characters, more than the server's max_prompt_chars (131072)")
        refused(httpx.post(f"{url}/v1/completions", json={"prompt": ["ok", "y" * 131_073]}), "prompt", "prompt[1]")
        assert httpx.get(f"{url}/health").json()["status"] == "ok"
    assert calls == []  # never tokenized


def test_tokenizing_runs_off_the_event_loop_so_health_keeps_answering(served) -> None:
    policy, tokenizer = served
    app = create_app(policy, tokenizer, "m", ServerSettings(max_wait_ms=5, max_tokens_limit=8))
    started, release = threading.Event(), threading.Event()
    encode = app.state.runner.encode

    def slow_encode(text: str) -> list[int]:
        started.set()
        assert release.wait(60)
        return encode(text)

    app.state.runner.encode = slow_encode
    answers: list[httpx.Response] = []
    with Running(app) as url:
        body = {"prompt": "What is 1+1?", "max_tokens": 4, "temperature": 0}
        client = threading.Thread(target=lambda: answers.append(httpx.post(f"{url}/v1/completions", json=body)))
        client.start()
        assert started.wait(60)
        health = httpx.get(f"{url}/health", timeout=10)  # answered while the prompt is being tokenized
        release.set()
        client.join(60)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert answers[0].status_code == 200


def test_a_body_past_max_body_bytes_gets_413(server) -> None:
    url, _ = server
    refused(post_raw(url, json.dumps({"prompt": "x" * 70_000}).encode()), None, "max_body_bytes (65536)", 413)


# ---------------------------------------------------------------------------------------------- rows, types
@pytest.mark.parametrize(
    ("body", "param"),
    [({"prompt": ["a"] * 9}, "prompt"), ({"prompt": "a", "n": 9}, "n"), ({"prompt": ["a"] * 3, "n": 3}, "prompt")],
)
def test_a_request_the_queue_can_never_hold_gets_400_not_503(server, body: dict, param: str) -> None:
    url, _ = server
    answer = httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": 2})
    assert answer.status_code == 400 and "Retry-After" not in answer.headers
    refused(answer, param, "more than the server's queue can ever hold (8)")


@pytest.mark.parametrize(
    ("content", "param", "words"),
    [
        (b'{"prompt": "bad \\ud800"}', "prompt", "lone surrogate U+D800"),
        (b'{"prompt": ["ok", "\\udfff"]}', "prompt", "prompt[1] holds a lone surrogate"),
        (b'{"prompt": "ok", "stop": ["\\ud83d"]}', "stop", "lone surrogate"),
        (b'{"prompt": "caf\xe9"}', None, "not UTF-8 text (byte 0xe9"),
        (b'{"prompt": "x", ', None, "not valid JSON"),
        (b"", None, "not valid JSON"),
        (b'{"prompt": "x", "temperature": NaN}', None, "NaN is not a JSON value"),
        (b'{"prompt": "x", "top_p": Infinity}', None, "Infinity is not a JSON value"),
        (b"[" * 60_000, None, "not valid JSON (nested too deeply)"),
        (b'["x"]', None, "valid dictionary"),
        (b'{"prompt": "x", "max_tokens": true}', "max_tokens", "valid integer"),
        (b'{"prompt": "x", "max_tokens": 4.0}', "max_tokens", "valid integer"),
        (b'{"prompt": "x", "max_tokens": "4"}', "max_tokens", "valid integer"),
        (b'{"prompt": "x", "n": true}', "n", "valid integer"),
        (b'{"prompt": "x", "temperature": true}', "temperature", "valid number"),
        (b'{"prompt": "x", "stream": 1}', "stream", "valid boolean"),
        (b'{"prompt": 5}', "prompt", "valid string"),
    ],
)
def test_malformed_bodies_get_an_openai_style_400_naming_the_problem(server, content: bytes, param, words) -> None:
    url, _ = server
    refused(post_raw(url, content), param, words)


@pytest.mark.parametrize(
    "fields",
    [
        {"seed": 1},
        {"best_of": 3},
        {"suffix": "zz"},
        {"presence_penalty": 2.0},
        {"frequency_penalty": -1.0},
        {"logit_bias": {"50": 100}},
        {"logprobs": 0},
    ],
)
def test_an_openai_field_the_server_does_not_implement_is_refused_not_ignored(server, fields: dict) -> None:
    """These were ignored: a request with ``seed`` got a different sample each time, ``presence_penalty`` changed
    nothing, and nothing said so."""
    url, _ = server
    (name,) = fields
    refused(
        httpx.post(f"{url}/v1/completions", json={"prompt": "1+1=", "max_tokens": 2, **fields}), name, "not supported"
    )


def test_their_neutral_values_are_accepted(server) -> None:
    url, _ = server
    neutral = {"best_of": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "seed": None}
    assert httpx.post(f"{url}/v1/completions", json={"prompt": "1+1=", "max_tokens": 2, **neutral}).status_code == 200


def test_a_seed_with_greedy_decoding_is_accepted_as_lm_eval_sends_it(server) -> None:
    """lm-evaluation-harness's local-completions sends "seed": 1234 with temperature 0 in every request: greedy
    answers repeat without a seed, so it is accepted there (and refused only where it would be ignored)."""
    url, _ = server
    body = {"prompt": "1+1=", "max_tokens": 4, "temperature": 0, "seed": 1234, "stop": ["\n"]}
    answers = [httpx.post(f"{url}/v1/completions", json=body) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json()["choices"][0]["text"] == answers[1].json()["choices"][0]["text"]


@pytest.mark.parametrize(("method", "path", "status"), [("GET", "/v1/completions", 405), ("POST", "/v1/chat", 404)])
def test_an_unserved_route_gets_an_openai_style_error(server, method: str, path: str, status: int) -> None:
    url, _ = server
    answer = httpx.request(method, f"{url}{path}", json={})
    assert answer.status_code == status
    error = answer.json()["error"]
    assert path in error["message"] and "POST /v1/completions" in error["message"]


def test_the_server_survives_every_malformed_body(server) -> None:
    url, _ = server
    assert httpx.post(f"{url}/v1/completions", json={"prompt": "1+1=", "max_tokens": 2}).status_code == 200


# ---------------------------------------------------------------------------------------------- tiny temperature, top_p
@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 1e-30}, {"temperature": 5e-324}, {"top_p": 1e-30}, {"top_p": 5e-324}, {"temperature": 1e-6}],
)
def test_a_tiny_temperature_or_top_p_decodes_greedily(server, sampling: dict) -> None:
    url, _ = server
    body = {"prompt": "User: What is 1+2?\nAssistant: ", "max_tokens": 12}
    greedy = httpx.post(f"{url}/v1/completions", json={**body, "temperature": 0}).json()["choices"][0]
    tiny = httpx.post(f"{url}/v1/completions", json={**body, **sampling}).json()["choices"][0]
    assert (tiny["text"], tiny["finish_reason"]) == (greedy["text"], greedy["finish_reason"])
    assert tiny["text"] or tiny["finish_reason"] == "stop"


def test_the_python_api_refuses_a_temperature_float32_cannot_use(served) -> None:
    policy, _ = served
    ids = torch.randint(3, 100, (2, 7))
    with pytest.raises(ValueError, match=r"temperature must be >= 1e-05 \(use greedy=True"):
        policy.generate(ids, torch.ones_like(ids), temperature=1e-30, max_new_tokens=2)
    with pytest.raises(ArgumentError, match="temperature"):
        TransformerPolicy(policy.observation_space, policy.action_space, lambda _: 0.0, model="tiny", temperature=1e-40)
    nucleus = policy.generate(ids, torch.ones_like(ids), top_p=5e-324, max_new_tokens=6)  # the argmax always stays
    greedy = policy.generate(ids, torch.ones_like(ids), greedy=True, max_new_tokens=6)
    assert torch.equal(nucleus.tokens, greedy.tokens)


# ---------------------------------------------------------------------------------------------- flags
@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--port", "99999"], "--port"),
        (["--port", "-1"], "--port"),
        (["--max-wait-ms", "nan"], "--max-wait-ms"),
        (["--max-batch-size", "0"], "--max-batch-size"),
        (["--max-queue", "-5"], "--max-queue"),
        (["--max-body-bytes", "0"], "--max-body-bytes"),
        (["--max-prompt-chars", "0"], "--max-prompt-chars"),
        (["--drain-timeout", "-1"], "--drain-timeout"),
        (["--drain-timeout", "nan"], "--drain-timeout"),
        (["--threads", "0"], "--threads"),
        (["--log-level", "loud"], "log_level"),
    ],
)
def test_bad_serve_flags_are_refused_before_loading(tmp_path: Path, capsys, flags: list[str], words: str) -> None:
    missing = tmp_path / "no-model-here"  # the flag's error comes first: nothing was loaded
    with pytest.raises(SystemExit) as exited:
        cli_main(["serve", str(missing), *flags])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert words in error and "does not exist" not in error


def test_serve_from_python_refuses_a_bad_port(folder: Path) -> None:
    with pytest.raises(ArgumentError, match="port"):
        serve(folder, port=99999)
    with pytest.raises(ArgumentError, match="max_wait_ms"):
        ServerSettings(max_wait_ms=math.inf)


# ---------------------------------------------------------------------------------------------- corrupt weights
def corrupt(path: Path, name_part: str, value: float) -> str:
    weights = load_file(path)
    name = next(n for n in weights if name_part in n)
    weights[name] = weights[name].clone()
    weights[name].view(-1)[0] = value
    save_file(weights, path, metadata={"format": "pt"})
    return name


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_model_with_a_nan_or_inf_weight_is_refused_at_load(folder: Path, tmp_path: Path, value: float) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for file in folder.iterdir():
        (bad / file.name).write_bytes(file.read_bytes())
    name = corrupt(bad / "model.safetensors", "mlp.down_proj", value)
    with pytest.raises(ValueError, match=rf"has 1 NaN or infinite values in '{re.escape(name)}'"):
        load_policy(bad)
    with pytest.raises(SystemExit):
        cli_main(["serve", str(bad), "--port", "0"])
    policy, tokenizer = load_policy(folder)
    next(policy.parameters()).data.view(-1)[0] = value
    with pytest.raises(ValueError, match="NaN or infinite"):
        create_app(policy, tokenizer, "m")


@pytest.mark.parametrize("value", [math.nan, math.inf, 0.0, -1.0])
def test_an_int8_export_with_bad_scales_is_refused(tmp_path: Path, served, value: float) -> None:
    policy, _ = served
    folder = tmp_path / "int8"
    save_int8(quantize_int8(policy.model), folder, build_char_tokenizer())
    weights = load_file(folder / WEIGHTS_FILE)
    name = next(n for n in weights if n.endswith("mlp.up_proj.weight_scale"))
    weights[name] = weights[name].clone()
    weights[name][0] = value
    save_file(weights, folder / WEIGHTS_FILE)
    with pytest.raises(ValueError, match=rf"layer '{name.rsplit('.', 1)[0]}' has weight scales that are not finite"):
        load_int8(folder)
    with pytest.raises(ValueError, match="write it again"):
        load_policy(folder)


def test_an_int8_layer_with_a_non_finite_bias_is_refused() -> None:
    layer = Int8Linear.from_float(torch.nn.Linear(4, 3))
    layer.bias[1] = math.inf
    with pytest.raises(ValueError, match="layer '' has a NaN or infinite bias"):
        check_int8_scales(layer, "export")


# ---------------------------------------------------------------------------------------------- quantize's folder
def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_quantize_never_writes_over_an_existing_folder_without_overwrite(folder: Path, tmp_path: Path, capsys) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    before, mine = snapshot(other), snapshot(folder)
    for target, flags in ((other, []), (folder, []), (folder, ["--overwrite"]), (folder.parent, ["--overwrite"])):
        with pytest.raises(SystemExit) as exited:
            cli_main(["quantize", str(folder), "--save-path", str(target), *flags])
        assert exited.value.code == 2 and "--save-path" in capsys.readouterr().err
    assert snapshot(other) == before and snapshot(folder) == mine
    (tmp_path / "a-file").write_text("keep")
    with pytest.raises(SystemExit):
        cli_main(["quantize", str(folder), "--save-path", str(tmp_path / "a-file"), "--overwrite"])
    assert (tmp_path / "a-file").read_text() == "keep"
    assert cli_main(["quantize", str(folder), "--save-path", str(other), "--overwrite"]) == 0
    assert (
        is_int8_folder(other) and (other / WEIGHTS_FILE).is_file() and json.loads((other / "config.json").read_text())
    )
    assert snapshot(folder) == mine
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli_main(["quantize", str(folder), "--save-path", str(empty)]) == 0 and is_int8_folder(empty)


@pytest.mark.parametrize(
    ("save_path", "words"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        (".", "current folder"),
        ("{tmp}/work", "current folder"),
        ("/proc/int8", "cannot write in '/proc'"),
        ("{tmp}/a-file/int8", "cannot write in"),
    ],
)
def test_quantize_checks_where_it_writes_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, save_path: str, words: str
) -> None:
    """These passed the up-front check: the model was loaded and quantized, then the write failed with a traceback
    (or, for the current folder with --overwrite, would have replaced it whole)."""
    (tmp_path / "a-file").write_text("keep")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "mine.txt").write_text("keep")
    monkeypatch.chdir(tmp_path / "work")
    missing = tmp_path / "models" / "no-model-here"  # the path's error comes first: nothing was loaded
    with pytest.raises(SystemExit) as exited:
        cli_main(["quantize", str(missing), "--save-path", save_path.format(tmp=tmp_path), "--overwrite"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "--save-path" in error and words in error and "does not exist" not in error
    assert (tmp_path / "work" / "mine.txt").read_text() == "keep" and (tmp_path / "a-file").read_text() == "keep"


def test_distill_never_writes_the_student_over_its_teacher(tmp_path: Path, capsys) -> None:
    teacher = tmp_path / "teacher.zip"
    teacher.write_bytes(b"the teacher")  # refused before the teacher is read
    for save_path in (teacher, tmp_path / "teacher"):
        argv = ["distill", "--teacher", str(teacher), "--student", "tiny", "--save-path", str(save_path)]
        with pytest.raises(SystemExit) as exited:
            cli_main([*argv, "--overwrite"])
        assert exited.value.code == 2
        assert "would replace the model it reads" in capsys.readouterr().err
    assert teacher.read_bytes() == b"the teacher"


# ---------------------------------------------------------------------------------------------- distill's numbers
@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--temperature", "nan"], "temperature"),
        (["--temperature", "-1"], "temperature"),
        (["--learning-rate", "inf"], "--learning-rate"),
        (["--qat-start", "nan"], "--qat-start"),
        (["--on-policy", "2"], "--on-policy"),
        (["--sft-coef", "-0.5"], "--sft-coef"),
        (["--steps", "-1"], "steps"),
        (["--batch-size", "0"], "--batch-size"),
        (["--n", "-3"], "--n"),
    ],
)
def test_bad_distill_numbers_are_refused_before_any_work(tmp_path: Path, capsys, flags: list[str], words: str) -> None:
    teacher = tmp_path / "no-teacher"  # refused before the teacher is even looked at
    with pytest.raises(SystemExit) as exited:
        cli_main(["distill", "--teacher", str(teacher), "--student", "tiny", *flags])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert words in error and "no-teacher" not in error


def test_distill_from_python_refuses_a_nan_temperature(folder: Path) -> None:
    with pytest.raises(ArgumentError, match="temperature"):
        distill(folder, "tiny", gym.make("R1Zero-v0", **ENV_KWARGS), steps=1, temperature=math.nan)
