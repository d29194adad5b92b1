"""``grpo-gym openenv-serve``: ``R1Zero-v0`` served as an OpenEnv environment
(:mod:`grpo_gym.interop.openenv_server`)."""

from __future__ import annotations

import argparse
from typing import Any

from algorithms.cli_types import COUNT, HOST, PORT


def env_kwargs_of(args: argparse.Namespace) -> dict[str, Any]:
    """The env's arguments: a config preset's ``env_kwargs`` (``--preset``), then ``--env-kwargs``, ``--task``,
    ``--tools`` and ``--reward-funcs`` over them."""
    from algorithms.cli_options import reward_funcs_argument

    kwargs: dict[str, Any] = {}
    if args.preset is not None or args.config is not None:
        from algorithms.common.hyperparams import DEFAULT_CONFIG, load_hyperparams

        config = load_hyperparams(args.config or DEFAULT_CONFIG, "R1Zero-v0", args.preset, {})
        kwargs.update(config.get("env_kwargs") or {})
    if args.env_kwargs is not None:
        from grpo_gym.validation import read_json

        extra = read_json(args.env_kwargs, "--env-kwargs", fix="""write a JSON object, e.g. '{"max_turns": 2}'""")
        if not isinstance(extra, dict):
            raise ValueError(f"--env-kwargs must be a JSON object of R1ZeroEnv arguments, got {args.env_kwargs!r:.80}")
        kwargs.update(extra)
    if args.task is not None:
        kwargs["task"] = args.task
    if args.tools:
        kwargs["tools"] = list(args.tools)
    if args.reward_funcs:
        kwargs["reward_funcs"] = reward_funcs_argument(args.reward_funcs)
    return kwargs


def openenv_serve_command(args: argparse.Namespace) -> int:
    """Serve ``R1Zero-v0`` over OpenEnv's HTTP/WebSocket API until Ctrl-C or SIGTERM."""
    env_kwargs = env_kwargs_of(args)  # the flags are checked first, with or without openenv-core
    try:
        from grpo_gym.interop.openenv_server import serve
    except ImportError as error:
        raise ValueError(str(error)) from None
    serve(args.host, args.port, env_kwargs, None, args.max_concurrent_envs, args.log_level)
    return 0


def add_interop_commands(commands: Any) -> None:
    """Add ``openenv-serve`` to the ``grpo-gym`` sub-command parsers."""
    s = commands.add_parser(
        "openenv-serve", help="serve R1Zero-v0 (any task, tools, reward functions) as an OpenEnv environment"
    )
    s.add_argument("--host", type=HOST, default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    s.add_argument("--port", type=PORT, default=8000)
    s.add_argument("--task", default=None, help="the task (default: arithmetic; grpo-gym tasks lists them)")
    s.add_argument("--tools", nargs="+", default=None, metavar="NAME", help="built-in tools, e.g. calculator")
    s.add_argument(
        "--reward-funcs", nargs="+", default=None, metavar="[NAME=]MODULE:FUNCTION",
        help="reward functions with TRL's signature, importable from here",
    )  # fmt: skip
    s.add_argument("--env-kwargs", default=None, help="more R1ZeroEnv arguments as JSON, e.g. '{\"max_turns\": 2}'")
    s.add_argument("--preset", default=None, help="take the env_kwargs of a config preset (demo, seed, tools)")
    s.add_argument("--config", default=None, help="the config file of --preset (default: zoo_configs/grpo.yml)")
    s.add_argument("--max-concurrent-envs", type=COUNT, default=64, help="sessions served at once")
    s.add_argument("--log-level", default="info")
    s.set_defaults(func=openenv_serve_command)
