"""GRPO against a served vLLM on 127.0.0.1: the server is ``grpo-gym vllm-serve`` (one for the module, ~40 s to
start), a run samples on it with its weights pushed after every update, and a ``grpo-gym train`` whose server is
stopped mid-run ends with the error naming the fix and a checkpoint folder that loads and trains on (the module's last
test: it stops the server). Skipped, with the reason in the report, where vLLM cannot be imported."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from algorithms import GRPO
from algorithms.common.saving.checkpoints import latest_checkpoint
from tests.engine_models import ENGINE_KWARGS, VLLM_MISSING
from tests.test_cli import CONFIG
from tests.test_grpo import make_env
from tests.test_vllm_training import ENGINE_MODEL, scalars

pytestmark = pytest.mark.skipif(bool(VLLM_MISSING), reason=VLLM_MISSING)

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lines_of(process: subprocess.Popen) -> queue.Queue:
    """The process's output lines, read by a thread (so waiting for one can time out)."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``grpo-gym vllm-serve tiny`` at the engine tests' sizes, on a free port: ``(url, process)``."""
    folder = tmp_path_factory.mktemp("vllm-serve")
    command = [sys.executable, "-m", "algorithms.cli", "vllm-serve", "tiny", "--model-kwargs",
               json.dumps(ENGINE_KWARGS), "--port", str(free_port()), "--folder", str(folder),
               "--kv-cache-memory-bytes", str(32 << 20), "--startup-timeout", "300"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    lines, seen = lines_of(process), []
    deadline = time.monotonic() + 360
    url = None
    while url is None and time.monotonic() < deadline:
        try:
            line = lines.get(timeout=5)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line)
        if line.startswith("vLLM serves at "):
            url = line.split()[3].rstrip(";")
    if url is None:
        process.kill()
        pytest.fail("grpo-gym vllm-serve did not start:\n" + "".join(seen[-40:]))
    yield url, process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


def test_grpo_samples_on_the_served_vllm(served, tmp_path: Path) -> None:
    url, _ = served
    kwargs = {
        "n_groups": 2,
        "group_size": 4,
        "cold_start_kwargs": {"steps": 0},
        "cold_start": False,
        "seed": 0,
        "learning_rate": 1e-3,
        "policy_kwargs": ENGINE_MODEL,
        "tensorboard_log": str(tmp_path),
    }
    model = GRPO(
        "TransformerPolicy",
        make_env(),
        rollout_engine="vllm",
        rollout_engine_kwargs={"mode": "server", "server_base_url": url},
        **kwargs,
    )
    assert type(model.policy.rollout_engine).__name__ == "VLLMServerEngine"
    model.learn(16)
    syncs, kl = scalars(tmp_path, "time/weight_sync_seconds"), scalars(tmp_path, "train/sampler_kl")
    assert len(syncs) == 2 and all(s > 0 for s in syncs)  # the file written and the server's reload, timed
    assert len(kl) == 2 and all(abs(v) < 1e-6 for v in kl), kl  # the served folder's format: the update's log-probs
    model.close_engine()


def test_a_server_that_dies_mid_run_ends_train_with_the_fix_and_a_checkpoint_that_loads(served, tmp_path: Path):
    """The module's last test: it stops the server."""
    url, server = served
    config = {"R1Zero-v0": {**CONFIG["R1Zero-v0"], "policy_kwargs": ENGINE_MODEL, "n_timesteps": 100_000}}
    (tmp_path / "grpo.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    folder = tmp_path / "ck"
    command = [sys.executable, "-m", "algorithms.cli", "train", "--config", str(tmp_path / "grpo.yml"),
               "--checkpoint-dir", str(folder), "--checkpoint-every", "1", "--no-progress-bar",
               "--rollout-engine", "vllm", "--vllm-mode", "server", "--vllm-server-base-url", url,
               "-params", "rollout_engine_kwargs:{'request_timeout': 30.0}"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    train = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and train.poll() is None and latest_checkpoint(folder) is None:
        time.sleep(0.5)
    assert train.poll() is None, train.communicate()[1][-3000:]
    time.sleep(1.0)  # into the next iterations
    server.send_signal(signal.SIGTERM)  # grpo-gym vllm-serve stops its server
    assert server.wait(60) == 0
    _, err = train.communicate(timeout=180)  # no hang: the next request fails at once
    assert train.returncode == 1, err[-3000:]
    assert "Traceback" not in err
    # the stopping server either no longer answers, or answers 500 while its engine is already gone: both name the fix
    stopped = f"no vLLM server answers at {url}" in err or "its engine stopped or failed" in err
    assert stopped and "start one with `grpo-gym vllm-serve" in err, err[-3000:]
    assert "checkpoint: " in err and "once the engine runs again, resume with: grpo-gym train" in err, err[-3000:]
    latest = latest_checkpoint(folder)
    model = GRPO.load(latest / "model.zip", env=make_env(), rollout_engine="builtin")
    assert model.iteration >= 1 and model.rollout_engine == "builtin"
    model.learn(8, reset_num_timesteps=False)  # and trains on
