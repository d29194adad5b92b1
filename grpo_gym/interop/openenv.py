"""Train on OpenEnv environments: the sessions of an OpenEnv server as envs GRPO trains on.

An OpenEnv server (openenv-core, ``pip install 'grpo-gym[openenv]'``) gives each WebSocket connection a session with
its own env instance; ``reset(seed)`` and ``step(action)`` answer with an observation carrying ``reward`` and
``done``, and MCP's ``ListToolsAction`` / ``CallToolAction`` list and call the env's tools.

- :class:`OpenEnvTextEnv`: one session as a Gymnasium env, through openenv-core's own client (``GenericEnvClient``
  for a URL, or the client you pass: ``EchoEnv(base_url=...)``, ``MCPToolClient``, ours ``R1ZeroClient``).
  ``reset(seed=...)`` resets the session with that seed; ``step(action)`` sends the action; the server's
  ``reward`` (0 when it gives none) and ``done`` (as ``terminated``; an observation's ``truncated`` field, as ours
  has, splits it) pass through, and ``info`` holds the observation's ``is_success`` when it has one. A reward that is
  not a real number (``"0.5"``) or a ``done`` that is not a bool is the server's bug, raised naming it and the value
  (:class:`~grpo_gym.validation.ReturnTypeError`, an ``ArgumentError`` for ``done``). A step (or a
  tool call) after ``done``, or before ``reset``, is refused here, before it reaches the server
  (:class:`~grpo_gym.episode_order.ResetNeeded`): a server that would score a finished episode again never sees it.
- :func:`openenv_env`: that session in :class:`~grpo_gym.wrappers.LMEnvWrapper`, the env GRPO trains on:
  ``obs_to_text`` renders an observation to the prompt (:func:`observation_text` by default), ``action_parser``
  makes a completion the action (default: the text as the only free-text field of the server's action schema,
  e.g. ``{"message": text}``); the server's MCP tools are listed once and shown to the model, and its
  ``<tool_call>`` runs through our tool loop (:mod:`grpo_gym.tools`), each call a ``CallToolAction`` on the
  session. A tool call's own reward is added to the next answer's.
- :func:`openenv_vec_env`: ``n_envs`` sessions against one server, reset and stepped at once
  (:class:`~grpo_gym.interop.vec_env.ThreadedVecEnv`), each in SB3's ``Monitor``.

**Failures are errors that name the fix, never hangs.** Connecting and every message wait at most ``timeout``
seconds (openenv-core's ``connect_timeout_s`` / ``message_timeout_s``): a server that is not there, was killed
mid-episode, stopped answering, refused a session (at its ``max_concurrent_envs``) or refused an action raises
:class:`OpenEnvError` saying which and what to do. The session is closed then: a run cannot go on without its
episode.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym

try:
    from openenv.core import GenericEnvClient
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction
    from openenv.core.sync_client import SyncEnvClient
except ImportError as error:  # pragma: no cover - the extra is not installed
    message = f"grpo_gym.interop.openenv needs openenv-core ({error}): pip install 'grpo-gym[openenv]'"
    raise ImportError(message) from error

from grpo_gym.episode_order import EpisodeOrder
from grpo_gym.interop.mcp import mcp_result, mcp_schemas, remote_toolbox
from grpo_gym.rewards.values import received_number, returned_flag
from grpo_gym.tools import ToolsUnavailable
from grpo_gym.validation import ArgumentError, check_float
from grpo_gym.wrappers import LMEnvWrapper

DEFAULT_TIMEOUT = 30.0
#: what a server's answer to a step holds, for the message when it holds something else
STEP_CONTRACT = "an OpenEnv observation's reward is a float (or None) and its done a bool"
_SKIPPED = {"done", "reward", "metadata"}


class OpenEnvError(RuntimeError):
    """An OpenEnv server failed a session: not there, gone, too slow, full, or it refused an action."""


def observation_fields(observation: Any) -> Any:
    """An observation's own fields (a pydantic observation's, a client's dict as is), ``done``/``reward`` left out."""
    if hasattr(observation, "model_dump"):
        return observation.model_dump(exclude=_SKIPPED)
    if isinstance(observation, Mapping):
        return {k: v for k, v in observation.items() if k not in _SKIPPED}
    return observation


def observation_text(observation: Any) -> str:
    """The default ``obs_to_text``: the observation's ``message`` or ``prompt`` field (ours), its only text field
    (``echoed_message``, ...), else its fields as JSON."""
    fields = observation_fields(observation)
    if isinstance(fields, str):
        return fields
    if isinstance(fields, Mapping):
        for key in ("message", "prompt"):
            if isinstance(fields.get(key), str):
                return fields[key]
        texts = [value for value in fields.values() if isinstance(value, str)]
        if len(texts) == 1:
            return texts[0]
        return json.dumps(fields, ensure_ascii=False, default=str)
    return str(observation)


class OpenEnvTextEnv(gym.Env):
    """One session of an OpenEnv server as a Gymnasium env (module docstring); connects at construction.

    :param client: the server's base URL (``"http://127.0.0.1:8000"``: a ``GenericEnvClient`` is made), or an
        openenv-core client (async ``EnvClient`` or its ``.sync()`` wrapper), used as is
    :param timeout: seconds to connect and to wait for each answer (given to the client made from a URL; a client
        you pass keeps its own ``message_timeout_s``, and :attr:`timeout` is then that one)
    :param reset_kwargs: more arguments of every reset (e.g. ``{"difficulty": 0.5}`` for ours)
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012

    def __init__(
        self, client: Any, timeout: float = DEFAULT_TIMEOUT, reset_kwargs: dict[str, Any] | None = None
    ) -> None:
        self.timeout: float = check_float("timeout", timeout, low=0.0, low_open=True)  # type: ignore[assignment]
        if isinstance(client, str):
            client = GenericEnvClient(base_url=client, connect_timeout_s=self.timeout, message_timeout_s=self.timeout)
        if isinstance(client, EnvClient):
            client = client.sync()
        if not isinstance(client, SyncEnvClient):
            raise ArgumentError(
                "client must be an OpenEnv server's URL or an openenv-core client (EnvClient or its .sync()), "
                f"got {type(client).__name__}"
            )
        self.client = client
        self.url = getattr(client.async_client, "_ws_url", "the server")
        self.timeout = float(getattr(client.async_client, "_message_timeout", self.timeout))  # the one it applies
        self.reset_kwargs = dict(reset_kwargs or {})
        self._closed: str | None = None
        self._tool_rewards: list[Any] = []
        #: whether an episode is in progress, its steps and how it ended (a step is refused outside one)
        self.order = EpisodeOrder(type(self).__name__)
        self._call("connect", client.connect)

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset the session (with ``seed`` when given); the first observation and ``{}``."""
        super().reset(seed=seed)
        kwargs = {**self.reset_kwargs, **({} if seed is None else {"seed": int(seed)})}
        result = self._call("reset", self.client.reset, **kwargs)
        self._tool_rewards = []
        self.order.start()
        return result.observation, {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Send ``action``; the server's observation, reward, done (see the module docstring)."""
        self.order.check()
        result = self._call("step", self.client.step, action)
        fields = observation_fields(result.observation)
        fields = fields if isinstance(fields, Mapping) else {}
        tool_reward = sum((self._reward("call_tool", value) for value in self._tool_rewards), 0.0)
        reward = self._reward("step", result.reward) + tool_reward  # inf or NaN pass: LMEnvWrapper scores them 0
        info: dict[str, Any] = {"server_reward": result.reward, "tool_reward": tool_reward}
        self._tool_rewards = []
        if isinstance(fields.get("is_success"), bool):
            info["is_success"] = fields["is_success"]
        done = returned_flag(f"the OpenEnv server at {self.url}: step's done", result.done, STEP_CONTRACT)
        truncated = bool(done) and fields.get("truncated") is True
        terminated = bool(done) and not truncated
        self.order.stepped(terminated, truncated)
        return result.observation, reward, terminated, truncated, info

    def _reward(self, what: str, value: Any) -> float:
        """The server's reward for ``what`` (``"step"``, ``"call_tool"``) as a float, 0 for None; one that is not a
        real number (``"0.5"``) is the server's bug: :class:`~grpo_gym.validation.ReturnTypeError`, naming it."""
        if value is None:
            return 0.0
        where, verb = f"the OpenEnv server at {self.url}", f"answered {what} with the reward"
        return received_number(where, value, STEP_CONTRACT, verb=verb)  # inf or NaN: LMEnvWrapper scores them 0

    def close(self) -> None:
        """Close the session (the server frees its env)."""
        if self._closed is None:
            self._closed = "it was closed"
            self._close_client()

    def _close_client(self) -> None:
        try:
            self.client.close()
        except Exception:  # closing what failed: nothing more to say
            pass

    # ------------------------------------------------------------------ MCP tools
    def tool_schemas(self, required: bool = False) -> list[dict[str, Any]]:
        """The server's MCP tools as schemas (OpenAI's function format), from a ``ListToolsAction``; ``[]`` when the
        server takes no MCP actions (``required``: raise then)."""
        try:
            result = self._call("list_tools", self.client.step, ListToolsAction(), keep_open=True)
        except OpenEnvError:
            if required or self._closed is not None:
                raise
            return []
        fields = observation_fields(result.observation)
        tools = fields.get("tools") if isinstance(fields, Mapping) else None
        if not isinstance(tools, list):
            if required:
                raise OpenEnvError(f"the OpenEnv server at {self.url} answered list_tools without a tool list")
            return []
        return mcp_schemas(tools)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        """Run one MCP call on the session (``CallToolAction``); its result, or ``RuntimeError`` with the server's
        error (which the model reads). A failed session raises :class:`~grpo_gym.tools.ToolsUnavailable`; a call
        outside an episode, :class:`~grpo_gym.episode_order.ResetNeeded`."""
        self.order.check()
        try:
            result = self._call("call_tool", self.client.step, CallToolAction(tool_name=name, arguments=arguments))
        except OpenEnvError as error:
            raise ToolsUnavailable(str(error)) from error
        self._tool_rewards.append(result.reward)  # checked by the next step (here, an error would be the model's)
        fields = observation_fields(result.observation)
        fields = fields if isinstance(fields, Mapping) else {"result": fields}
        error = fields.get("error")
        if error:
            raise RuntimeError(error.get("message", error) if isinstance(error, Mapping) else error)
        return mcp_result(fields.get("result"))

    # ------------------------------------------------------------------ failures
    def _call(self, what: str, fn: Callable[..., Any], *args: Any, keep_open: bool = False, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``; a failure as :class:`OpenEnvError` (session closed, unless ``keep_open`` and the
        server merely refused the message)."""
        if self._closed is not None:
            raise OpenEnvError(f"the session with the OpenEnv server at {self.url} is closed: {self._closed}")
        try:
            return fn(*args, **kwargs)
        except Exception as error:
            message, refused = self._explain(what, error)
            if not (keep_open and refused) and self._closed is None:
                self._closed = message
                # in the background: a graceful close waits for an answer a stuck server never gives
                threading.Thread(target=self._close_client, name="grpo-gym-openenv-close", daemon=True).start()
            raise OpenEnvError(message) from error

    def _explain(self, what: str, error: Exception) -> tuple[str, bool]:
        """What went wrong, with the fix, and whether the server merely refused the message (it goes on)."""
        from websockets.exceptions import ConnectionClosed

        detail = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        where = f"the OpenEnv server at {self.url}"
        if isinstance(error, (TimeoutError, asyncio.TimeoutError)):
            return (
                f"{where} did not answer {what} within {self.timeout:g} s (timeout): it is stuck, overloaded or "
                "gone. Check it, or give a longer timeout=; the session is closed, start the run again",
                False,
            )
        if isinstance(error, ConnectionClosed):
            said = self._last_word()  # openenv-core sends why it refuses a session, then closes it
            if "CAPACITY_REACHED" in said:
                detail = said
            elif said:
                return f"{where} refused the session: {said}", False
            else:
                return (
                    f"{where} closed the session during {what} ({detail}): it was stopped or crashed. Restart it "
                    "and start the run again (the episode in progress is lost)",
                    False,
                )
        if what == "connect" or isinstance(error, (ConnectionError, OSError)):
            return (
                f"cannot reach {where} ({detail}): is it running at that address? Start it (R1Zero-v0: grpo-gym "
                "openenv-serve --host H --port P), or fix the URL",
                False,
            )
        if "CAPACITY_REACHED" in str(error) or "CAPACITY_REACHED" in detail:
            return (
                f"{where} refused a new session: it serves at most that many at once ({detail}). Start it with more "
                "(grpo-gym openenv-serve --max-concurrent-envs N) or open fewer sessions (n_envs)",
                False,
            )
        if "Server error" in str(error):  # the server refused or failed this message; the session goes on
            hint = " (check that action_parser makes the action its /schema describes)" if what == "step" else ""
            return f"{where} failed {what}: {detail}{hint}", True
        return (
            f"the OpenEnv client could not send {what} to {where} ({detail}): give an action_parser that makes the "
            "action type this client sends",
            True,
        )

    def _last_word(self) -> str:
        """The message a server sent before it closed the session, if one is still unread (best effort, through
        openenv-core's private ``_receive``); ``""`` when there is none."""
        try:
            data = self.client._receive().get("data") or {}
        except Exception:
            return ""
        return f"{data.get('message', '')} (code: {data.get('code', '?')})" if isinstance(data, Mapping) else ""


def action_field(schema: Mapping[str, Any]) -> str:
    """The only free-text field of an action's JSON schema (the default ``action_parser`` fills it); ``ValueError``
    naming the fields when there is not exactly one."""
    properties = schema.get("properties") or {}
    texts = [
        name
        for name, spec in properties.items()
        if isinstance(spec, Mapping) and spec.get("type") == "string" and "enum" not in spec and "const" not in spec
        if name not in ("type", "tool_name")
    ]
    if len(texts) != 1:
        raise ArgumentError(
            f"the server's action has the fields {sorted(properties)}, not one text field to fill: pass "
            "action_parser=lambda text: {...} (the action as a dict, or the client's action class)"
        )
    return texts[0]


def _schema_action_parser(url: str, timeout: float) -> Callable[[str], dict[str, Any]]:
    """The default ``action_parser`` of the server at ``url``: ``{field: text}`` (its ``/schema``'s action)."""
    import httpx

    base = url.rstrip("/")
    base = base.replace("ws://", "http://", 1).replace("wss://", "https://", 1)
    try:
        response = httpx.get(f"{base}/schema", timeout=timeout)
        response.raise_for_status()
        schema = response.json()["action"]
    except Exception as error:
        raise OpenEnvError(
            f"cannot read the action schema of the OpenEnv server at {base} ({type(error).__name__}: {error}): is "
            "it running there? Or pass action_parser= to make its actions yourself"
        ) from None
    name = action_field(schema)
    return lambda text: {name: text}


def openenv_env(
    client: Any,
    action_parser: Callable[[str], Any] | None = None,
    obs_to_text: Callable[[Any], str] = observation_text,
    tools: bool | str = "auto",
    timeout: float = DEFAULT_TIMEOUT,
    reset_kwargs: dict[str, Any] | None = None,
    **wrapper_kwargs: Any,
) -> LMEnvWrapper:
    """One OpenEnv session as the env GRPO trains on (module docstring).

    :param client: the server's URL, or an openenv-core client (see :class:`OpenEnvTextEnv`)
    :param action_parser: a completion's text as the action the client sends (an exception is shown to the model);
        default for a URL: the action schema's only text field, ``{field: text}``; for a client: the text itself
    :param obs_to_text: an observation as the text the model reads
    :param tools: ``"auto"``: the server's MCP tools when it lists any; ``True``: they must be listed; ``False``:
        none (a ``<tool_call>`` is then sent as any completion)
    :param timeout: seconds to connect and to wait for each answer
    :param reset_kwargs: more arguments of every reset
    :param wrapper_kwargs: :class:`~grpo_gym.wrappers.LMEnvWrapper`'s arguments (``max_new_tokens``,
        ``context_length``, ``max_turns``, ``template``, ``tokenizer``, ``max_tool_calls``, ...)
    """
    if tools not in ("auto", True, False):
        raise ArgumentError(f"tools must be 'auto', True or False, got {tools!r}")
    if "tools" in wrapper_kwargs:
        raise ArgumentError("the tools of an OpenEnv env are the server's: pass tools='auto', True or False")
    env = OpenEnvTextEnv(client, timeout, reset_kwargs)
    try:
        if action_parser is None:
            action_parser = _schema_action_parser(client, timeout) if isinstance(client, str) else (lambda t: t)
        schemas = env.tool_schemas(required=tools is True) if tools else []
        toolbox = None
        if schemas:  # our tool loop, each call on this session; the client's timeout fires before the loop's
            toolbox = remote_toolbox(schemas, env.call_tool, timeout=env.timeout + 5.0)
        return LMEnvWrapper(env, obs_to_text=obs_to_text, action_parser=action_parser, tools=toolbox, **wrapper_kwargs)
    except BaseException:
        env.close()
        raise


def openenv_vec_env(client: Any, n_envs: int = 1, **kwargs: Any) -> Any:
    """``n_envs`` sessions of one OpenEnv server (:func:`openenv_env` each, in SB3's ``Monitor``) as a
    :class:`~grpo_gym.interop.vec_env.ThreadedVecEnv`, which resets and steps them at once.

    :param client: the server's URL, or a function returning a new openenv-core client (one per session)
    :param n_envs: the sessions (the server must serve that many at once: its ``max_concurrent_envs``)
    :param kwargs: :func:`openenv_env`'s other arguments
    """
    from stable_baselines3.common.monitor import Monitor

    from grpo_gym.interop.vec_env import ThreadedVecEnv
    from grpo_gym.validation import check_int

    check_int("n_envs", n_envs, low=1)
    if not isinstance(client, str) and not callable(client):
        raise ArgumentError("client must be the server's URL or a function returning a new client (one per session)")
    make = (lambda: client) if isinstance(client, str) else client
    envs = []
    try:
        for _ in range(n_envs):
            envs.append(Monitor(openenv_env(make(), **kwargs)))
    except BaseException:
        for env in envs:
            env.close()
        raise
    return ThreadedVecEnv([lambda env=env: env for env in envs])
