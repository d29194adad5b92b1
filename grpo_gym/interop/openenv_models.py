"""``R1Zero-v0``'s OpenEnv types: its action, its observation and its client (OpenEnv's ``models.py`` and
``client.py`` of an environment).

An action is a model turn, ``R1ZeroAction(completion="<think>...</think><answer>...</answer>")``, or one of MCP's
two (``{"type": "list_tools"}``, ``{"type": "call_tool", "tool_name": ..., "arguments": {...}}``), so the payloads of
openenv-core's ``MCPToolClient`` and of ``ListToolsAction`` / ``CallToolAction`` are R1Zero actions too. An
observation carries what the model reads next (``prompt``, and the bare ``message``), the reward's components and
reasons, success, whether the episode was cut (``truncated``; ``done`` is terminated or truncated) and the turn's
tool calls. :class:`R1ZeroClient` is openenv-core's ``EnvClient`` for them: ``step`` takes a completion's text or an
action, and returns an :class:`R1ZeroObservation` (or MCP's observation for an MCP action).
"""

from __future__ import annotations

from typing import Any, Literal

try:
    from openenv.core import EnvClient
    from openenv.core.client_types import StepResult
    from openenv.core.env_server.mcp_types import CallToolObservation, ListToolsObservation, Tool, ToolError
    from openenv.core.env_server.types import Action, Observation, State
except ImportError as error:  # pragma: no cover - the extra is not installed
    message = f"grpo_gym.interop.openenv_models needs openenv-core ({error}): pip install 'grpo-gym[openenv]'"
    raise ImportError(message) from error
from pydantic import Field


class R1ZeroAction(Action):
    """One step of an ``R1Zero-v0`` session: a completion, or an MCP action (module docstring)."""

    type: Literal["completion", "list_tools", "call_tool"] = Field(
        default="completion", description="'completion' (a model turn) or an MCP action"
    )
    completion: str = Field(
        default="", description="the model's completion, e.g. <think>...</think><answer>...</answer>"
    )
    tool_name: str = Field(default="", description="call_tool: the tool to call")
    arguments: dict[str, Any] = Field(default_factory=dict, description="call_tool: its arguments")


class R1ZeroObservation(Observation):
    """What an ``R1Zero-v0`` session says after a reset or a completion (module docstring)."""

    prompt: str = Field(default="", description="the text the model reads next, as the env renders it")
    message: str = Field(default="", description="the same without the template: the question, feedback or results")
    completion: str = Field(default="", description="the completion as the env scored it (cut at max_new_tokens)")
    reward_components: dict[str, float | None] = Field(default_factory=dict, description="the reward's components")
    reward_reasons: dict[str, str] = Field(default_factory=dict, description="why each component scored as it did")
    is_success: bool = Field(default=False, description="the task gave full credit")
    truncated: bool = Field(default=False, description="the episode was cut (window full, tool budget spent)")
    tool_calls: list[dict[str, Any]] = Field(default_factory=list, description="this turn's tool calls")
    turn: int = Field(default=0, description="the model turns of the episode so far")


def tool_list(schemas: list[dict[str, Any]]) -> list[Tool]:
    """Tool schemas (OpenAI's function format) as MCP's ``Tool`` descriptions."""
    return [
        Tool(
            name=s["function"]["name"],
            description=s["function"].get("description", ""),
            input_schema=s["function"].get("parameters") or {"type": "object", "properties": {}},
        )
        for s in schemas
    ]


class R1ZeroClient(EnvClient[R1ZeroAction, R1ZeroObservation, State]):
    """openenv-core's client for an ``R1Zero-v0`` server (``grpo-gym openenv-serve``): one instance, one session.

    ``await client.step("<answer>4</answer>")`` (or ``client.sync().step(...)``) sends a completion; an
    :class:`R1ZeroAction` and MCP's ``ListToolsAction`` / ``CallToolAction`` are sent as they are. Arguments as
    ``EnvClient`` (``base_url``, ``connect_timeout_s``, ``message_timeout_s``, ...).
    """

    def _step_payload(self, action: Any) -> dict[str, Any]:
        if isinstance(action, str):
            return {"type": "completion", "completion": action}
        if isinstance(action, dict):
            return action
        if hasattr(action, "model_dump"):
            return action.model_dump(exclude={"metadata"})
        raise TypeError(f"an R1Zero action is a completion's text or an R1ZeroAction, got {type(action).__name__}")

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[Any]:
        fields = dict(payload.get("observation") or {})
        reward, done = payload.get("reward"), bool(payload.get("done", False))
        if "tools" in fields:
            observation: Observation = ListToolsObservation(tools=fields["tools"], reward=reward, done=done)
        elif "tool_name" in fields:
            error = ToolError(**fields["error"]) if fields.get("error") else None
            observation = CallToolObservation(
                tool_name=fields["tool_name"], result=fields.get("result"), error=error, reward=reward, done=done
            )
        else:
            known = {k: v for k, v in fields.items() if k in R1ZeroObservation.model_fields}
            observation = R1ZeroObservation(**known, reward=reward, done=done)
        return StepResult(observation=observation, reward=reward, done=done)

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)
