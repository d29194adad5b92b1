"""The engine seam (algorithms.common.generation.engines) without vLLM: the hf engine's log-probs are the update's,
weights pushed in are used, the vLLM folder's weight format gives the sampler's log-probs, and the served client's
faults (no server, a server that dies or hangs, one without the developer endpoints) are errors that name the fix,
within their timeouts. The real vLLM engines: tests/test_vllm_engine.py."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
import torch
from gymnasium import spaces

from algorithms import TransformerPolicy
from algorithms.common.generation.engines.base import (
    EngineError,
    SamplingSettings,
    completions_from_lists,
    merged_weights,
    padded_prompts,
    prompt_lists,
)
from algorithms.common.generation.engines.hf import HFGenerateEngine
from algorithms.common.generation.engines.vllm_folder import WeightFormat
from algorithms.common.generation.engines.vllm_server import VLLMServerEngine
from algorithms.common.generation.sampler import sample
from tests.engine_models import ENGINE_KWARGS, EOS, PAD, max_gap, prompts, settings, tiny_model

SAMPLINGS = [settings(), settings(temperature=0.7, top_p=0.8, top_k=20)]


def draw(engine, seed=0, max_new_tokens=10, **kwargs):
    ids, mask = prompts()
    generator = torch.Generator().manual_seed(seed)
    return engine.generate(ids, mask, max_new_tokens=max_new_tokens, generator=generator, **kwargs)


def test_an_engine_takes_lists_of_ids():
    model, (ids, mask) = tiny_model(), prompts()
    engine = HFGenerateEngine(model, settings())
    rows = prompt_lists(ids, mask)
    assert rows[0] == [5, 6, 7, 8] and rows[3] == [40, 41]
    from_lists = engine.generate(rows, max_new_tokens=6, generator=torch.Generator().manual_seed(1))
    assert torch.equal(from_lists.tokens, draw(engine, seed=1, max_new_tokens=6).tokens)
    assert torch.equal(padded_prompts(rows, None, PAD)[0], ids)


def test_policy_samples_on_its_engine():
    """The policy's hook: with an engine set, ``generate`` gives the engine's completions; without one, the
    sampler's."""
    obs = spaces.Dict({"input_ids": spaces.Box(0, 358, (16,), dtype="int64"),
                       "attention_mask": spaces.Box(0, 1, (16,), dtype="int64")})  # fmt: skip
    policy = TransformerPolicy(obs, spaces.MultiDiscrete([359] * 8), lambda _: 1e-3, model="tiny",
                               model_kwargs=ENGINE_KWARGS, seed=0, eos_token_id=EOS, pad_token_id=PAD)  # fmt: skip
    ids, mask = prompts()
    plain = policy.generate(ids, mask, generator=torch.Generator().manual_seed(0))
    direct = sample(policy.model, ids, mask, max_new_tokens=policy.max_new_tokens, eos_token_id=EOS,
                    pad_token_id=PAD, top_p=policy.top_p, vocab_size=policy.vocab_size,
                    generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert torch.equal(plain.tokens, direct.tokens) and torch.equal(plain.log_probs, direct.log_probs)
    engine = HFGenerateEngine(policy.model, SamplingSettings.of_policy(policy))
    policy.rollout_engine = engine
    engined = policy.generate(ids, mask, generator=torch.Generator().manual_seed(0))
    expected = draw(engine, max_new_tokens=policy.max_new_tokens)
    assert torch.equal(engined.tokens, expected.tokens) and torch.equal(engined.log_probs, expected.log_probs)


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_hf_engine_log_probs_are_the_updates(sampling):
    model = tiny_model(vocab_size=400)  # an embedding table larger than the tokenizer: ids >= 359 never drawn
    out = draw(HFGenerateEngine(model, sampling))
    ids, mask = prompts()
    assert max_gap(model, ids, mask, out, sampling) < 1e-5
    assert int(out.tokens[out.mask].max()) < 359 and not bool((out.tokens[out.mask] == PAD).any())
    again = draw(HFGenerateEngine(model, sampling))
    assert torch.equal(again.tokens, out.tokens)  # a seeded generator repeats


def assert_ends_at_eos(out, eos: int) -> None:
    """Each row's mask covers its tokens up to and including its first ``eos``, pad after it."""
    for row in range(out.tokens.shape[0]):
        found = (out.tokens[row] == eos).nonzero()
        if len(found):
            first = int(found[0])
            assert out.mask[row, : first + 1].all() and not out.mask[row, first + 1 :].any()
            assert (out.tokens[row, first + 1 :] == PAD).all() and int(out.lengths[row]) == first + 1


def test_hf_engine_stops_at_the_eos():
    """A token drawn in a first run becomes the EOS of a second one with the same seed: row 0 ends there."""
    model = tiny_model()
    first = draw(HFGenerateEngine(model, settings()), max_new_tokens=12)
    eos = int(first.tokens[0, 3])
    out = draw(HFGenerateEngine(model, SamplingSettings(eos, PAD, top_p=0.92, vocab_size=359)), max_new_tokens=12)
    assert int(out.lengths[0]) <= 4 and int(out.tokens[0, int(out.lengths[0]) - 1]) == eos
    assert_ends_at_eos(out, eos)


def test_update_weights_copies_another_models_weights():
    model, other = tiny_model(seed=0), tiny_model(seed=1)
    engine = HFGenerateEngine(model, settings())
    assert engine.update_weights(model) >= 0.0  # its own model: nothing to copy
    engine.update_weights(other.state_dict())
    ids, mask = prompts()
    assert max_gap(other, ids, mask, draw(engine), settings()) < 1e-5
    with pytest.raises(KeyError, match="no weight"):
        engine.update_weights({"not.a.weight": torch.zeros(1)})


@pytest.mark.parametrize("temperature, vocab", [(1.0, 359), (0.7, 359), (0.5, 300)])
def test_vllm_weight_format_gives_the_samplers_log_probs(temperature, vocab):
    """The folder's weights (vocabulary cut, temperature folded in): their raw log-softmax is the sampler's."""
    model = tiny_model(vocab_size=359)
    sampling = settings(temperature=temperature, vocab_size=vocab)
    fmt = WeightFormat.of(model, sampling)
    assert fmt.tied == (temperature == 1.0) and (fmt.vocab_size == (vocab if vocab < 359 else None))
    converted = fmt.convert(model)
    assert "lm_head.weight" in converted  # pushed even when tied: vLLM's in-place reload keeps a stale head otherwise
    served = tiny_model(vocab_size=fmt.vocab_size or 359, tie_word_embeddings=fmt.tied)
    served.load_state_dict(converted, strict=False)
    ids, mask = prompts()
    out = sample(model, ids, mask, max_new_tokens=10, eos_token_id=EOS, pad_token_id=PAD, temperature=temperature,
                 top_p=sampling.top_p, top_k=sampling.top_k, vocab_size=vocab,
                 generator=torch.Generator().manual_seed(0))  # fmt: skip
    raw = settings(temperature=1.0, vocab_size=None)
    ids, mask = prompts()
    from tests.engine_models import update_log_probs

    theirs, ours = update_log_probs(served, ids, mask, out, raw), update_log_probs(model, ids, mask, out, sampling)
    assert float((theirs - ours).abs().max()) < 1e-5


def test_merged_weights_of_a_lora_model():
    peft = pytest.importorskip("peft")
    model = tiny_model()
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    lora = peft.get_peft_model(model, config)
    merged = dict(merged_weights(lora))
    assert not any("lora_" in name or "base_layer" in name for name in merged)
    reference = tiny_model(seed=5)
    reference.load_state_dict(merged, strict=False)
    ids, mask = prompts()
    with torch.no_grad():
        ours, theirs = reference(ids, attention_mask=mask).logits, lora(ids, attention_mask=mask).logits
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_completions_from_lists_and_settings_checks():
    out = completions_from_lists([[3, 4, EOS], [5]], [[-1.0, -2.0, -3.0], [-0.5]], 4, PAD)
    assert out.tokens.tolist() == [[3, 4, EOS, PAD], [5, PAD, PAD, PAD]] and out.lengths.tolist() == [3, 1]
    assert out.log_probs[0, 2] == -3.0 and out.log_probs[1, 1] == 0.0
    with pytest.raises(ValueError, match="temperature"):
        SamplingSettings(EOS, PAD, temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingSettings(EOS, PAD, top_p=1.5)
    with pytest.raises(ValueError, match="attention_mask"):
        prompt_lists(torch.zeros((1, 2), dtype=torch.long), None)


# ------------------------------------------------------------------------------------ the served client's faults
class _FakeServer(BaseHTTPRequestHandler):
    """Answers the health check and the model list as vLLM does; ``behaviour`` decides the rest."""

    behaviour = "ok"
    served: ClassVar[dict] = {"id": "user-model", "root": "/nonexistent/user-model"}

    def log_message(self, *args):
        pass

    def _answer(self, code: int, body: dict | None = None) -> None:
        data = json.dumps(body or {}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._answer(200)
        elif self.path == "/v1/models":
            self._answer(200, {"data": [self.served]})
        else:
            self._answer(404)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.behaviour == "hang":
            time.sleep(3)
        if self.behaviour == "no-dev-mode" and self.path in ("/collective_rpc", "/reset_prefix_cache"):
            self._answer(404, {"detail": "Not Found"})
        elif self.path == "/v1/completions" and self.behaviour == "engine-dead":  # as vLLM answers once it has none
            self._answer(500, {"error": {"message": "EngineCore encountered an issue.", "code": 500}})
        elif self.path == "/v1/completions":
            self._answer(200, {"choices": [{"token_ids": [7, EOS], "logprobs": {"token_logprobs": [-1.5, -0.5]}}]})
        else:
            self._answer(200)


@pytest.fixture
def fake_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_served_client_reads_completions(fake_server):
    engine = VLLMServerEngine(_url(fake_server), tiny_model(), settings())
    out = draw(engine, max_new_tokens=3)
    assert out.tokens[0].tolist() == [7, EOS, PAD] and out.log_probs[0].tolist() == [-1.5, -0.5, 0.0]
    engine.close()


def test_served_client_faults_name_the_fix(fake_server, monkeypatch):
    model, url = tiny_model(), _url(fake_server)
    with pytest.raises(EngineError, match=r"no vLLM server answers at http://127\.0\.0\.1:9 "):
        VLLMServerEngine("http://127.0.0.1:9", model, settings(), connect_timeout=2)
    with pytest.raises(EngineError, match="log-probs are the sampler's only at temperature 1"):
        VLLMServerEngine(url, model, settings(temperature=0.7))
    monkeypatch.setattr(_FakeServer, "behaviour", "no-dev-mode")
    with pytest.raises(EngineError, match="VLLM_SERVER_DEV_MODE=1"):
        VLLMServerEngine(url, model, settings())
    monkeypatch.setattr(_FakeServer, "behaviour", "hang")
    engine = VLLMServerEngine(url, model, settings(), request_timeout=0.5, push_on_connect=False)
    with pytest.raises(EngineError, match="did not answer a completion during the rollout in time"):
        draw(engine, max_new_tokens=3)
    monkeypatch.setattr(_FakeServer, "behaviour", "engine-dead")
    with pytest.raises(EngineError, match=r"failed a completion.*engine stopped or failed.*vllm-serve.*checkpoint is"):
        draw(engine, max_new_tokens=3)
    monkeypatch.setattr(_FakeServer, "behaviour", "ok")
    fake_server.shutdown()
    fake_server.server_close()  # the server dies mid-run
    with pytest.raises(EngineError, match="checkpoint is intact"):
        draw(engine, max_new_tokens=3)


def test_served_client_refuses_a_server_that_does_not_fit_the_run(fake_server, monkeypatch, tmp_path):
    """A server whose sequences are shorter than the run's, or whose folder (readable here) holds other sizes: refused
    at connect, naming the fix, before any push fails."""
    from algorithms.common.generation.engines.vllm_folder import export_folder

    model, url = tiny_model(), _url(fake_server)
    monkeypatch.setattr(_FakeServer, "served", {"id": "m", "root": "/nonexistent", "max_model_len": 64})
    with pytest.raises(EngineError, match=r"takes 64 tokens per sequence, this run needs 280.*--max-model-len 280"):
        VLLMServerEngine(url, model, settings(), max_model_len=280)
    folder, _ = export_folder(tiny_model(intermediate_size=96), settings(), tmp_path / "other")
    monkeypatch.setattr(_FakeServer, "served", {"id": "m", "root": str(folder)})
    with pytest.raises(EngineError, match=r"runs another model: intermediate_size 96 \(this run: 128\).*vllm-serve"):
        VLLMServerEngine(url, model, settings())


def test_served_client_waits_for_a_server_that_is_starting():
    """vllm_server_timeout: a server that comes up within it is used (the trainer may start first)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    late: dict[str, ThreadingHTTPServer] = {}

    def start() -> None:
        late["server"] = ThreadingHTTPServer(("127.0.0.1", port), _FakeServer)
        late["server"].serve_forever()

    timer = threading.Timer(1.5, start)  # nothing listens for 1.5 s
    timer.daemon = True
    timer.start()
    try:
        begin = time.perf_counter()
        engine = VLLMServerEngine(f"http://127.0.0.1:{port}", tiny_model(), settings(), connect_timeout=30)
        assert 1.0 < time.perf_counter() - begin < 30
        engine.close()
    finally:
        if "server" in late:
            late["server"].shutdown()
            late["server"].server_close()
