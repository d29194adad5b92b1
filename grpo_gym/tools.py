"""Tools in episodes: the model calls Python functions, the env runs them and shows it the results.

**Tools** are plain Python functions with type hints and a Google-style docstring (an ``Args:`` entry per
argument), sync or ``async``; their JSON schemas are derived the way transformers does
(:func:`transformers.utils.get_json_schema`), and the env shows them to the model (see
:mod:`grpo_gym.templates`). ``tools=[fn, ...]`` names each by its ``__name__``, ``tools={"name": fn}`` by its key;
a string names a built-in tool (:data:`grpo_gym.builtin_tools.BUILTIN_TOOLS`, e.g. ``"calculator"``).

**The call format** is Hermes / Qwen's, what pretrained chat models emit::

    <tool_call>{"name": "calculator", "arguments": {"expression": "37+48*2"}}</tool_call>

A turn may hold several calls. Each is parsed with :func:`json.loads` (never ``eval``), under limits
(:class:`ToolLimits`): its JSON text at most ``max_call_chars`` characters and ``max_depth`` levels deep,
``max_calls_per_turn`` calls a turn, ``max_tool_calls`` an episode (the env's argument). A call must be an object
with a string ``name`` naming a tool and an object ``arguments`` (may be left out when the tool needs none) whose
values fit the tool's schema (JSON types, ``enum``, array items, nullable; no argument missing, none unknown).

**Running.** A call that passes runs in a fresh daemon thread, for at most ``timeout`` seconds; past it the call is
abandoned (the thread is left to finish in the background, its result dropped) and reported as an error, and the env
goes on. The tool gets its own deep copy of the arguments: ``info["tool_calls"][i]["arguments"]`` keeps what the
model sent, whatever the tool does to them. A tool's return value is shown as is when it is a string, else as
``json.dumps`` of it (``str`` when that fails), cut to ``max_result_chars`` characters; a lone surrogate in it (no
tokenizer encodes one) is shown as ``?``. A generator function (sync or async) is refused as a tool when the
``Toolbox`` is made: it would return a generator, not run; a tool that returns a generator or a coroutine anyway
(an ``async def`` returning a generator) gets an error naming the fix, and a warning once.

**Errors are messages, never exceptions:** malformed JSON, an unknown tool, missing, unknown or mistyped arguments,
an oversized or too deeply nested call, too many calls, a tool that raises, one that times out: each becomes the
text ``"Error: <reason>"``, which the model reads in place of a result, and an ``"error"`` entry in
``info["tool_calls"]``. The one exception is :class:`ToolsUnavailable`: a tool that raises it says the tools
themselves are gone (the server that runs them stopped answering), and it propagates from the env's ``step``.

**Tools that run elsewhere** (an OpenEnv server's MCP tools, :mod:`grpo_gym.interop.mcp`) come with their schemas
(``Toolbox(functions, schemas=...)``); parsing, checking and limits are the same.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpo_gym.tool_checks import check_arguments, check_schema, check_tool, function_schema, resolve_tools
from grpo_gym.validation import ArgumentError, check_float, check_int, json_depth, unicode_error

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
DEFAULT_TIMEOUT = 10.0
_MAX_ERROR_CHARS = 300


@dataclass(frozen=True)
class ToolLimits:
    """Bounds on what a model's tool calls can cost (see the module docstring).

    :param max_call_chars: the longest JSON text of one call, in characters
    :param max_depth: the deepest nesting of JSON objects and arrays in one call
    :param max_calls_per_turn: calls run in one turn (later ones get a "too many calls" error)
    :param max_result_chars: a result (or error) longer than this is cut
    """

    max_call_chars: int = 4096
    max_depth: int = 8
    max_calls_per_turn: int = 4
    max_result_chars: int = 2000

    def __post_init__(self) -> None:
        for name in ("max_call_chars", "max_depth", "max_calls_per_turn", "max_result_chars"):
            check_int(f"ToolLimits.{name}", getattr(self, name), low=1)


@dataclass(frozen=True)
class ParsedCall:
    """One ``<tool_call>`` block: the tool's name and arguments, or why they could not be read."""

    name: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class ToolTurn:
    """What the env does with one turn's calls.

    :param records: one dict per call for ``info["tool_calls"]``: ``name``, ``arguments``, ``result`` or ``error``,
        ``seconds`` (the wall time of the run; 0 for a call that never ran)
    :param messages: the text the model reads, one per call: the result, or ``"Error: <reason>"``
    :param calls: the calls counted against the episode's budget (those within the limits)
    :param errors: the calls that failed, whatever the reason
    """

    records: list[dict[str, Any]]
    messages: list[str]
    calls: int
    errors: int


class ToolsUnavailable(RuntimeError):
    """Raised by a tool when no call can run any more (the server that runs the tools is gone): it ends the episode
    with this error instead of becoming a message the model reads."""


def error_text(exc: BaseException) -> str:
    """``"ExceptionType: message"`` on one line, capped at 300 characters."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:_MAX_ERROR_CHARS]


def has_tool_call(text: str) -> bool:
    """Whether ``text`` tries to call a tool (holds ``<tool_call>``): such a turn is a tool turn, not an answer."""
    return TOOL_CALL_OPEN in text


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_call(body: str, limits: ToolLimits) -> ParsedCall:
    """Read the JSON between ``<tool_call>`` and ``</tool_call>``; never raises (see the module docstring)."""
    if len(body) > limits.max_call_chars:
        return ParsedCall(error=f"tool call longer than {limits.max_call_chars} characters")
    if json_depth(body) > limits.max_depth:
        return ParsedCall(error=f"tool call nested deeper than {limits.max_depth} levels")
    try:
        call = json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:  # JSONDecodeError is a ValueError
        return ParsedCall(error=f"malformed JSON ({' '.join(str(error).split())[:200]})")
    shape = 'a tool call is a JSON object {"name": "<tool>", "arguments": {...}}'
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ParsedCall(error=f"{shape}; got no name")
    unknown = sorted(set(call) - {"name", "arguments"})
    if unknown:
        return ParsedCall(name=call["name"], error=f"{shape}; unexpected keys {unknown}")
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        return ParsedCall(name=call["name"], error=f"{shape}; 'arguments' must be an object")
    return ParsedCall(name=call["name"], arguments=arguments)


def parse_tool_calls(text: str, limits: ToolLimits) -> list[ParsedCall]:
    """Every ``<tool_call>…</tool_call>`` block of ``text``, in order; an unclosed one is a call with an error."""
    calls = []
    start = text.find(TOOL_CALL_OPEN)
    while start >= 0:
        body_start = start + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, body_start)
        if end < 0:
            calls.append(ParsedCall(error=f"unclosed {TOOL_CALL_OPEN}: end the call with {TOOL_CALL_CLOSE}"))
            break
        calls.append(parse_call(text[body_start:end], limits))
        start = text.find(TOOL_CALL_OPEN, end + len(TOOL_CALL_CLOSE))
    return calls


def result_text(value: Any, max_chars: int) -> str:
    """A tool's return value as the text the model reads: a string as is, else JSON (``str`` when not JSON
    data), cut to ``max_chars`` characters with a note saying so."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            text = str(value)
    if len(text) > max_chars:
        text = f"{text[:max_chars]}... [cut: {len(text)} characters]"
    return valid_text(text)


def valid_text(text: str) -> str:
    """``text`` with every lone surrogate (``"\\ud800"``: a JSON escape the model or a tool may produce; no tokenizer
    encodes one) replaced by ``?``, so the env can show it to the model."""
    return text if unicode_error(text) is None else text.encode("utf-8", "replace").decode("utf-8")


#: what a call's value is when the tool was written as a generator: the tool returns it instead of a result
_NOT_RESULTS = (inspect.isgenerator, inspect.isasyncgen, inspect.iscoroutine)


def run_call(fn: Callable[..., Any], arguments: dict[str, Any], timeout: float, max_chars: int) -> dict[str, Any]:
    """Run ``fn(**arguments)`` (awaited when async) and convert its result in a daemon thread, waiting at most
    ``timeout`` seconds: ``{"result": text}`` or ``{"error": reason}``, and ``"seconds"``."""
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            value = fn(**arguments)
            if inspect.isawaitable(value):
                value = asyncio.run(_awaited(value))
            if any(test(value) for test in _NOT_RESULTS):
                outcome["broken"] = True
                value.close()  # never started: closing it runs nothing and leaves no "never awaited" warning
                raise TypeError(
                    f"the tool returned a {type(value).__name__}, not a result: a tool returns its result (a string "
                    "or JSON data); collect what it yields, e.g. return list(...) or ''.join(...)"
                )
            outcome["result"] = result_text(value, max_chars)
        except ToolsUnavailable as exc:  # not the call's failure: the tools are gone
            outcome["unavailable"] = exc
        except BaseException as exc:  # a tool's failure is the model's information, whatever it is
            outcome["error"] = valid_text(error_text(exc))

    started = time.perf_counter()
    thread = threading.Thread(target=work, name="grpo-gym-tool", daemon=True)
    thread.start()
    thread.join(min(timeout, threading.TIMEOUT_MAX))  # a huge limit is no limit (join refuses one past TIMEOUT_MAX)
    seconds = time.perf_counter() - started
    if thread.is_alive():  # abandoned: the thread finishes (or not) on its own, its result is dropped
        return {"error": f"timed out after {timeout:g} s (the call was abandoned)", "seconds": seconds}
    if "unavailable" in outcome:
        raise outcome["unavailable"]
    return {**outcome, "seconds": seconds}


async def _awaited(value: Any) -> Any:
    return await value


class Toolbox:
    """The tools of an env: their schemas, and one turn's calls parsed, checked and run.

    :param tools: a list of functions and built-in tool names, or a dict ``{name: function}``
    :param timeout: seconds a call may run before it is abandoned (``tool_timeout``)
    :param limits: the parsing and size limits
    :param schemas: the tools' schemas (OpenAI's function format), one per tool in order; default: derived from each
        function's type hints and docstring (tools that run elsewhere bring theirs)
    """

    def __init__(
        self,
        tools: Any,
        timeout: float = DEFAULT_TIMEOUT,
        limits: ToolLimits | None = None,
        schemas: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        self.functions = resolve_tools(tools)
        if not self.functions:
            raise ArgumentError("tools is empty: pass at least one function, or tools=None for no tools")
        for name, fn in self.functions.items():
            check_tool(name, fn)
        self._warned: set[str] = set()  # the tools warned about (one returned a generator)
        if schemas is None:
            self.schemas = [function_schema(name, fn) for name, fn in self.functions.items()]
        else:
            self.schemas = [dict(schema) for schema in schemas]
            for name, schema in zip(self.functions, self.schemas, strict=True):
                check_schema(name, schema)
        self.timeout: float = check_float("tool_timeout", timeout, low=0.0, low_open=True)  # type: ignore[assignment]
        self.limits = limits or ToolLimits()
        check_int("max_calls_per_turn", self.limits.max_calls_per_turn, low=1)

    @property
    def names(self) -> list[str]:
        """The tools' names, in order."""
        return list(self.functions)

    def play(self, text: str, calls_left: int) -> ToolTurn:
        """Parse, check and run the calls of a completion ``text``, at most ``calls_left`` of them (the episode's
        budget) and ``max_calls_per_turn``; every other call gets a "too many calls" error."""
        allowed = min(calls_left, self.limits.max_calls_per_turn)
        records: list[dict[str, Any]] = []
        for index, call in enumerate(parse_tool_calls(text, self.limits)):
            record: dict[str, Any] = {"name": call.name, "arguments": call.arguments, "seconds": 0.0}
            if index >= allowed:
                record["error"] = (
                    f"too many tool calls (at most {self.limits.max_calls_per_turn} a turn and {calls_left} more in "
                    "this episode); this one was not run"
                )
            else:
                record.update(self._outcome(call))
            records.append(record)
        messages = [valid_text(r["result"] if "error" not in r else f"Error: {r['error']}") for r in records]
        errors = sum("error" in r for r in records)
        return ToolTurn(records, messages, calls=min(len(records), allowed), errors=errors)

    def _outcome(self, call: ParsedCall) -> dict[str, Any]:
        if call.error is not None:
            return {"error": call.error}
        if call.name not in self.functions:
            return {"error": f"unknown tool {call.name!r}; the tools are {', '.join(self.functions)}"}
        schema = self.schemas[self.names.index(call.name)]["function"]["parameters"]
        reason = check_arguments(schema, call.arguments)
        if reason:
            return {"error": f"{call.name}: {reason}"}
        arguments = copy.deepcopy(call.arguments)  # the record keeps what the model sent, whatever the tool changes
        outcome = run_call(self.functions[call.name], arguments, self.timeout, self.limits.max_result_chars)
        if outcome.pop("broken", False) and call.name not in self._warned:  # the tool's bug, not the model's
            self._warned.add(call.name)
            warnings.warn(f"tool {call.name!r}: {outcome['error']}", RuntimeWarning, stacklevel=4)
        return outcome
