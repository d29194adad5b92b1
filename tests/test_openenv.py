"""OpenEnv both ways, with the real openenv-core (no mocks): our R1Zero-v0 server on 127.0.0.1 driven by openenv-core's
own clients (reset, step, state, MCP tools, concurrent sessions, its runtime validator), GRPO training through
OpenEnv on our server and on openenv-core's own example env (the `openenv init` template), and servers that die or
stop answering mid-episode giving a clear error within the timeout."""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

pytest.importorskip("openenv")

import uvicorn
from openenv.cli._validation import validate_running_environment
from openenv.core import GenericEnvClient
from openenv.core.env_server.mcp_types import ListToolsAction
from openenv.core.mcp_client import MCPToolClient

from algorithms import GRPO
from grpo_gym import R1ZeroEnv
from grpo_gym.interop.openenv import OpenEnvError, action_field, observation_text, openenv_env, openenv_vec_env
from grpo_gym.interop.openenv_models import R1ZeroAction, R1ZeroClient
from grpo_gym.interop.openenv_server import MANIFEST, create_r1zero_app
from grpo_gym.validation import ArgumentError
from tests.sizes import TINY

ENV = {"task": "arithmetic", "difficulty": 0.1, "tools": ["calculator"], "max_turns": 2}
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn on 127.0.0.1 in a thread; yields its URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serving(create_r1zero_app(ENV, max_concurrent_envs=8)) as address:
        yield address


def gold(seed: int) -> str:
    """The gold completion of the problem a session reset with ``seed`` plays (the same seed, the same problem)."""
    env = R1ZeroEnv(**ENV)
    env.reset(seed=seed)
    reasoning, answer = env.task.solution(env.problem)
    return f"<think>{reasoning}</think><answer>{answer}</answer>"


def test_openenv_cores_client_drives_reset_step_and_state(url: str) -> None:
    with GenericEnvClient(base_url=url).sync() as client:
        first = client.reset(seed=3)
        assert first.observation["message"].startswith("What is") and first.done is False
        assert "Tools: " not in first.observation["message"] and "calculator" in first.observation["prompt"]
        assert client.reset(seed=3).observation["message"] == first.observation["message"]
        wrong = client.step({"completion": "<think>no idea</think><answer>-1</answer>"})
        assert not wrong.done and wrong.observation["message"].startswith("That is not correct")
        assert wrong.observation["reward_components"]["task"] == 0.0
        right = client.step({"completion": gold(3)})
        assert right.done and right.reward == 1.0 and right.observation["is_success"]
        assert client.state()["step_count"] == 2
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            client.step({"text": "not an R1Zero action"})
    with R1ZeroClient(base_url=url).sync() as typed:  # ours: a completion's text is an action
        typed.reset(seed=3)
        result = typed.step(gold(3))
        assert result.observation.is_success and result.observation.turn == 1
        with pytest.raises(RuntimeError, match="unknown reset argument"):
            typed.reset(seed=1, level=2)


def test_mcp_tools_are_listed_and_called_through_openenv_cores_clients(url: str) -> None:
    with MCPToolClient(base_url=url).sync() as client:
        assert [tool.name for tool in client.list_tools()] == ["calculator"]
        client.reset(seed=0)
        assert client.call_tool("calculator", expression="2+3") == "5"
        with pytest.raises(RuntimeError, match="unknown tool 'abacus'"):
            client.call_tool("abacus", x=1)
        with pytest.raises(RuntimeError, match="must be string"):
            client.call_tool("calculator", expression=5)
    with GenericEnvClient(base_url=url).sync() as generic:
        tools = generic.step(ListToolsAction()).observation["tools"]
        assert tools[0]["input_schema"]["required"] == ["expression"]


def test_concurrent_sessions_each_play_their_own_episode(url: str) -> None:
    clients = [R1ZeroClient(base_url=url).sync() for _ in range(4)]
    results: dict[int, Any] = {}

    def play(i: int) -> None:
        clients[i].reset(seed=10 + i)
        results[i] = clients[i].step(gold(10 + i)).observation

    threads = [threading.Thread(target=play, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert all(results[i].is_success for i in range(4))  # each session scored its own problem
    for client in clients:
        client.close()


def test_the_runtime_validator_passes_and_the_manifest_names_a_serving_app(url: str) -> None:
    report = validate_running_environment(url, timeout_s=10)
    assert report["passed"], [c for c in report["criteria"] if not c["passed"]]
    manifest = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    assert manifest["runtime"] == "fastapi" and manifest["action"] == R1ZeroAction.__name__
    module, _, name = manifest["app"].partition(":")
    assert hasattr(getattr(importlib.import_module(module), name), "router")  # what uvicorn module:app serves
    assert httpx.get(f"{url}/metadata").json()["name"] == "R1Zero-v0"


def test_the_wrapper_renders_observations_sends_completions_and_runs_mcp_tools(url: str) -> None:
    env = openenv_env(url, max_new_tokens=96, context_length=512, template="compact")
    try:
        assert env.tools is not None and env.tools.names == ["calculator"]  # listed from the server
        _, info = env.reset(options={"problem": env.sample_problem(seed=3)})  # the server resets with seed 3
        assert info["prompt"].startswith("Tools: calculator(expression)\nUser: What is")
        _, reward, terminated, truncated, info = env.step(env.encode_action(CALL))
        assert info["tool_calls"][0]["result"] == "5" and (reward, terminated, truncated) == (0.0, False, False)
        _, reward, terminated, _, info = env.step(env.encode_action(gold(3)))
        assert terminated and reward == 1.0 and info["is_success"] and info["server_reward"] == 1.0
        context = env.codec.decode(env.window.tokens())
        assert "\nTool: 5\nAssistant: " in context
    finally:
        env.close()


def test_grpo_trains_on_our_server_through_openenv(url: str) -> None:
    venv = openenv_vec_env(url, n_envs=2, max_new_tokens=12, context_length=256, max_turns=2)
    try:
        model = GRPO("TransformerPolicy", venv, n_groups=2, group_size=2, cold_start=False, policy_kwargs=TINY, seed=0)
        model.learn(8)
        assert model.num_timesteps >= 8 and len(model.ep_info_buffer) >= 4
    finally:
        venv.close()


@pytest.fixture()
def echo_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """openenv-core's own example env, as `openenv init echo_env` writes it (the template it ships)."""
    from openenv.cli.commands.init import _copy_template_directory, _create_template_replacements

    folder = tmp_path / "echo_env"
    folder.mkdir()
    _copy_template_directory("openenv.cli.templates.openenv_env", "", folder, _create_template_replacements("echo_env"),
                             "echo_env")  # fmt: skip
    monkeypatch.syspath_prepend(str(folder))  # as its server runs: python -m server.app from the folder
    monkeypatch.syspath_prepend(str(tmp_path))  # its client package: echo_env
    names = ("server", "server.app", "server.echo_env_environment", "models", "echo_env", "echo_env.client",
             "echo_env.models")  # fmt: skip
    for name in names:
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield importlib.import_module("server.app").app
    for name in names:
        sys.modules.pop(name, None)


def test_grpo_trains_on_openenv_cores_example_env(echo_app: Any) -> None:
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    with serving(echo_app) as address:
        env = openenv_env(address, max_new_tokens=8, context_length=128, max_turns=2)  # the action: {"message": text}
        venv = DummyVecEnv([lambda: Monitor(env)])  # the template serves one session at a time
        try:
            _, info = env.reset(seed=0)
            assert info["prompt"] == "User: Echo Env environment ready!\nAssistant: "
            _, reward, _, _, _ = env.step(env.encode_action("hello"))
            assert reward == pytest.approx(0.5)  # the echo env's reward: 0.1 per character
            model = GRPO("TransformerPolicy", venv, n_groups=1, group_size=2, cold_start=False, policy_kwargs=TINY)
            model.learn(4)
            assert model.num_timesteps >= 4
            with pytest.raises(OpenEnvError, match=r"refused a new session.*--max-concurrent-envs"):
                openenv_env(address, max_new_tokens=8, context_length=128).reset()
        finally:
            venv.close()
        package = importlib.import_module("echo_env")  # its typed client and action, through action_parser
        typed = None
        for _ in range(50):  # the closed session's slot is freed as the server sees the close
            with contextlib.suppress(OpenEnvError):
                typed = openenv_env(package.EchoEnv(base_url=address), lambda text: package.EchoAction(message=text),
                                    max_new_tokens=8, context_length=128)  # fmt: skip
                break
            time.sleep(0.1)
        assert typed is not None and typed.tools is None  # its client sends no MCP action: no tools
        typed.reset(seed=0)
        _, reward, _, _, _ = typed.step(typed.encode_action("hi"))
        assert reward == pytest.approx(0.2) and typed.codec.decode(typed.window.tokens()).endswith(
            "hi\nUser: hi\nAssistant: "
        )
        typed.close()


def test_bad_arguments_name_the_fix(url: str) -> None:
    with pytest.raises(ArgumentError, match="not one text field"):
        action_field({"properties": {"a": {"type": "string"}, "b": {"type": "string"}}})
    assert action_field({"properties": {"type": {"type": "string", "enum": ["x"]}, "message": {"type": "string"}}})
    assert observation_text({"echoed_message": "hi", "message_length": 2}) == "hi"
    assert observation_text({"a": 1, "b": [2]}) == '{"a": 1, "b": [2]}'
    with pytest.raises(ArgumentError, match="tools must be"):
        openenv_env(url, tools="yes")
    with pytest.raises(ArgumentError, match="URL or an openenv-core client"):
        openenv_env(42)
    with pytest.raises(ValueError, match="env_kwargs or env_factory"):
        create_r1zero_app({"task": "arithmetic"}, env_factory=lambda: R1ZeroEnv())
    with pytest.raises(ValueError, match="max_new_tokens"):
        create_r1zero_app({"max_new_tokens": -1})
    with pytest.raises(OpenEnvError, match=r"cannot reach.*grpo-gym openenv-serve"):
        openenv_env(f"http://127.0.0.1:{free_port()}", timeout=2)


def test_the_commands_env_arguments_come_from_a_preset_json_and_flags() -> None:
    from algorithms.cli import build_parser
    from algorithms.interop_commands import env_kwargs_of

    parser = build_parser()
    args = parser.parse_args(["openenv-serve", "--preset", "tools", "--env-kwargs", '{"max_turns": 2}', "--task",
                              "countdown", "--reward-funcs", "mymodule:score"])  # fmt: skip
    kwargs = env_kwargs_of(args)
    assert kwargs["tools"] == ["calculator"] and kwargs["max_new_tokens"] == 112  # the preset's env
    assert (kwargs["max_turns"], kwargs["task"], kwargs["reward_funcs"]) == (2, "countdown", ["mymodule:score"])
    assert env_kwargs_of(parser.parse_args(["openenv-serve"])) == {}  # R1Zero-v0 with the text budgets
    for bad in ("[1]", "{nope"):
        with pytest.raises(ValueError, match="--env-kwargs"):
            env_kwargs_of(parser.parse_args(["openenv-serve", "--env-kwargs", bad]))


def _start_cli_server(port: int) -> subprocess.Popen:
    """``grpo-gym openenv-serve`` (the command's fixed name) on 127.0.0.1:port, waited for until it answers."""
    command = [sys.executable, "-m", "algorithms.cli", "openenv-serve", "--host", "127.0.0.1", "--port", str(port),
               "--task", "countdown", "--log-level", "warning"]  # fmt: skip
    root = Path(__file__).resolve().parents[1]
    process = subprocess.Popen(command, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else "the server exited"
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        time.sleep(0.2)
    process.kill()
    raise AssertionError("grpo-gym openenv-serve did not start")


def test_a_stuck_or_killed_server_is_a_clear_error_within_the_timeout() -> None:
    port = free_port()
    process = _start_cli_server(port)
    address = f"http://127.0.0.1:{port}"
    try:
        stuck, alive = (openenv_env(address, timeout=2, max_new_tokens=8, context_length=128) for _ in range(2))
        _, info = stuck.reset(seed=0)
        assert "User: Make " in info["prompt"]  # --task countdown was served
        alive.reset(seed=1)
        os.kill(process.pid, signal.SIGSTOP)  # a server that stops answering
        started = time.monotonic()
        with pytest.raises(OpenEnvError, match=r"did not answer step within 2 s.*longer timeout="):
            stuck.step(stuck.encode_action("<answer>1</answer>"))
        assert time.monotonic() - started < 6
        os.kill(process.pid, signal.SIGCONT)
        alive.step(alive.encode_action("<answer>1</answer>"))  # the other session goes on
        alive.reset(seed=2)  # a new episode: the server is killed in the middle of it
        process.kill()  # a server killed mid-episode
        process.wait(10)
        started = time.monotonic()
        with pytest.raises(OpenEnvError, match=r"closed the session during step.*Restart it"):
            alive.step(alive.encode_action("<answer>2</answer>"))
        assert time.monotonic() - started < 2
        with pytest.raises(OpenEnvError, match="is closed"):
            alive.reset()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
        process.kill()
        process.wait(10)


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/step", {"action": {"completion": "<answer>5</answer>"}}, "open a session on the WebSocket"),
        ("/reset", {"difficulty": 5}, "difficulty"),
        ("/reset", {"bogus": 1}, "unknown reset argument(s) 'bogus'"),
    ],
    ids=["step-without-a-session", "difficulty-out-of-range", "unknown-argument"],
)
def test_a_clients_mistake_over_plain_http_is_a_400_naming_the_fix(
    url: str, path: str, body: dict[str, Any], words: str, capfd: pytest.CaptureFixture
) -> None:
    """Before (hostile round four): 500 Internal Server Error, and a traceback in the server's log."""
    answer = httpx.post(url + path, json=body, timeout=30)
    assert answer.status_code == 400 and words in answer.json()["detail"], answer.text
    assert httpx.get(url + "/health", timeout=30).status_code == 200  # still serving
    assert "Traceback" not in capfd.readouterr().err


SCORED: list[str] = []


def slow_reward(prompts, completions, **kwargs):
    """Takes 0.2 s per completion and counts the completions it scored."""
    time.sleep(0.2)
    SCORED.extend(completions)
    return [0.0] * len(completions)


def test_steps_a_departed_client_queued_are_dropped() -> None:
    """Hostile round four: clients that sent work and disconnected kept the server busy scoring it (64 s for four).
    Here a client queues 20 steps of 0.2 s each and leaves: the session drops the ones not started."""
    from websockets.sync.client import connect

    factory = functools.partial(R1ZeroEnv, task="arithmetic", difficulty=0.1, reward_funcs=[slow_reward])
    SCORED.clear()
    with serving(create_r1zero_app(env_factory=factory)) as address:
        with connect(address.replace("http", "ws") + "/ws") as socket_:
            socket_.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
            socket_.recv(timeout=30)
            for n in range(20):
                socket_.send(json.dumps({"type": "step", "data": {"completion": f"step {n}"}}))
            time.sleep(0.1)  # the first step is under way
        time.sleep(2.0)  # without the drop, 8 more steps would be scored by now
        assert httpx.get(address + "/health", timeout=5).status_code == 200
        scored = len(SCORED)
    assert 1 <= scored <= 2, scored
