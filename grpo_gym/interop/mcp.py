"""MCP tools that run elsewhere (an OpenEnv server's), in our tool loop (:mod:`grpo_gym.tools`).

:func:`mcp_schemas` turns an MCP tool listing (``ListToolsObservation.tools``, or its JSON) into the schemas the prompt
shows (OpenAI's function format, as :func:`transformers.utils.get_json_schema` writes them for local tools);
:func:`remote_toolbox` makes a :class:`~grpo_gym.tools.Toolbox` whose calls go through one function, so the model's
``<tool_call>`` is parsed, checked against the schema and limited exactly as for local tools; :func:`mcp_result`
reads a call's result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpo_gym.tools import DEFAULT_TIMEOUT, Toolbox, ToolLimits
from grpo_gym.validation import ArgumentError


def _fields(tool: Any) -> Mapping[str, Any]:
    return tool if isinstance(tool, Mapping) else tool.model_dump() if hasattr(tool, "model_dump") else vars(tool)


def mcp_schemas(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """MCP tools (``name``, ``description``, ``input_schema`` or ``inputSchema``) as function schemas."""
    schemas = []
    for tool in tools:
        fields = _fields(tool)
        if not isinstance(fields.get("name"), str):
            raise ArgumentError(f"an MCP tool has a name, a description and an input schema, got {fields!r:.200}")
        parameters = fields.get("input_schema") or fields.get("inputSchema") or {"type": "object", "properties": {}}
        function = {"name": fields["name"], "description": fields.get("description") or "", "parameters": parameters}
        schemas.append({"type": "function", "function": function})
    return schemas


def mcp_result(value: Any) -> Any:
    """An MCP call's result as a value: FastMCP's ``data``, or its text contents joined, else as it came."""
    if isinstance(value, Mapping):
        if value.get("data") is not None:
            return value["data"]
        contents = value.get("content")
        if isinstance(contents, list) and contents:
            return "\n".join(str(c.get("text", c)) if isinstance(c, Mapping) else str(c) for c in contents)
    return value


def remote_toolbox(
    schemas: Sequence[Mapping[str, Any]],
    call: Callable[[str, dict[str, Any]], Any],
    timeout: float = DEFAULT_TIMEOUT,
    limits: ToolLimits | None = None,
) -> Toolbox:
    """Tools that run elsewhere: their function ``schemas`` and ``call(name, arguments)``, which runs one call and
    returns its result (or raises :class:`~grpo_gym.tools.ToolsUnavailable` when no call can run any more).

    :param schemas: one schema per tool (:func:`mcp_schemas`); the names must be distinct identifiers
    :param call: runs one call
    :param timeout: seconds a call may take before it is abandoned
    :param limits: the parsing and size limits
    """
    names = [schema["function"]["name"] for schema in schemas]
    if len(set(names)) < len(names):
        raise ArgumentError(f"tool names must be distinct, got {names}")

    def runner(name: str) -> Callable[..., Any]:
        return lambda **arguments: call(name, arguments)

    return Toolbox({name: runner(name) for name in names}, timeout, limits, schemas=[dict(s) for s in schemas])
