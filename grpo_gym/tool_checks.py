"""What a tool and a call must be before anything runs (:mod:`grpo_gym.tools` runs the calls).

:func:`resolve_tools` names the tools, :func:`check_tool` refuses what cannot be one, :func:`function_schema` derives a
function's JSON schema the way transformers does, :func:`check_schema` refuses a schema (a remote tool's) that could
not check a call, and :func:`check_arguments` checks one call's arguments against its tool's schema.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpo_gym.validation import ArgumentError

_JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def _type_name(value: Any) -> str:
    for name, types in _JSON_TYPES.items():
        if isinstance(value, types) and not (isinstance(value, bool) and name in ("integer", "number")):
            return name
    return type(value).__name__


def check_value(value: Any, schema: Mapping[str, Any], where: str) -> str | None:
    """Why ``value`` does not fit the JSON ``schema`` (the subset :func:`get_json_schema` writes), or None; a part of
    the schema that is not a schema (a remote tool's) checks nothing."""
    if not isinstance(schema, Mapping):
        return None
    if value is None and schema.get("nullable"):
        return None
    wanted = schema.get("type")
    wanted = [wanted] if isinstance(wanted, str) else list(wanted or [])
    if wanted and _type_name(value) not in wanted and not (_type_name(value) == "integer" and "number" in wanted):
        return f"{where} must be {' or '.join(wanted)}, got {_type_name(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {schema['enum']}, got {value!r}"
    if isinstance(value, list):
        prefix = schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else None
        if prefix is not None and len(value) != len(prefix):
            return f"{where} must hold {len(prefix)} items, got {len(value)}"
        for i, item in enumerate(value):
            item_schema = prefix[i] if prefix is not None else schema.get("items", {})
            reason = check_value(item, item_schema, f"{where}[{i}]")
            if reason:
                return reason
    if isinstance(value, dict):
        for key, item in value.items():
            reason = check_value(item, schema.get("additionalProperties") or {}, f"{where}[{key!r}]")
            if reason:
                return reason
    return None


def check_arguments(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` do not fit a tool's parameters schema (missing, unknown or mistyped), or None."""
    properties = schema.get("properties", {})
    unknown = [name for name in arguments if name not in properties]
    if unknown:
        return f"unexpected argument(s) {', '.join(map(repr, unknown))}; it takes {', '.join(properties) or 'none'}"
    missing = [name for name in schema.get("required", []) if name not in arguments]
    if missing:
        return f"missing required argument(s) {', '.join(map(repr, missing))}"
    for name, value in arguments.items():
        reason = check_value(value, properties[name], f"argument {name!r}")
        if reason:
            return reason
    return None


def check_tool(name: str, fn: Any) -> None:
    """Refuse, naming ``name`` and the fix, what cannot be a tool: not callable, or a generator function (sync or
    async), whose calls would hand back a generator instead of running and returning a result."""
    if not callable(fn):
        raise ArgumentError(f"tools[{name!r}] must be a function, got {type(fn).__name__}")
    call = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else getattr(fn, "__call__", fn)  # noqa: B004
    if inspect.isgeneratorfunction(call) or inspect.isasyncgenfunction(call):
        kind = "an async generator" if inspect.isasyncgenfunction(call) else "a generator"
        raise ArgumentError(
            f"tool {name!r} is {kind} function (it yields): a call would return a generator, not a result; make it "
            "return its result (a string or JSON data), e.g. collect what it yields with list(...) or ''.join(...)"
        )


def check_schema(name: str, schema: Any) -> None:
    """Refuse, naming the tool, a schema (OpenAI's function format; a remote tool's comes from its server) that
    calls could not be checked against: ``parameters`` must be an object schema whose ``properties`` map names to
    schemas with a JSON type name (or a list of them) and whose ``required`` lists names."""
    function = schema.get("function") if isinstance(schema, Mapping) else None
    parameters = function.get("parameters") if isinstance(function, Mapping) else None
    properties = parameters.get("properties", {}) if isinstance(parameters, Mapping) else None
    required = parameters.get("required", []) if isinstance(parameters, Mapping) else None
    problem = None
    if not isinstance(properties, Mapping):
        problem = "'parameters' must be an object schema with a dict of 'properties'"
    elif not isinstance(required, list) or not all(isinstance(item, str) for item in required):
        problem = "'required' must be a list of argument names"
    else:
        for argument, spec in properties.items():
            kind = spec.get("type", []) if isinstance(spec, Mapping) else None
            kinds = [kind] if isinstance(kind, str) else kind
            if not isinstance(kinds, list) or not all(k in _JSON_TYPES for k in kinds):
                types = ", ".join(_JSON_TYPES)
                problem = f"argument {argument!r} needs a schema with a JSON type ({types}), got {spec!r:.80}"
                break
    if problem is not None:
        raise ArgumentError(f"tool {name!r}: its schema cannot check calls: {problem}; fix the tool's schema")


def function_schema(name: str, fn: Any) -> dict[str, Any]:
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(fn)
    except Exception as error:  # transformers' DocstringParsingException / TypeHintParsingException
        raise ArgumentError(
            f"tool {name!r}: cannot derive its JSON schema ({error}); give it type hints on every argument and a "
            "Google-style docstring with an 'Args:' entry per argument"
        ) from None
    schema["function"]["name"] = name
    return schema


def resolve_tools(tools: Any) -> dict[str, Callable[..., Any]]:
    """``tools`` (a list of functions and built-in names, or a dict of names to functions) as ``{name: fn}``."""
    from grpo_gym.builtin_tools import BUILTIN_TOOLS

    def one(item: Any) -> tuple[str, Any]:
        if isinstance(item, str):
            if item not in BUILTIN_TOOLS:
                raise ArgumentError(
                    f"unknown built-in tool {item!r}; built-in: {', '.join(BUILTIN_TOOLS)} (or pass a function)"
                )
            return item, BUILTIN_TOOLS[item]
        return getattr(item, "__name__", None) or type(item).__name__, item

    if isinstance(tools, Mapping):
        pairs = [(name, BUILTIN_TOOLS.get(fn, fn) if isinstance(fn, str) else fn) for name, fn in tools.items()]
    elif isinstance(tools, Sequence) and not isinstance(tools, str):
        pairs = [one(item) for item in tools]
    else:
        raise ArgumentError(f"tools must be a list of functions or a dict {{name: function}}, got {type(tools)}")
    names = [name for name, _ in pairs]
    for name in names:
        if not isinstance(name, str) or not name.isidentifier() or names.count(name) > 1:
            raise ArgumentError(
                f"tools: names must be distinct identifiers, got {names}: the model calls a tool by its name, so "
                "define each with `def name(...)` (a lambda or partial has none), or name them in a dict: "
                "tools={'name': function}"
            )
    return dict(pairs)
