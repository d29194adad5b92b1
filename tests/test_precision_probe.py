"""The probe behind mixed_precision="auto" on a CPU with native bf16: its timings, its key, its cache file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from algorithms.common.runtime import precision_probe
from algorithms.common.runtime.precision_probe import STAGES, ProbeShape, cache_key, cached_figures, measure
from tests.sizes import TINY, TINY_KWARGS
from tests.test_grpo import make_model, parameters


@pytest.fixture
def counted(monkeypatch, tmp_path: Path) -> list[ProbeShape]:
    """A probe that returns fixed figures and counts its runs; empty caches, the file under ``tmp_path``."""
    calls: list[ProbeShape] = []

    def fake(policy, shape, repeats=precision_probe.REPEATS):
        calls.append(shape)
        return {stage: {"no": 0.2, "bf16": 0.1} for stage in STAGES}

    monkeypatch.setattr(precision_probe, "measure", fake)
    monkeypatch.setattr(precision_probe, "_MEMORY", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return calls


def shape_of(model) -> ProbeShape:
    return ProbeShape.of(model.policy, 8, prompts=2, sft_rows=4)


def test_the_probe_times_every_stage_and_leaves_no_trace():
    model = make_model(mixed_precision="no")
    shape = shape_of(model)
    assert shape == ProbeShape(rows=8, prompts=2, sft_rows=4, prompt_tokens=64, new_tokens=24)
    before, rng = parameters(model), torch.get_rng_state()
    figures = measure(model.policy, shape, repeats=2)
    assert set(figures) == set(STAGES)
    assert all(set(f) == {"no", "bf16"} and min(f.values()) > 0 for f in figures.values())
    assert torch.equal(rng, torch.get_rng_state())  # its own generator: the run's random draws are untouched
    assert all(p.grad is None for p in model.policy.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, parameters(model), strict=True))


def test_the_cache_is_kept_in_memory_and_in_a_file(counted, tmp_path: Path):
    model = make_model(mixed_precision="no")
    figures, cached = cached_figures(model.policy, shape_of(model))
    assert not cached and len(counted) == 1
    assert cached_figures(model.policy, shape_of(model)) == (figures, True) and len(counted) == 1  # in memory
    path = tmp_path / "grpo-gym" / "precision.json"
    entries = json.loads(path.read_text())["entries"]
    key, _ = cache_key(model.policy, shape_of(model))
    entry = entries[key]
    assert entry["figures"] == figures and entry["model"]["hidden_size"] == TINY_KWARGS["hidden_size"]
    assert entry["machine"]["threads"] == torch.get_num_threads()
    assert [p.name for p in path.parent.iterdir()] == ["precision.json"]  # no temporary file left
    precision_probe._MEMORY.clear()  # a new process reads the file
    assert cached_figures(model.policy, shape_of(model)) == (figures, True) and len(counted) == 1


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps([1, 2]),
        json.dumps({"version": 99, "entries": {}}),
        "KEY",  # the right key, figures of the wrong kind
    ],
)
def test_a_corrupt_cache_file_is_ignored(counted, tmp_path: Path, content: str):
    model = make_model(mixed_precision="no")
    key, _ = cache_key(model.policy, shape_of(model))
    if content == "KEY":
        content = json.dumps({"version": 1, "entries": {key: {"figures": {"sampling": "fast"}}}})
    path = tmp_path / "grpo-gym" / "precision.json"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    figures, cached = cached_figures(model.policy, shape_of(model))
    assert not cached and len(counted) == 1  # probed again ...
    assert json.loads(path.read_text())["entries"][key]["figures"] == figures  # ... and the file mended


def test_an_unwritable_cache_probes_again_in_the_next_process(counted, monkeypatch, tmp_path: Path):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # a file where the folder should be
    model = make_model(mixed_precision="no")
    assert cached_figures(model.policy, shape_of(model))[1] is False
    precision_probe._MEMORY.clear()
    assert cached_figures(model.policy, shape_of(model))[1] is False and len(counted) == 2


def test_the_key_follows_the_model_shape_and_the_machine(monkeypatch):
    model = make_model(mixed_precision="no")
    key, parts = cache_key(model.policy, shape_of(model))
    assert cache_key(make_model(mixed_precision="no", seed=5).policy, shape_of(model))[0] == key  # other weights
    wider = make_model(mixed_precision="no", policy_kwargs={**TINY, "model_kwargs": {**TINY_KWARGS, "hidden_size": 64}})
    assert cache_key(wider.policy, shape_of(wider))[0] != key
    assert cache_key(model.policy, ProbeShape.of(model.policy, 16, prompts=2, sft_rows=4))[0] != key
    monkeypatch.setattr(precision_probe, "cpu_info", lambda: ("Another CPU", ["avx512_bf16", "amx_bf16"]))
    assert cache_key(model.policy, shape_of(model))[0] != key
    assert parts["model"]["architectures"] == ["LlamaForCausalLM"] and parts["model"]["dtype"] == "torch.float32"
