"""An OpenAI-compatible completion server with dynamic batching: FastAPI + uvicorn.

``POST /v1/completions`` takes ``prompt`` (a string or a list of them), ``max_tokens`` (16), ``temperature`` (1;
0 is greedy), ``top_p`` (1), ``n`` (1) and ``stop`` (up to 4 strings) and answers an OpenAI ``text_completion``;
``GET /health`` and ``GET /v1/models`` say what is served. Prompts are tokenized as given (no template is added:
send the prompt the model was trained on). Generation goes through :meth:`TransformerPolicy.generate`, the sampler
and decoders of training rollouts, in batches formed by :class:`~algorithms.deploy.batching.DynamicBatcher`.

Errors are JSON in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400 naming the field of a
bad request (the body's size, encoding, JSON and fields are checked before any work, see
:mod:`algorithms.deploy.requests`; a prompt longer than ``max_prompt_chars`` is refused before it is tokenized, and
prompts are tokenized off the event loop, so ``/health`` keeps answering), 413 for a body past ``max_body_bytes``,
400 for a request with more completions than the queue can ever hold, 503 with ``Retry-After`` when the queue is
full. ``temperature`` or ``top_p`` below ``1e-5`` decode greedily (as vLLM does: their samples are the argmax
anyway, and float32 cannot scale logits by less). A model with NaN or infinite weights is refused when the app is
made. A client that disconnects while waiting frees its place in the queue; one that leaves (while its body is read
or while it waits) leaves nothing in the log. On SIGTERM uvicorn stops accepting connections, the requests already
received finish, then the process exits. Stop strings are applied to the decoded text after generation (the sampler
stops rows at EOS only). Greedy answers do not depend on batching (a row's tokens
depend on its own prompt only); sampled ones are drawn from the server's generator and are not reproducible request
by request.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import torch as th
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from algorithms.common.model.loading import check_finite_weights
from algorithms.common.policies import TransformerPolicy
from algorithms.common.rollout.batch import left_pad
from algorithms.deploy.batching import DynamicBatcher, Job, QueueFull
from algorithms.deploy.requests import BadRequest, CompletionRequest, parse_request, read_body, validation_message
from grpo_gym.validation import check_choice, check_float, check_int


@dataclass(frozen=True)
class ServerSettings:
    """The server's limits (``grpo-gym serve`` flags of the same names).

    :param max_wait_ms: the longest a request waits for others before its batch runs
    :param max_batch_tokens: the most padded tokens in a batch: rows x (longest prompt + largest max_tokens)
    :param max_batch_size: the most completions in a batch
    :param max_queue: the most completions waiting; beyond, requests get 503 + Retry-After
    :param bucket_width: prompt-length bucket width, in tokens
    :param max_tokens_limit: the largest ``max_tokens`` a request may ask for
    :param seed: seeds the sampler's generator
    :param max_prompt_chars: the most characters of one prompt, checked before tokenizing (``None``: 64 per token
        of the model's window, e.g. 131,072 for a 2048-token window)
    :param max_body_bytes: the largest request body (8 MiB); a longer one gets 413 and is not read further
    """

    max_wait_ms: float = 5.0
    max_batch_tokens: int = 8192
    max_batch_size: int = 64
    max_queue: int = 512
    bucket_width: int = 16
    max_tokens_limit: int = 256
    seed: int = 0
    max_prompt_chars: int | None = None
    max_body_bytes: int = 8 * 2**20

    def __post_init__(self) -> None:
        check_float("max_wait_ms", self.max_wait_ms, low=0.0)
        for name in ("max_batch_tokens", "max_batch_size", "max_queue", "bucket_width", "max_tokens_limit"):
            check_int(name, getattr(self, name), low=1)
        check_int("max_body_bytes", self.max_body_bytes, low=1)
        check_int("max_prompt_chars", self.max_prompt_chars, low=1, allow_none=True)
        check_int("seed", self.seed, low=0)

    def prompt_chars(self, policy: TransformerPolicy) -> int:
        """``max_prompt_chars``, or its default for ``policy``: 64 characters per token of its window."""
        return self.max_prompt_chars or CHARS_PER_TOKEN * policy.memory_length


CHARS_PER_TOKEN = 64
"""The default ``max_prompt_chars`` is this many characters per token of the model's window."""


def error_body(message: str, param: str | None, kind: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


class CompletionRunner:
    """Runs a batch of jobs through the policy (in the batcher's worker thread) and turns tokens into text."""

    def __init__(self, policy: TransformerPolicy, tokenizer: Any, seed: int = 0) -> None:
        from grpo_gym.tokenizer import TokenCodec

        self.policy, self.codec = policy, TokenCodec(tokenizer)
        self.generator = th.Generator(device=policy.device).manual_seed(seed)

    def encode(self, text: str) -> list[int]:
        """The prompt's token ids (no special tokens added)."""
        return self.codec.encode(text).tolist()

    def decode(self, tokens: list[int]) -> str:
        """The text of ``tokens``, special tokens skipped."""
        return self.codec.decode(tokens)

    def __call__(self, jobs: list[Job]) -> list[list[tuple[list[int], str, bool]]]:
        """``jobs`` sharing sampling settings -> per job, per completion: ``(tokens, text, ended_by_eos)``."""
        greedy, temperature, top_p = jobs[0].sampling
        prompts = [th.as_tensor(job.prompt, dtype=th.long) for job in jobs for _ in range(job.n)]
        ids, mask = left_pad(prompts, self.policy.pad_token_id)
        budget = max(job.max_tokens for job in jobs)
        out = self.policy.generate(
            ids.to(self.policy.device),
            mask.to(self.policy.device),
            generator=self.generator,
            greedy=greedy,
            max_new_tokens=budget,
            temperature=temperature,
            top_p=top_p,
        )
        tokens, lengths = out.tokens.cpu().tolist(), out.lengths.cpu().tolist()
        results, row = [], 0
        for job in jobs:
            rows = []
            for _ in range(job.n):
                kept = tokens[row][: min(lengths[row], job.max_tokens)]
                ended = bool(kept) and kept[-1] == self.policy.eos_token_id
                kept = kept[:-1] if ended else kept
                rows.append((kept, self.decode(kept), ended))
                row += 1
            results.append(rows)
        return results

    def cut_at_stop(self, tokens: list[int], text: str, stop: list[str]) -> tuple[str, int, bool]:
        """``(text, tokens used, stopped)``: the completion cut before the first stop string."""
        cuts = [text.find(s) for s in stop if s in text]
        if not cuts:
            return text, len(tokens), False
        cut = min(cuts)
        used = next((k for k in range(1, len(tokens) + 1) if len(self.decode(tokens[:k])) > cut), len(tokens))
        return text[:cut], used, True


def make_jobs(
    raw: bytes, policy: TransformerPolicy, runner: CompletionRunner, settings: ServerSettings
) -> tuple[CompletionRequest, list[Job]]:
    """The parsed body and one :class:`Job` per prompt of a raw request body (see :mod:`algorithms.deploy.requests`);
    :class:`BadRequest` names a bad field. Everything is checked before the first prompt is tokenized."""
    body, prompts, _ = parse_request(raw, settings.prompt_chars(policy))
    if body.max_tokens > settings.max_tokens_limit:
        raise BadRequest("max_tokens", f"max_tokens must be <= {settings.max_tokens_limit}, got {body.max_tokens}")
    if len(prompts) * body.n > settings.max_queue:
        raise BadRequest(
            "n" if len(prompts) == 1 else "prompt",
            f"the request asks for {len(prompts) * body.n} completions ({len(prompts)} prompts x n={body.n}), more "
            f"than the server's queue can ever hold ({settings.max_queue}); split it into smaller requests",
        )
    jobs = []
    for prompt in prompts:
        ids = runner.encode(prompt)
        if len(ids) + body.max_tokens > policy.memory_length:
            raise BadRequest(
                "prompt",
                f"the prompt's {len(ids)} tokens + max_tokens ({body.max_tokens}) exceed the model's "
                f"{policy.memory_length}-token window",
            )
        jobs.append(Job(ids, body.n, body.max_tokens, body.temperature, body.top_p))
    return body, jobs


def create_app(
    policy: TransformerPolicy, tokenizer: Any, model_name: str, settings: ServerSettings | None = None
) -> FastAPI:
    """The FastAPI app serving ``policy`` with ``tokenizer`` under ``model_name`` (see the module docstring)."""
    settings = settings or ServerSettings()
    check_finite_weights(policy, f"the model {model_name!r}")
    policy.set_training_mode(False)
    runner = CompletionRunner(policy, tokenizer, settings.seed)
    tokenizing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")  # off the event loop
    batcher = DynamicBatcher(
        runner,
        settings.max_wait_ms,
        settings.max_batch_tokens,
        settings.max_batch_size,
        settings.max_queue,
        settings.bucket_width,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        yield
        await batcher.drain()  # uvicorn has let the received requests finish; nothing is left but to stop
        tokenizing.shutdown(wait=True)

    app = FastAPI(title="grpo-gym", lifespan=lifespan)
    app.state.batcher, app.state.runner, app.state.settings = batcher, runner, settings

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        message, param = validation_message(error)
        return JSONResponse(error_body(message, param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def not_served(request: Request, error: StarletteHTTPException) -> JSONResponse:  # 404, 405: OpenAI's shape
        served = "POST /v1/completions, GET /health, GET /v1/models"
        message = f"{request.method} {request.url.path}: {error.detail} (served: {served})"
        return JSONResponse(error_body(message, None), status_code=error.status_code, headers=error.headers)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        running = sum(job.n for job in batcher.running)
        return {"status": "ok", "model": model_name, "queued": batcher.queued_rows, "running": running}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "grpo-gym"}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        try:
            raw = await read_body(request, settings.max_body_bytes)
            loop = asyncio.get_running_loop()
            body, jobs = await loop.run_in_executor(tokenizing, make_jobs, raw, policy, runner, settings)
            for job in jobs:
                batcher.check(job)
        except ClientDisconnect:  # the client left before its body was read: nobody to answer, nothing to log
            return JSONResponse(error_body("client disconnected", None), status_code=499)
        except BadRequest as error:
            return JSONResponse(error_body(str(error), error.param), status_code=error.status)
        except ValueError as error:  # the batcher's limits: the message starts with the field
            return JSONResponse(error_body(str(error), str(error).split(":")[0]), status_code=400)
        try:
            futures = [batcher.submit(job) for job in jobs]
        except QueueFull as full:
            for job in jobs:
                batcher.cancel(job)
            headers = {"Retry-After": str(full.retry_after)}
            return JSONResponse(error_body(str(full), None, "server_busy"), status_code=503, headers=headers)
        results = await _wait_or_disconnect(request, futures, jobs, batcher)
        if results is None:  # the client left; nobody reads this
            return JSONResponse(error_body("client disconnected", None), status_code=499)
        return JSONResponse(_response(body, jobs, results, runner, model_name))

    return app


async def _wait_or_disconnect(request: Any, futures: list[asyncio.Future], jobs: list[Job], batcher) -> Any:
    """The jobs' results, or None when the client disconnects first (its jobs are then cancelled)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    results = asyncio.gather(*futures)
    watcher = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({results, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server gave up on this request (the drain timeout ran out)
        done = set()
        raise
    finally:
        if results not in done:
            for job in jobs:
                batcher.cancel(job)
            results.cancel()
            results.add_done_callback(_retrieved)  # else asyncio logs "exception was never retrieved", 3 lines a client
        watcher.cancel()
    return results.result() if results in done else None


def _retrieved(future: asyncio.Future) -> None:
    """Read a cancelled gathering's outcome, so that nothing is logged for a client that left."""
    if not future.cancelled():
        future.exception()


def _response(body: Any, jobs: list[Job], results: list[Any], runner: CompletionRunner, model_name: str) -> dict:
    stops = [] if body.stop is None else [body.stop] if isinstance(body.stop, str) else list(body.stop)
    choices, completion_tokens = [], 0
    for rows in results:
        for tokens, full_text, ended in rows:
            text, used, stopped = runner.cut_at_stop(tokens, full_text, stops)
            completion_tokens += used
            reason = "stop" if ended or stopped else "length"
            choices.append({"text": text, "index": len(choices), "logprobs": None, "finish_reason": reason})
    prompt_tokens = sum(len(job.prompt) for job in jobs)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def serve(
    path: str | os.PathLike,
    host: str = "127.0.0.1",
    port: int = 8000,
    settings: ServerSettings | None = None,
    tokenizer: Any = None,
    device: str = "cpu",
    drain_timeout: float | None = 30.0,
    log_level: str = "info",
    trust_remote_code: bool = False,
) -> None:
    """Load a saved model (GRPO zip, ``save_pretrained`` folder or INT8 export) and serve it until SIGTERM/SIGINT.

    :param path: the model
    :param host: the address to listen on
    :param port: the port
    :param settings: the batching limits
    :param tokenizer: a tokenizer folder for a zip trained with a non-built-in tokenizer
    :param device: where the model runs
    :param drain_timeout: seconds to let received requests finish after SIGTERM (None: no limit)
    :param log_level: uvicorn's log level
    :param trust_remote_code: run the model folder's own code (``"auto_map"``, see :mod:`grpo_gym.hub`); refused by
        default, and never from the command line
    """
    import uvicorn

    from algorithms.deploy.loading import load_policy

    settings = settings or ServerSettings()
    check_int("port", port, low=0, high=65535, hint="a TCP port (0: any free one)")
    check_float("drain_timeout", drain_timeout, low=0.0, allow_none=True)
    check_choice("log_level", log_level, tuple(uvicorn.config.LOG_LEVELS))
    policy, tok = load_policy(path, tokenizer, device, settings.max_tokens_limit, trust_remote_code=trust_remote_code)
    app = create_app(policy, tok, os.path.basename(os.fspath(path).rstrip("/")), settings)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=drain_timeout)
    uvicorn.Server(config).run()
