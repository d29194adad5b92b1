"""The ``"vllm"`` engine, served: a client of a vLLM OpenAI server on a host:port, and the launcher of one.

**Sampling.** One ``/v1/completions`` request per prompt, sent concurrently, with the prompt as token ids, a seed
drawn from the caller's generator, ``logprobs=0`` and ``return_token_ids``: token ids in, token ids and their
log-probs out (no tokenizer on either side). Every sampling field is given, so no server default applies.

**Weights.** After each update the trainer writes the converted weights (:mod:`.vllm_folder`) as
``<sync folder>/v<N>/model.safetensors`` and asks the server to read them through vLLM's developer endpoints:
``POST /collective_rpc`` with the worker's ``reload_weights(weights_path=...)``, then ``POST /reset_prefix_cache``.
With ``lora="adapters"`` the adapters go to ``<sync folder>/v<N>`` and ``POST /v1/load_lora_adapter`` registers them
under a new name, which the next requests ask for. The server and the trainer must share the sync folder's file
system (the same machine, or a shared mount). The server needs ``VLLM_SERVER_DEV_MODE=1`` (and, for adapters,
``--enable-lora`` with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``): ``grpo-gym vllm-serve`` and
:func:`~.vllm_launcher.start_vllm_server` set them.

**Log-probs.** Exact (the sampler's definition) when the server loaded a folder this project wrote
(``grpo-gym vllm-serve`` does; the client reads its marker file). A server started on a user's own folder reports
the softmax of its raw logits: the client accepts it only at temperature 1 with no vocabulary to cut.

**Faults.** Every request has a timeout: a server that is down, dies mid-rollout, refuses new weights or cannot load
the model raises :class:`~.base.EngineError` naming the fix; nothing waits forever.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from torch import nn

from algorithms.common.generation.engines.base import EngineError, SamplingSettings, Weights
from algorithms.common.generation.engines.vllm_engine import VLLMEngine
from algorithms.common.generation.engines.vllm_folder import WeightFormat, adapter_weights, read_marker, write_weights

START_HINT = (
    "start one with `grpo-gym vllm-serve <model zip or folder> --port <port>`, or fix the "
    "address (rollout_engine_kwargs server_base_url, or server_host and server_port)"
)
SAME_MODEL = "the server must run this run's model (architecture and sizes): start it with `grpo-gym vllm-serve`"
#: the config fields that must agree between the server's folder and the trainer's model
SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size")


def _post(url: str, payload: dict[str, Any] | None, timeout: float) -> Any:
    """POST ``payload`` as JSON (GET when None); the decoded JSON answer (None for an empty one)."""
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read()
    try:
        return json.loads(body) if body.strip() else None
    except ValueError:  # some endpoints answer plain text ("Success: ...")
        return body.decode(errors="replace")


def _http_error(error: urllib.error.HTTPError) -> str:
    try:
        return error.read().decode(errors="replace")[:500]
    except Exception:
        return str(error)


def _raise_unreachable(base_url: str, error: Exception, what: str) -> None:
    if isinstance(error, urllib.error.HTTPError) or not isinstance(error, (OSError, http.client.HTTPException)):
        return  # the caller reports the server's own answer; anything else is raised as it is
    if isinstance(error, TimeoutError) or "timed out" in str(error):
        raise EngineError(
            f"the vLLM server at {base_url} did not answer {what} in time ({error}): check that it "
            "runs and is not overloaded, or raise rollout_engine_kwargs['request_timeout']"
        ) from error
    raise EngineError(
        f"no vLLM server answers at {base_url} ({what}: {error}): {START_HINT}; the run's last "
        "checkpoint is intact, resume from it once the server runs"
    ) from error


def _raise_engine_failed(base_url: str, error: urllib.error.HTTPError, what: str, hint: str = "") -> None:
    """A 5xx answer: the server's engine failed, or died (vLLM answers 500 while a stopped server shuts down)."""
    if error.code >= 500:
        raise EngineError(
            f"the vLLM server at {base_url} failed {what}: {_http_error(error)}{hint}; its engine stopped or failed "
            f"(the server's log says why): {START_HINT}; the run's last checkpoint is intact, resume from it once "
            "the server runs"
        ) from error


def wait_for_server(base_url: str, timeout: float) -> dict[str, Any]:
    """Wait up to ``timeout`` seconds for the server at ``base_url`` to answer ``/health`` (it may be starting), then
    return the model it serves (``/v1/models``' first entry); an :class:`~.base.EngineError` naming the fix."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _post(f"{base_url}/health", None, max(1.0, min(10.0, timeout)))
            return _post(f"{base_url}/v1/models", None, max(1.0, min(30.0, timeout)))["data"][0]
        except Exception as error:
            retry = isinstance(error, (ConnectionError, urllib.error.URLError)) and not isinstance(
                error, urllib.error.HTTPError
            )
            if retry and time.monotonic() + 1.0 < deadline:
                time.sleep(1.0)
                continue
            if isinstance(error, (urllib.error.HTTPError, KeyError, IndexError, TypeError)):
                raise EngineError(f"the vLLM server at {base_url} is not healthy: {error}; {START_HINT}") from error
            waited = f"the health check, waited {timeout:.0f} s (rollout_engine_kwargs['server_timeout'])"
            _raise_unreachable(base_url, error, waited)
            raise


def check_same_shapes(root: str, config: dict[str, Any], base_url: str) -> None:
    """An :class:`~.base.EngineError` when the server's folder ``root`` (readable here) holds another architecture
    or other sizes than the trainer's model (``config``, in the folder's form): its pushes would fail."""
    try:
        served = json.loads((Path(root) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # not a folder this process can read: the first push tells
    fields = (*SHAPE_FIELDS, "vocab_size")
    differ = [f"{k} {served.get(k)} (this run: {config.get(k)})" for k in fields if served.get(k) != config.get(k)]
    if differ:
        raise EngineError(f"the vLLM server at {base_url} runs another model: {', '.join(differ)}; {SAME_MODEL}")


class VLLMServerEngine(VLLMEngine):
    """Samples with a vLLM OpenAI server; see the module doc. :meth:`close` removes the temporary sync folder; the
    server keeps running (it is not this object's).

    :param base_url: the server, e.g. ``"http://127.0.0.1:8000"``
    :param model: the trainer's model (for the weight format; a peft model with ``lora="adapters"``)
    :param settings: how it samples
    :param sync_folder: where new weights are written for the server to read (None: a temporary folder); the server
        must see it at the same path
    :param lora: a peft model's weights as ``"merged"`` weights or as ``"adapters"`` (LoRA requests)
    :param request_timeout: seconds one request (a completion, a weight push) may take
    :param connect_timeout: seconds to wait for the server to answer ``/health`` (it may still be starting)
    :param max_workers: concurrent requests
    :param push_on_connect: push ``model``'s weights at once, so the first rollout samples with them whatever the
        server loaded (with ``lora="adapters"``: its base weights, then its adapters)
    :param max_model_len: the most tokens of a prompt and its completion the run needs (the server's must reach it)
    """

    def __init__(
        self,
        base_url: str,
        model: nn.Module,
        settings: SamplingSettings,
        sync_folder: str | os.PathLike | None = None,
        lora: str = "merged",
        request_timeout: float = 300.0,
        connect_timeout: float = 10.0,
        max_workers: int = 16,
        push_on_connect: bool = True,
        max_model_len: int | None = None,
    ) -> None:
        super().__init__(model, settings, lora, sync_folder, prefix="grpo-gym-sync-")
        self.base_url = base_url.rstrip("/")
        self.request_timeout, self.max_workers = float(request_timeout), int(max_workers)
        served = wait_for_server(self.base_url, connect_timeout)
        self._model_name = self._base_name = served["id"]
        self.max_model_len = served.get("max_model_len")
        if max_model_len is not None and self.max_model_len is not None and self.max_model_len < max_model_len:
            raise EngineError(
                f"the vLLM server at {self.base_url} takes {self.max_model_len} tokens per sequence, this run needs "
                f"{max_model_len} (the env's window and max_new_tokens): start it with --max-model-len "
                f"{max_model_len} or more, or lower the policy's memory_length"
            )
        self.format = self._server_format(served.get("root") or served["id"], model)
        if self.adapters:
            if push_on_connect:
                self._push_full(adapter_weights(model))
            self._push_adapters(model)
        elif push_on_connect:
            self.update_weights(model)

    def _server_format(self, root: str, model: nn.Module) -> WeightFormat:
        """The weight format of the server's folder (its marker), checked against ``settings``; a folder of the
        user's own takes the weights unchanged, at temperature 1 with nothing to cut."""
        wanted = WeightFormat.of(model, self.settings)
        found = read_marker(root) if os.path.isdir(root) else None
        if os.path.isdir(root):
            check_same_shapes(root, wanted.config(model), self.base_url)
        if found is not None:
            if (found.vocab_size, found.temperature) != (wanted.vocab_size, wanted.temperature):
                raise EngineError(
                    f"the vLLM server's folder {root} was written for temperature {found.temperature} and vocabulary "
                    f"{found.vocab_size}, this run samples at {wanted.temperature} with {wanted.vocab_size}: start the "
                    "server again on this run's model (grpo-gym vllm-serve <its zip> --temperature <T>)"
                )
            return found
        if wanted.temperature != 1.0 or wanted.vocab_size is not None:
            raise EngineError(
                f"the vLLM server at {self.base_url} runs a folder of its own ({root}); its log-probs are the "
                "sampler's only at temperature 1 with the model's whole vocabulary used (this run: temperature "
                f"{wanted.temperature}, vocabulary cut to {wanted.vocab_size}): start the server with "
                "grpo-gym vllm-serve, which writes a folder in this run's format"
            )
        return WeightFormat(None, 1.0, wanted.embed_name, wanted.head_name, wanted.tied)

    # ------------------------------------------------------------------------------------------------ sampling
    def _sample_rows(
        self, rows: list[list[int]], seeds: list[int], fields: dict[str, Any]
    ) -> tuple[list[list[int]], list[list[float]]]:
        """The requests sent concurrently (``max_workers``)."""
        common = {**fields, "logit_bias": {str(k): v for k, v in fields.get("logit_bias", {}).items()}}
        common.update(model=self._model_name, return_token_ids=True, return_tokens_as_token_ids=True)
        payloads = [{**common, "prompt": row, "seed": seed} for row, seed in zip(rows, seeds, strict=True)]
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(payloads))) as pool:
            answers = list(pool.map(self._complete, payloads))
        return [a[0] for a in answers], [a[1] for a in answers]

    def _complete(self, payload: dict[str, Any]) -> tuple[list[int], list[float]]:
        try:
            answer = _post(f"{self.base_url}/v1/completions", payload, self.request_timeout)
        except urllib.error.HTTPError as error:
            _raise_engine_failed(self.base_url, error, "a completion")
            raise EngineError(
                f"the vLLM server at {self.base_url} refused a completion: {_http_error(error)}"
            ) from error
        except Exception as error:
            _raise_unreachable(self.base_url, error, "a completion during the rollout")
            raise
        choice = answer["choices"][0]
        return list(choice["token_ids"]), [float(x) for x in choice["logprobs"]["token_logprobs"]]

    # ------------------------------------------------------------------------------------------------ weights
    def _rpc(self, path: str, payload: dict[str, Any] | None, what: str, fix: str, refused: str = "") -> Any:
        """POST to a developer endpoint; an :class:`EngineError` naming ``fix`` when the server lacks it, ``refused``
        when it answers with an error."""
        try:
            return _post(f"{self.base_url}{path}", payload if payload is not None else {}, self.request_timeout)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                raise EngineError(f"the vLLM server at {self.base_url} has no {path} ({what}): {fix}") from error
            hint = f"; {refused}" if refused else ""
            _raise_engine_failed(self.base_url, error, what, hint)
            raise EngineError(
                f"the vLLM server at {self.base_url} failed {what}: {_http_error(error)}{hint}"
            ) from error
        except Exception as error:
            _raise_unreachable(self.base_url, error, what)
            raise

    def _push_full(self, weights: Weights) -> None:
        """Write the weights to a new folder and have the server reload from it."""
        folder = write_weights(self._next_folder(), self.format.convert(weights))
        dev_mode = "start the server with VLLM_SERVER_DEV_MODE=1 (grpo-gym vllm-serve sets it)"
        kwargs = {"weights_path": str(folder), "is_checkpoint_format": True}
        payload = {"method": "reload_weights", "kwargs": kwargs}
        self._rpc("/collective_rpc", payload, "loading the new weights", dev_mode, SAME_MODEL)
        self._rpc("/reset_prefix_cache", None, "resetting its prefix cache", dev_mode)
        self._drop_previous()

    def _use_adapters(self, name: str, folder: Path) -> None:
        """Register the adapters under ``name`` and ask for it; the previous adapters unloaded."""
        previous = self._model_name
        fix = "start the server with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 (vllm-serve --max-lora-rank)"
        self._rpc("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)}, "loading the adapters", fix)
        self._model_name = name
        if previous != self._base_name:
            self._rpc("/v1/unload_lora_adapter", {"lora_name": previous}, "unloading the old adapters", fix)
