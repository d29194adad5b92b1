"""The rollout engine on the command line: ``grpo-gym train``'s engine flags, and ``grpo-gym vllm-serve`` (a model
zip or folder served by vLLM for training runs to sample on).

``grpo-gym vllm-serve MODEL`` writes the folder vLLM loads (:func:`~algorithms.common.generation.engines.vllm_folder.
export_folder`: for a zip in its run's sampling settings, so the server's log-probs are the trainer's), starts a vLLM
OpenAI server on it at ``--host``:``--port`` with the developer endpoints the trainer pushes weights through, prints
its URL and the ``grpo-gym train`` flags that use it, and stops it on Ctrl-C or SIGTERM (its whole process group, and
the folder when it was a temporary one). The server may be started before or after the trainer: the trainer waits
``vllm_server_timeout`` seconds for it, then pushes its own weights, so whatever weights the server loaded, the first
rollout samples with the trainer's.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from algorithms.cli_types import COUNT, HOST, PORT, POSITIVE, SEED, Number

#: a share of a GPU's memory: above 0, at most all of it
GPU_SHARE = Number(low=0.0, high=1.0, low_open=True)
#: ``grpo-gym train``'s engine flags and the constructor arguments they set
#: the engine flags of ``train``: the argument each sets (``rollout_engine``, or a key of ``rollout_engine_kwargs``)
TRAIN_FLAGS = {"rollout_engine": ("rollout_engine", None), "vllm_mode": ("rollout_engine_kwargs", "mode"),
               "vllm_server_base_url": ("rollout_engine_kwargs", "server_base_url")}  # fmt: skip


def add_engine_flags(command: argparse.ArgumentParser) -> None:
    """``--rollout-engine``, ``--vllm-mode``, ``--vllm-server-base-url`` (over the config; ``--resume`` takes them)."""
    from algorithms.common.generation.engines.setup import ENGINES, VLLM_MODES

    add = command.add_argument
    add("--rollout-engine", choices=ENGINES, default=None, help="what samples the rollouts (default: the config's)")
    add("--vllm-mode", choices=VLLM_MODES, default=None, help="vLLM in this process, or a vLLM server's client")
    add("--vllm-server-base-url", default=None, metavar="URL", help="the vLLM server, e.g. http://127.0.0.1:8000")


@contextlib.contextmanager
def checkpoint_on_engine_error(model: Any, checkpoint: Any, resume: str) -> Iterator[None]:
    """Around ``learn``: when the rollout engine fails (a server that died, a push refused), write the checkpoint
    of the last finished iteration, close the engine, and raise the error with where the checkpoint is and
    ``resume`` (the command that continues)."""
    from algorithms.common.generation.engines.base import EngineError

    try:
        yield
    except EngineError as error:
        written = checkpoint.save()
        model.close_engine()
        raise EngineError(
            f"{error}\nthe last iteration's checkpoint: {written} ({model.iteration} iterations); once the engine "
            f"runs again, {resume}"
        ) from error


def engine_overrides(args: argparse.Namespace, config: dict[str, Any]) -> dict[str, Any]:
    """The engine flags given on the command line, as constructor arguments over ``config``'s (the flags' keys of
    ``rollout_engine_kwargs`` over the config's others)."""
    overrides: dict[str, Any] = {}
    for flag, (name, key) in TRAIN_FLAGS.items():
        value = getattr(args, flag, None)
        if value is None:
            continue
        if key is None:
            overrides[name] = value
        else:
            overrides.setdefault(name, dict(config.get(name) or {}))[key] = value
    return overrides


# ---------------------------------------------------------------------------------------------------- vllm-serve
def serving_model(args: argparse.Namespace) -> tuple[Any, Any]:
    """The model to serve and its :class:`~algorithms.common.generation.engines.base.SamplingSettings`: a zip's
    policy (its run's settings), a Hugging Face folder or a built-in name (``--model-kwargs``), with ``--temperature``
    over the settings."""
    from algorithms.common.generation.engines.base import SamplingSettings

    if Path(args.model).exists():
        from algorithms.deploy.loading import load_policy

        policy, _ = load_policy(args.model)
        model, settings = policy.model, SamplingSettings.of_policy(policy)
    else:
        from algorithms.common.model.loading import is_builtin_model, load_model
        from grpo_gym.tokenizer import BUILTIN_VOCAB_SIZE

        if not is_builtin_model(args.model):
            raise ValueError(
                f"{args.model!r} is not a model zip (model.save), a Hugging Face folder nor a built-in size (tiny, "
                "small, medium, base)"
            )
        kwargs = json.loads(args.model_kwargs) if args.model_kwargs else {}
        if not isinstance(kwargs, dict):
            raise ValueError(f"--model-kwargs must be a JSON object of config fields, got {args.model_kwargs!r}")
        model = load_model(args.model, vocab_size=BUILTIN_VOCAB_SIZE, seed=0, **kwargs)
        settings = SamplingSettings(1, 0, vocab_size=BUILTIN_VOCAB_SIZE)
    if args.temperature is not None:
        settings = dataclasses.replace(settings, temperature=args.temperature)
    return model.eval(), settings


def server_options(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    """The vLLM server's options (:func:`~algorithms.common.generation.engines.vllm_launcher.server_command`)."""
    import torch

    from algorithms.common.generation.engines.vllm_folder import lora_rank

    gpu = torch.cuda.is_available()
    options: dict[str, Any] = {"dtype": args.dtype or ("bfloat16" if gpu else "float32"), "seed": args.seed}
    if args.kv_cache_memory_bytes is not None or not gpu:
        options["kv_cache_memory_bytes"] = args.kv_cache_memory_bytes or 256 << 20
    else:
        options["gpu_memory_utilization"] = args.gpu_memory_utilization
    if args.max_model_len:
        options["max_model_len"] = args.max_model_len
    rank = args.max_lora_rank or (max(8, lora_rank(model)) if lora_rank(model) else 0)
    if rank:
        options["max_lora_rank"] = rank
    return options


def vllm_serve_command(args: argparse.Namespace) -> int:
    """Export the model, serve it with vLLM until Ctrl-C / SIGTERM (see the module docstring)."""
    from algorithms.common.generation.engines.base import EngineError
    from algorithms.common.generation.engines.vllm_engine import import_vllm
    from algorithms.common.generation.engines.vllm_folder import check_vllm_can_run, export_folder
    from algorithms.common.generation.engines.vllm_launcher import start_vllm_server

    import_vllm()
    model, settings = serving_model(args)
    check_vllm_can_run(model)
    temporary = args.folder is None
    folder = Path(args.folder) if args.folder else Path(tempfile.mkdtemp(prefix="grpo-gym-vllm-serve-"))
    try:
        exported, _ = export_folder(model, settings, folder / "model")
        log = Path(args.log) if args.log else folder / "server.log"
        print(f"starting vLLM on {exported} (log: {log}) ...", flush=True)
        options = server_options(args, model)
        server = start_vllm_server(exported, args.host, args.port, args.startup_timeout, log, **options)
        print(f"vLLM serves at {server.base_url}; train on it with:\n  grpo-gym train --rollout-engine vllm "
              f"--vllm-mode server --vllm-server-base-url {server.base_url}\nCtrl-C stops it.", flush=True)  # fmt: skip
        return _wait(server)
    except EngineError as error:
        raise ValueError(str(error)) from None
    finally:
        if temporary:
            shutil.rmtree(folder, ignore_errors=True)


def _wait(server: Any) -> int:
    """Wait until the server exits (its code, with the end of its log) or Ctrl-C / SIGTERM stops it (0)."""

    def stop(number: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        code = server.process.wait()
        print(f"the vLLM server exited with code {code}:\n{server.log_tail()}", file=sys.stderr)
        return int(code) or 1
    except KeyboardInterrupt:
        print("stopping the vLLM server ...", flush=True)
        return 0
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)


def add_engine_commands(commands: Any) -> None:
    """Add ``vllm-serve`` to the ``grpo-gym`` sub-command parsers."""
    s = commands.add_parser("vllm-serve", help="serve a model with vLLM for training runs to sample on (server mode)")
    s.add_argument("model", help="a model zip (model.save), a Hugging Face folder, or a built-in size (tiny, ...)")
    s.add_argument("--host", type=HOST, default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    s.add_argument("--port", type=PORT, default=8000)
    s.add_argument("--folder", default=None, help="where to write the folder vLLM loads (default: a temporary one)")
    s.add_argument("--log", default=None, help="the server's log file (default: <folder>/server.log)")
    s.add_argument("--temperature", type=POSITIVE, default=None, help="the run's sampling temperature (a zip: its own)")
    s.add_argument("--model-kwargs", default=None, help="a built-in size's config fields, as JSON")
    s.add_argument("--dtype", default=None, help="vLLM's dtype (default: float32 on a CPU, bfloat16 on a GPU)")
    s.add_argument("--kv-cache-memory-bytes", type=COUNT, default=None, help="the KV cache (default on a CPU: 256 MiB)")
    s.add_argument("--gpu-memory-utilization", type=GPU_SHARE, default=0.9, help="a GPU's share vLLM takes")
    s.add_argument("--max-model-len", type=COUNT, default=None, help="tokens per sequence (default: the model's)")
    s.add_argument("--max-lora-rank", type=COUNT, default=None, help="take LoRA adapters up to this rank")
    s.add_argument("--seed", type=SEED, default=0)
    s.add_argument("--startup-timeout", type=POSITIVE, default=600.0, help="seconds to wait for it to start")
    s.set_defaults(func=vllm_serve_command)
