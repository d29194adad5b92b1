"""The server's requests, read without trusting them: size, encoding, JSON and fields checked before any work.

:func:`read_body` reads at most ``max_body_bytes`` (413 beyond, without reading the rest); :func:`parse_request` then
requires UTF-8, standard JSON (no ``NaN``/``Infinity``) and :class:`CompletionRequest`'s fields with their exact
types (``max_tokens: true`` or ``1.0`` is not an integer; ``temperature: true`` is not a number), no other field
(``"max_token"`` or ``"temperture"`` is refused naming the field it meant, not answered with the defaults), and
OpenAI's fields the server does not implement (``stream``, ``seed``, ``presence_penalty``, ...) unset; every
prompt and stop string must be valid Unicode (no lone surrogate) and a prompt at most ``max_prompt_chars``
characters, checked before it is tokenized. Each failure is a :class:`BadRequest`: OpenAI's JSON error, naming the
field (``param``).
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from algorithms.common.generation.sampler import MIN_TEMPERATURE
from grpo_gym.validation import unicode_error


class BadRequest(ValueError):
    """A request the server refuses (400 unless ``status`` says otherwise), naming the field (``param``)."""

    def __init__(self, param: str | None, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


class CompletionRequest(BaseModel):
    """The body of ``POST /v1/completions``: OpenAI's fields with their JSON types, strictly; any other field is
    refused (:func:`check_fields`). ``model`` is accepted whatever it names (one model is served, and clients name it
    as they were configured); ``user`` (OpenAI's end-user id) is accepted and not used."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    user: str | None = None
    prompt: str | list[str]
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    echo: bool = False
    logprobs: int | None = None
    seed: int | None = None
    best_of: int | None = None
    suffix: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None


def validation_message(error: ValidationError | Any) -> tuple[str, str | None]:
    """``(message, param)`` of the first error of a pydantic / FastAPI validation error."""
    first = error.errors()[0]
    where = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = where[0] if where and not where[0].isdigit() else None
    return f"{'.'.join(where) or 'body'}: {first.get('msg', 'invalid value')}", param


async def read_body(request: Any, limit: int) -> bytes:
    """The request's body, refused with 413 once it is longer than ``limit`` bytes (the rest is never read)."""
    declared = request.headers.get("content-length")
    too_long = BadRequest(None, f"the request body is larger than the server's max_body_bytes ({limit})", 413)
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_long
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_long
        chunks.append(chunk)
    return b"".join(chunks)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON value")


def parse_request(raw: bytes, max_prompt_chars: int) -> tuple[CompletionRequest, list[str], list[str]]:
    """``(body, prompts, stops)`` of a raw request body; :class:`BadRequest` naming what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BadRequest(
            None, f"the request body is not UTF-8 text (byte 0x{raw[error.start]:02x} at offset {error.start})"
        ) from None
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:
        detail = "nested too deeply" if isinstance(error, RecursionError) else " ".join(str(error).split())[:200]
        raise BadRequest(None, f"the request body is not valid JSON ({detail})") from None
    check_fields(data)
    try:
        body = CompletionRequest.model_validate(data)
    except ValidationError as error:
        raise BadRequest(*reversed(validation_message(error))) from None
    check_supported(body)
    return body, _prompts(body, max_prompt_chars), _stops(body.stop)


UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "stream": (False, "stream=true is not supported by this server"),
    "stream_options": (None, "stream_options is not supported by this server (nor is stream)"),
    "echo": (False, "echo=true is not supported by this server"),
    "logprobs": (None, "logprobs are not supported by this server"),
    "seed": (None, "seed is not supported when sampling: sampled completions come from the server's one generator "
             "(grpo-gym serve --seed); send temperature 0 for answers that repeat (seed is then accepted)"),
    "best_of": (1, "best_of is not supported by this server; send n and pick among the choices"),
    "suffix": (None, "suffix is not supported by this server"),
    "presence_penalty": (0.0, "presence_penalty is not supported by this server (only 0)"),
    "frequency_penalty": (0.0, "frequency_penalty is not supported by this server (only 0)"),
    "logit_bias": ({}, "logit_bias is not supported by this server"),
}  # fmt: skip
"""OpenAI fields the server does not implement: ``{name: (neutral value, message)}``. A request that sets one to
other than ``None`` or its neutral value is refused, naming it, rather than answered as if it had not asked."""


def check_fields(data: Any) -> None:
    """:class:`BadRequest` naming the first field of ``data`` (a JSON object) that is not one of OpenAI's completion
    fields, with the close match (``"max_token"``: ``max_tokens``): a misspelt field would otherwise be answered
    with the default it meant to change."""
    if not isinstance(data, dict):
        return  # the model's own validation says what the body must be
    known = list(CompletionRequest.model_fields)
    for name in data:
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise BadRequest(
                str(name),
                f"unknown field {str(name)!r:.80}; {hint}the fields of a completion request: {', '.join(known)}",
            )


def check_supported(body: CompletionRequest) -> None:
    """:class:`BadRequest` naming the first field of :data:`UNSUPPORTED` that ``body`` sets. A ``seed`` with greedy
    decoding (temperature or top_p below ``MIN_TEMPERATURE``) is accepted: the answer repeats without one, and
    clients such as lm-evaluation-harness send a seed with every request."""
    greedy = body.temperature < MIN_TEMPERATURE or body.top_p < MIN_TEMPERATURE
    for name, (neutral, message) in UNSUPPORTED.items():
        value = getattr(body, name)
        if value is not None and value != neutral and not (name == "seed" and greedy):
            raise BadRequest(name, message)


def _check_text(param: str, text: str, index: int | None) -> None:
    problem = unicode_error(text)
    if problem is not None:
        where = param if index is None else f"{param}[{index}]"
        raise BadRequest(param, f"{where} holds {problem}, which is not valid Unicode text")


def _prompts(body: CompletionRequest, max_prompt_chars: int) -> list[str]:
    prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
    if not prompts or any(not p for p in prompts):
        raise BadRequest("prompt", "prompt must be a non-empty string or a non-empty list of non-empty strings")
    for index, prompt in enumerate(prompts):
        where = None if isinstance(body.prompt, str) else index
        if len(prompt) > max_prompt_chars:
            raise BadRequest(
                "prompt",
                f"prompt{'' if where is None else f'[{where}]'} has {len(prompt)} characters, more than the server's "
                f"max_prompt_chars ({max_prompt_chars})",
            )
        _check_text("prompt", prompt, where)
    return prompts


def _stops(stop: str | list[str] | None) -> list[str]:
    stops = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > 4 or any(not s for s in stops):
        raise BadRequest("stop", "stop must be a non-empty string or a list of at most 4 non-empty strings")
    for index, text in enumerate(stops):
        _check_text("stop", text, index)
    return stops
