"""The real vLLM engines on the CPU build (``bash .ci/install_vllm.sh``): colocated (``vllm.LLM`` in this process) and
served (a vLLM OpenAI server on 127.0.0.1, started once for the module). Their sampled-token log-probs equal the
update's forward pass (float32, ~1e-6), before and after a weight push, merged or as LoRA adapters; the two modes draw
the same tokens from the same seeds; startup faults name the fix. Skipped, with the reason in the report, where vLLM
cannot be imported."""

from __future__ import annotations

import dataclasses
import json
import socket

import pytest
import torch

from algorithms.common.generation.engines.base import EngineError
from algorithms.common.generation.engines.vllm_folder import export_folder
from tests.engine_models import PAD, VLLM_MISSING, max_gap, prompts, settings, tiny_model

pytestmark = pytest.mark.skipif(bool(VLLM_MISSING), reason=VLLM_MISSING)

KV_BYTES = 32 << 20
#: the built-in model's case (tied embeddings, temperature 1, nothing cut) and one where both transforms apply
PLAIN = settings()
FOLDED = settings(temperature=0.7, top_p=0.8, top_k=20)


def draw(engine, seed=0, max_new_tokens=10, **kwargs):
    ids, mask = prompts()
    generator = torch.Generator().manual_seed(seed)
    return engine.generate(ids, mask, max_new_tokens=max_new_tokens, generator=generator, **kwargs)


def lora_model(seed: int = 0, vocab_size: int = 359):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    return peft.get_peft_model(tiny_model(seed=seed, vocab_size=vocab_size), config).eval()


def nudge_adapters(model, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))


def colocated(model, sampling, **kwargs):
    from algorithms.common.generation.engines.vllm_colocate import VLLMColocateEngine

    return VLLMColocateEngine(model, sampling, kv_cache_memory_bytes=KV_BYTES, max_model_len=128, **kwargs)


# ---------------------------------------------------------------------------------------------------- colocated
@pytest.fixture(scope="class")
def plain_engine():
    with colocated(tiny_model(), PLAIN) as engine:
        yield engine


@pytest.fixture(scope="class")
def folded_engine():
    with colocated(tiny_model(vocab_size=400), FOLDED) as engine:
        yield engine


@pytest.fixture
def engine(request):
    """The class's engine (one ``vllm.LLM`` at a time in this process: each class's is closed after it)."""
    return request.getfixturevalue(request.cls.engine_fixture)


class TestColocatedPlain:
    """The built-in model's case: tied embeddings, temperature 1."""

    engine_fixture = "plain_engine"

    def test_log_probs_match_the_update_before_and_after_a_push(self, engine):
        ids, mask = prompts()
        out = draw(engine)
        assert out.lengths.tolist() == [10, 10, 10, 10]
        assert max_gap(tiny_model(), ids, mask, out, PLAIN) < 1e-5
        assert not torch.equal(out.tokens[0], out.tokens[2])  # the same prompt twice: two seeds, two completions
        assert torch.equal(draw(engine).tokens, out.tokens)  # the same generator: the same tokens
        other = tiny_model(seed=1)
        assert engine.update_weights(other) == engine.last_sync_seconds >= 0.0
        assert max_gap(other, ids, mask, draw(engine), PLAIN) < 1e-5

    def test_a_merged_lora_push_and_the_eos(self, engine):
        ids, mask = prompts()
        model = lora_model(seed=2)
        engine.update_weights(model)  # adapters merged into the weights
        first = draw(engine, max_new_tokens=12)
        assert max_gap(model, ids, mask, first, PLAIN) < 1e-5
        eos = int(first.tokens[0, 3])  # a token drawn at step 3 becomes the EOS: the same seed stops there
        engine.settings = dataclasses.replace(PLAIN, eos_token_id=eos)
        try:
            out = draw(engine, max_new_tokens=12)
        finally:
            engine.settings = PLAIN
        length = int(out.lengths[0])
        assert length <= 4 and int(out.tokens[0, length - 1]) == eos and (out.tokens[0, length:] == PAD).all()
        assert not out.mask[0, length:].any() and out.mask[0, :length].all()

    def test_lists_of_ids_and_greedy(self, engine):
        ids, mask = prompts()
        rows = [row[keep.bool()].tolist() for row, keep in zip(ids, mask, strict=True)]
        from_lists = engine.generate(rows, max_new_tokens=5, generator=torch.Generator().manual_seed(0))
        assert torch.equal(from_lists.tokens, draw(engine, max_new_tokens=5).tokens)
        greedy = draw(engine, max_new_tokens=5, greedy=True)
        assert torch.equal(greedy.tokens[0], greedy.tokens[2])  # the argmax of the same prompt
        with pytest.raises(EngineError, match=r"exceed the engine's max_model_len \(128\)"):
            engine.generate([[5] * 120], max_new_tokens=10)  # vLLM would cut the completion at 128 tokens


class TestColocatedFolded:
    """Temperature 0.7 and top-k folded into the weights; an embedding table larger than the tokenizer, cut."""

    engine_fixture = "folded_engine"

    def test_log_probs_match_the_update_before_and_after_a_push(self, engine):
        ids, mask = prompts()
        out = draw(engine)
        assert max_gap(tiny_model(vocab_size=400), ids, mask, out, FOLDED) < 1e-5
        assert int(out.tokens[out.mask].max()) < 359
        other = tiny_model(seed=3, vocab_size=400)
        engine.update_weights(other.state_dict())
        assert max_gap(other, ids, mask, draw(engine), FOLDED) < 1e-5


def test_colocated_lora_adapters_push():
    """lora="adapters": the base weights once, each push a new LoRA request; the log-probs follow the adapters."""
    ids, mask = prompts()
    model = lora_model(seed=4)
    with colocated(model, PLAIN, lora="adapters") as engine:
        assert engine.adapters
        assert max_gap(model, ids, mask, draw(engine), PLAIN) < 1e-5
        nudge_adapters(model)
        engine.update_weights(model)
        assert max_gap(model, ids, mask, draw(engine), PLAIN) < 1e-5
        with pytest.raises(EngineError, match="takes the peft model itself"):
            engine.update_weights(model.state_dict())


def test_colocated_startup_faults_name_the_fix():
    with pytest.raises(EngineError, match="head sizes"):
        colocated(tiny_model(hidden_size=32), PLAIN)  # 2 heads of 16: vLLM's CPU attention does not run it
    with pytest.raises(EngineError, match="kv_cache_memory_bytes"):
        from algorithms.common.generation.engines.vllm_colocate import VLLMColocateEngine

        VLLMColocateEngine(tiny_model(), PLAIN, kv_cache_memory_bytes=1024, max_model_len=128)


# ---------------------------------------------------------------------------------------------------- served
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One vLLM OpenAI server on 127.0.0.1 for the module (~35 s to start), on a folder for FOLDED's format, LoRA on."""
    from algorithms.common.generation.engines.vllm_launcher import start_vllm_server

    folder, _ = export_folder(tiny_model(vocab_size=400), FOLDED, tmp_path_factory.mktemp("served") / "model")
    log = tmp_path_factory.mktemp("logs") / "server.log"
    running = start_vllm_server(folder, port=free_port(), kv_cache_memory_bytes=KV_BYTES, max_model_len=128,
                                max_lora_rank=8, log_path=log, startup_timeout=240)  # fmt: skip
    yield running
    running.stop()


def test_served_log_probs_match_the_update_before_and_after_a_push(server):
    from algorithms.common.generation.engines.vllm_server import VLLMServerEngine

    ids, mask = prompts()
    model = tiny_model(seed=5, vocab_size=400)
    with VLLMServerEngine(server.base_url, model, FOLDED) as engine:  # pushes model's weights on connect
        out = draw(engine)
        assert max_gap(model, ids, mask, out, FOLDED) < 1e-5
        other = tiny_model(seed=6, vocab_size=400)
        assert engine.update_weights(other) > 0.0
        assert max_gap(other, ids, mask, draw(engine), FOLDED) < 1e-5
        served_tokens = draw(engine, seed=11).tokens
    with colocated(other, FOLDED) as local:  # the same weights and seeds, in process: the same tokens
        assert torch.equal(draw(local, seed=11).tokens, served_tokens)


def test_served_lora_adapters_push(server):
    from algorithms.common.generation.engines.vllm_server import VLLMServerEngine

    ids, mask = prompts()
    model = lora_model(seed=7, vocab_size=400)
    with VLLMServerEngine(server.base_url, model, FOLDED, lora="adapters") as engine:
        assert max_gap(model, ids, mask, draw(engine), FOLDED) < 1e-5
        nudge_adapters(model, seed=1)
        engine.update_weights(model)
        assert max_gap(model, ids, mask, draw(engine), FOLDED) < 1e-5


def test_served_faults_name_the_fix(server, tmp_path):
    from algorithms.common.generation.engines.vllm_launcher import start_vllm_server
    from algorithms.common.generation.engines.vllm_server import VLLMServerEngine

    with pytest.raises(EngineError, match=r"written for temperature 0\.7"):
        VLLMServerEngine(server.base_url, tiny_model(vocab_size=400), settings(temperature=0.9))
    folder, _ = export_folder(tiny_model(), PLAIN, tmp_path / "broken")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchModelForCausalLM"]}))
    with pytest.raises(EngineError, match="exited with code"):
        start_vllm_server(folder, port=free_port(), kv_cache_memory_bytes=KV_BYTES, startup_timeout=180,
                          log_path=tmp_path / "broken.log")  # fmt: skip
