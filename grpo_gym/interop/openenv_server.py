"""Serve ``R1Zero-v0`` as an OpenEnv environment: any OpenEnv client (TRL's, SkyRL's, TorchRL's, ours) trains on
its tasks, tools and rewards.

``grpo-gym openenv-serve --host 127.0.0.1 --port 8000`` runs it; :func:`create_r1zero_app` makes the FastAPI app for
your own server (your task, tools and reward functions as Python objects: ``env_kwargs`` as ``R1ZeroEnv`` takes them,
or ``env_factory`` returning an ``R1ZeroEnv``). openenv-core's ``create_app`` serves it: ``/ws`` sessions (each
WebSocket connection gets its own env, up to ``max_concurrent_envs`` at once), the stateless ``/reset`` and
``/step``, ``/schema``, ``/metadata``, ``/health``; ``uvicorn grpo_gym.interop.openenv_server:app`` serves the
default env, as the packaged ``openenv.yaml`` (:data:`MANIFEST`) says.

A session (:class:`R1ZeroEnvironment`):

- ``reset(seed=None, episode_id=None, difficulty=None)`` starts an episode (the same seed, the same problem);
- ``step(R1ZeroAction(completion=text))`` scores a completion (a text over ``max_new_tokens`` is cut) with the env's
  reward: ``reward`` and ``done`` (terminated or truncated), and the observation's fields
  (:class:`~grpo_gym.interop.openenv_models.R1ZeroObservation`);
- MCP: ``ListToolsAction`` lists the env's tools; ``CallToolAction`` plays a tool turn that makes that one call (as
  the model's ``<tool_call>`` would: it counts against ``max_tool_calls`` and its result joins the context), and
  answers with MCP's ``CallToolObservation``. A completion holding ``<tool_call>`` is a tool turn too. Tools go
  through ``step`` (OpenEnv's simulation mode), not the JSON-RPC ``/mcp`` route.
- a completion or a tool call after ``done`` is refused, naming the fix (reset): a finished episode is never scored
  again (:mod:`grpo_gym.episode_order`); the WebSocket answers with an error message, plain HTTP with a 400.

An env served as text gets :data:`~grpo_gym.interop.r1zero_text.TEXT_DEFAULTS` (4096 new tokens) unless given.
Every session builds its own env: a reward model in ``env_kwargs`` is loaded once per session.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.mcp_types import CallToolObservation, ListToolsObservation, ToolError, ToolErrorType
    from openenv.core.env_server.types import EnvironmentMetadata, Observation, State
except ImportError as error:  # pragma: no cover - the extra is not installed
    message = f"grpo_gym.interop.openenv_server needs openenv-core ({error}): pip install 'grpo-gym[openenv]'"
    raise ImportError(message) from error

from grpo_gym.env import R1ZeroEnv
from grpo_gym.episode_order import ResetNeeded
from grpo_gym.interop.openenv_models import R1ZeroAction, R1ZeroObservation, tool_list
from grpo_gym.interop.r1zero_text import R1ZeroText, TextTurn, text_env
from grpo_gym.validation import ArgumentError, check_int

MANIFEST = Path(__file__).with_name("openenv.yaml")
"""The packaged ``openenv.yaml``: the default app (``grpo_gym.interop.openenv_server:app``) as an OpenEnv env."""
ENV_NAME = "R1Zero-v0"


class R1ZeroEnvironment(Environment):
    """One session of ``R1Zero-v0`` (see the module docstring).

    :param env_kwargs: the env's arguments (over ``TEXT_DEFAULTS``)
    :param env_factory: builds the env instead (``env_kwargs`` must then be empty)
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self, env_kwargs: dict[str, Any] | None = None, env_factory: Callable[[], R1ZeroEnv] | None = None
    ) -> None:
        super().__init__()
        self.text = R1ZeroText(env_factory() if env_factory is not None else text_env(env_kwargs))
        self._state = State(episode_id=None, step_count=0)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, difficulty: float | None = None, **kwargs: Any
    ) -> R1ZeroObservation:
        """Start an episode; ``seed`` picks its problem, ``difficulty`` sets the level of this and later ones."""
        if kwargs:
            unknown = ", ".join(map(repr, kwargs))
            raise ArgumentError(f"unknown reset argument(s) {unknown}; R1Zero-v0 takes seed, episode_id, difficulty")
        question, prompt, _ = self.text.reset(seed=seed, difficulty=difficulty)
        self._state = State(episode_id=episode_id, step_count=0)
        return R1ZeroObservation(prompt=prompt, message=question, reward=None, done=False)

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """Score a completion, or answer an MCP action (see the module docstring)."""
        if not isinstance(action, R1ZeroAction):
            raise ArgumentError(f"R1Zero-v0 takes an R1ZeroAction, got {type(action).__name__}")
        if action.type == "list_tools":
            return ListToolsObservation(tools=tool_list(self.text.tool_schemas))
        if self.text.env.problem is None:
            raise ArgumentError(
                "reset the episode before its first step: OpenEnv's HTTP /reset and /step give every request a new "
                "env (they are stateless), so a /step never follows a /reset; open a session on the WebSocket (/ws), "
                "as R1ZeroClient and OpenEnv's EnvClient do, to reset and step"
            )
        self.text.env.order.check()  # a finished episode: a completion or a tool call is not scored again
        self._state.step_count += 1
        if action.type == "call_tool":
            return self._call_tool(action)
        return observation(self.text.step(action.completion))

    def _call_tool(self, action: R1ZeroAction) -> CallToolObservation:
        names = [s["function"]["name"] for s in self.text.tool_schemas]
        if action.tool_name not in names:
            message = (
                f"unknown tool {action.tool_name!r}; the tools are {', '.join(names) or 'none (served without tools)'}"
            )
            error = ToolError(error_type=ToolErrorType.TOOL_NOT_FOUND, message=message)
            return CallToolObservation(tool_name=action.tool_name, error=error, reward=0.0)
        turn = self.text.call_tool(action.tool_name, action.arguments)
        record = (turn.info.get("tool_calls") or [{}])[0]
        error = None
        if "error" in record:
            error = ToolError(error_type=ToolErrorType.EXECUTION_ERROR, message=str(record["error"]))
        done = turn.terminated or turn.truncated
        return CallToolObservation(tool_name=action.tool_name, result=record.get("result"), error=error,
                                   reward=turn.reward, done=done)  # fmt: skip

    @property
    def state(self) -> State:
        """The episode's id (as given to reset) and its steps."""
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        """``R1Zero-v0`` and its task."""
        import grpo_gym

        task = self.text.env.task.name
        return EnvironmentMetadata(
            name=ENV_NAME,
            description=f"R1-Zero-style verifiable problems (task {task!r}), scored by grpo-gym's composite reward",
            version=grpo_gym.__version__,
        )


def observation(turn: TextTurn) -> R1ZeroObservation:
    """A completion's :class:`~grpo_gym.interop.r1zero_text.TextTurn` as the observation a client reads."""
    info = turn.info
    return R1ZeroObservation(
        prompt=turn.prompt,
        message=turn.message,
        completion=info.get("completion", ""),
        reward_components=info.get("reward_components", {}),
        reward_reasons=info.get("reward_reasons", {}),
        is_success=bool(info.get("is_success", False)),
        truncated=turn.truncated,
        tool_calls=info.get("tool_calls") or [],
        turn=int(info.get("turn", 0)),
        reward=turn.reward,
        done=turn.terminated or turn.truncated,
    )


class _QuietDisconnect:
    """ASGI middleware: a WebSocket whose client left first ends quietly. openenv-core 0.3 closes the socket of a
    finished session even when the client already did, and the disconnect it raises reached uvicorn's error log
    as a traceback for every closed session."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        from starlette.websockets import WebSocketDisconnect

        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            if scope.get("type") != "websocket":
                raise


#: the messages a session reads ahead of its work: a disconnect behind them drops them (see _DropDepartedWork)
READ_AHEAD = 32


class _DropDepartedWork:
    """ASGI middleware: work a departed client queued is dropped. A WebSocket session handles its messages one at a
    time; without this, the steps a client sent before it left were all scored, in order, after it was gone. Here
    each session reads ahead (up to :data:`READ_AHEAD` messages): when the disconnect arrives, the messages not
    started yet are dropped and the session ends after the step in progress."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        import asyncio

        if scope.get("type") != "websocket":
            await self.app(scope, receive, send)
            return
        waiting: collections.deque[dict[str, Any]] = collections.deque()
        arrived, room = asyncio.Event(), asyncio.Semaphore(READ_AHEAD)

        async def read_ahead() -> None:
            while True:
                await room.acquire()
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    waiting.clear()  # the client left: what it queued is not started
                waiting.append(message)
                arrived.set()
                if message["type"] == "websocket.disconnect":
                    return

        async def next_message() -> dict[str, Any]:
            while not waiting:
                arrived.clear()
                await arrived.wait()
            room.release()
            return waiting.popleft()

        reader = asyncio.create_task(read_ahead())
        try:
            await self.app(scope, next_message, send)
        finally:
            reader.cancel()


def create_r1zero_app(
    env_kwargs: dict[str, Any] | None = None,
    env_factory: Callable[[], R1ZeroEnv] | None = None,
    max_concurrent_envs: int = 64,
) -> Any:
    """The FastAPI app that serves ``R1Zero-v0`` as an OpenEnv environment (see the module docstring).

    :param env_kwargs: ``R1ZeroEnv``'s arguments (task, task_kwargs, tools, reward_funcs, ...), checked here by
        building one env, so a bad one fails now rather than in every session
    :param env_factory: a function returning a new ``R1ZeroEnv``, called once per session (instead of
        ``env_kwargs``)
    :param max_concurrent_envs: sessions served at once (a client beyond them is refused, naming the limit)
    :return: the app (``uvicorn.run(app, host=..., port=...)``)
    """
    if env_factory is not None and env_kwargs:
        raise ArgumentError("give env_kwargs or env_factory, not both")
    if env_factory is not None and not callable(env_factory):
        raise ArgumentError(f"env_factory must be a function returning an R1ZeroEnv, got {type(env_factory).__name__}")
    check_int("max_concurrent_envs", max_concurrent_envs, low=1)
    R1ZeroEnvironment(env_kwargs, env_factory)  # every argument checked once, before any session
    factory = functools.partial(R1ZeroEnvironment, dict(env_kwargs or {}), env_factory)
    app = create_app(
        factory, R1ZeroAction, R1ZeroObservation, env_name="r1zero", max_concurrent_envs=max_concurrent_envs
    )
    app.add_middleware(_QuietDisconnect)
    app.add_middleware(_DropDepartedWork)
    app.add_exception_handler(ArgumentError, _client_mistake)
    app.add_exception_handler(ResetNeeded, _client_mistake)
    return app


async def _client_mistake(request: Any, error: Exception) -> Any:
    """A request the env refuses (an unknown reset argument, a difficulty out of range, a step before a reset or
    after the episode ended): 400 with the reason and the fix as ``detail``, one access-log line, no traceback; the
    server keeps serving."""
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=400, content={"detail": str(error)})


#: the largest WebSocket message a session takes (uvicorn closes the connection on a larger one, code 1009): a
#: completion of the default 4096 tokens is tens of kilobytes
MAX_MESSAGE_BYTES = 1 << 20


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    env_kwargs: dict[str, Any] | None = None,
    env_factory: Callable[[], R1ZeroEnv] | None = None,
    max_concurrent_envs: int = 64,
    log_level: str = "info",
) -> None:
    """Serve :func:`create_r1zero_app` with uvicorn until Ctrl-C or SIGTERM (``grpo-gym openenv-serve``)."""
    import uvicorn

    check_int("port", port, low=0, high=65535)
    app = create_r1zero_app(env_kwargs, env_factory, max_concurrent_envs)
    uvicorn.run(app, host=host, port=port, log_level=log_level, ws_max_size=MAX_MESSAGE_BYTES)


@functools.cache
def _default_app() -> Any:
    return create_r1zero_app()


def __getattr__(name: str) -> Any:
    """``app``: the default env's app, made on first use (``uvicorn grpo_gym.interop.openenv_server:app``)."""
    if name == "app":
        return _default_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
