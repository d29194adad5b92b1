"""LoRA through peft (algorithms/common/model/lora.py): the options, the fast decoder with adapters, the reference as
the base model without a copy, adapter-only files, save/load/resume, and the exported adapter and merged folders."""

from __future__ import annotations

import copy
import json
import sys
import zipfile
from pathlib import Path

import pytest
import torch as th
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

import grpo_gym
from algorithms import GRPO
from algorithms.common.generation.completion_pass import completion_log_probs
from algorithms.common.generation.decoders import HFDecoder, LlamaDecoder, make_decoder
from algorithms.common.generation.sampler import sample
from algorithms.common.model.gradient_checkpointing import checkpoint_every
from algorithms.common.model.loading import load_model
from algorithms.common.model.lora import DEFAULTS, LORA_KEYS, apply_lora, lora_config
from algorithms.common.model.reference import reference_network
from grpo_gym.tokenizer import build_char_tokenizer
from tests.sizes import ENV_KWARGS, TINY, TINY_KWARGS

peft = pytest.importorskip("peft")

PAD, EOS = 0, 1
PROMPTS = ["2+3=", "Solve: 17*4", "hi", "<think>What is 9-2?</think><answer>", "x"]
LORA = {"r": 1, "alpha": 2}  # all linear layers, rank 1: about 2.4% of the test-size models' parameters
#: adapters that change the output from the start (peft's default B = 0 makes a new adapter a no-op)
ACTIVE = {"r": 4, "alpha": 8, "init_lora_weights": False}


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def qwen2_folder(tmp_path_factory, tokenizer) -> Path:
    """A tiny Qwen2 saved with the built-in tokenizer, as a user's checkpoint folder (the env can use it)."""
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=EOS,
        tie_word_embeddings=True,
    )  # fmt: skip
    th.manual_seed(0)
    folder = tmp_path_factory.mktemp("qwen2")
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_llama():
    return load_model("tiny", seed=0, **TINY_KWARGS).eval()


def batch(tokenizer, prompts=PROMPTS):
    encoded = tokenizer(prompts, padding=True, return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"]


def draw(model, ids, mask, seed=0, **kwargs):
    kwargs = {"max_new_tokens": 12, "eos_token_id": list(range(3, 12)), "pad_token_id": PAD, "vocab_size": 103,
              **kwargs}  # fmt: skip
    return sample(model, ids, mask, generator=th.Generator().manual_seed(seed), **kwargs)


# ---------------------------------------------------------------------------------------------- options
def test_lora_options_are_checked() -> None:
    config = lora_config({"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"], "use_rslora": True})
    assert (config.r, config.lora_alpha, config.use_rslora) == (8, 16, True)
    assert config.target_modules == {"q_proj", "v_proj"} and config.lora_dropout == 0.0
    default = lora_config({})
    assert (default.r, default.lora_alpha, default.target_modules) == (16, 32, "all-linear")
    with pytest.raises(ValueError, match=r"lora: unknown key 'rank'.*valid keys: r, alpha, target_modules, dropout"):
        lora_config({"rank": 8})
    with pytest.raises(ValueError, match=r"lora\['r'\]"):
        lora_config({"r": 0})
    with pytest.raises(ValueError, match=r"lora\['dropout'\].*never runs dropout"):
        lora_config({"dropout": 0.05})
    with pytest.raises(ValueError, match=r"lora\['target_modules'\]"):
        lora_config({"target_modules": 3})
    with pytest.raises(ValueError, match=r"lora\['init_lora_weights'\].*change the base weights"):
        lora_config({"init_lora_weights": "pissa"})
    with pytest.raises(ValueError, match="lora:"):
        apply_lora(tiny_llama(), {"target_modules": ["no_such_module"]})
    for rank in (512, 10**6):  # hostile round four: taken silently; failed in the allocator
        with pytest.raises(ValueError, match=rf"lora\['r'\]={rank} is larger than the model's hidden size"):
            apply_lora(tiny_llama(), {"r": rank})
    assert set(LORA_KEYS) >= {"r", "alpha", "dropout", "target_modules", "modules_to_save"}


def test_a_missing_peft_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft fails as when it is not installed
    with pytest.raises(ImportError, match=r"grpo-gym\[peft\]"):
        lora_config({"r": 2})


# ---------------------------------------------------------------------------------------------- the fast decoder
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_decoders_agree_with_adapters_and_the_ratio_is_one(kind: str, tokenizer, qwen2_folder: Path) -> None:
    """The fast decoder runs the effective weights W + s B A: the same tokens as the adapted model's own forward,
    sampled log-probs equal to the update's recomputed ones (ratio 1), and different from the base model's."""
    base = tiny_llama() if kind == "llama" else load_model(qwen2_folder).eval()
    plain = copy.deepcopy(base)
    model = apply_lora(base, ACTIVE, seed=0).eval()
    assert isinstance(make_decoder(model, 8), LlamaDecoder)
    ids, mask = batch(tokenizer, PROMPTS * 3)  # repeated prompts: shared prefill
    runs = [draw(model, ids, mask, decoder=d, compact_below=c) for d, c in [("hf", 0.0), ("llama", 0.75), ("llama", 1)]]
    assert runs[0].lengths.min() < 12 < runs[0].lengths.max() + 1
    for run in runs[1:]:
        assert th.equal(run.tokens, runs[0].tokens)
        th.testing.assert_close(run.log_probs, runs[0].log_probs, atol=1e-5, rtol=0)
    out = runs[1]
    with th.no_grad():
        recomputed, _ = completion_log_probs(model, ids, mask, out.tokens, out.mask, vocab_size=103)
    th.testing.assert_close(recomputed, out.log_probs, atol=1e-5, rtol=0)  # the importance ratio is exactly 1
    assert not th.equal(draw(plain, ids, mask).tokens, out.tokens)  # the adapters change what is sampled


def test_with_adapters_disabled_or_merged_the_decoder_runs_the_right_weights(tokenizer) -> None:
    plain = tiny_llama()
    model = apply_lora(copy.deepcopy(plain), ACTIVE, seed=0).eval()
    ids, mask = batch(tokenizer)
    base = draw(plain, ids, mask, decoder="llama")
    adapted = draw(model, ids, mask, decoder="llama")
    with model.disable_adapter():
        for decoder in ("llama", "hf"):
            off = draw(model, ids, mask, decoder=decoder)
            assert th.equal(off.tokens, base.tokens)
            th.testing.assert_close(off.log_probs, base.log_probs, atol=1e-6, rtol=0)
    model.merge_adapter()  # the deltas now live in the base weights: nothing is added twice
    merged = draw(model, ids, mask, decoder="llama")
    assert th.equal(merged.tokens, adapted.tokens)
    th.testing.assert_close(merged.log_probs, adapted.log_probs, atol=1e-5, rtol=0)


def test_dora_runs_through_the_models_own_forward(tokenizer) -> None:
    model = apply_lora(tiny_llama(), {**ACTIVE, "use_dora": True}, seed=0).eval()
    assert isinstance(make_decoder(model, 8), HFDecoder)  # a variant the fast decoder does not compute
    ids, mask = batch(tokenizer)
    out = draw(model, ids, mask)
    with th.no_grad():
        recomputed, _ = completion_log_probs(model, ids, mask, out.tokens, out.mask, vocab_size=103)
    th.testing.assert_close(recomputed, out.log_probs, atol=1e-5, rtol=0)


def test_gradient_checkpointing_finds_the_layers_inside_a_peft_model(tokenizer) -> None:
    ids, mask = batch(tokenizer)
    completion = th.randint(3, 103, (len(PROMPTS), 6), generator=th.Generator().manual_seed(0))
    done = th.ones_like(completion, dtype=th.bool)
    grads = []
    for every in (0, 1):
        model = apply_lora(load_model("tiny", seed=0, **{**TINY_KWARGS, "num_hidden_layers": 2}), ACTIVE, seed=0)
        if every:
            assert checkpoint_every(model.eval(), every) == 2
        log_probs, _ = completion_log_probs(model.eval(), ids, mask, completion, done)
        log_probs.sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys() and all("lora_" in name for name in grads[0])
    for name, grad in grads[0].items():
        th.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- training runs
def make_env(tokenizer: str | None = None) -> DummyVecEnv:
    return DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**ENV_KWARGS, tokenizer=tokenizer))])


def make_model(policy_kwargs: dict, tokenizer: str | None = None, **kwargs) -> GRPO:
    defaults = {
        "n_groups": 2,
        "group_size": 4,
        "cold_start_kwargs": {"steps": 2, "batch_size": 4},
        "seed": 0,
        "beta": 0.04,
        "learning_rate": 1e-2,
        "mixed_precision": "no",
    }
    return GRPO("TransformerPolicy", make_env(tokenizer), policy_kwargs=policy_kwargs, **{**defaults, **kwargs})


def trainable_fraction(model: GRPO) -> float:
    parameters = list(model.policy.parameters())
    return sum(p.numel() for p in parameters if p.requires_grad) / sum(p.numel() for p in parameters)


def modules_held(model: GRPO) -> list[th.nn.Module]:
    """Every network the algorithm object holds in its attributes (the policy; a reference copy if one was made)."""
    return [value for value in vars(model).values() if isinstance(value, th.nn.Module)]


def assert_same_training_state(a: GRPO, b: GRPO) -> None:
    for (name, p), (_, q) in zip(a.policy.named_parameters(), b.policy.named_parameters(), strict=True):
        assert th.equal(p, q) and p.requires_grad == q.requires_grad, name
    first, second = a.policy.optimizer.state_dict()["state"], b.policy.optimizer.state_dict()["state"]
    assert first.keys() == second.keys() and first
    for key in first:
        for name, value in first[key].items():
            assert th.equal(value, second[key][name]), (key, name)
    assert a.num_timesteps == b.num_timesteps and a._n_updates == b._n_updates


def moved_from_reference(model: GRPO) -> float:
    """The largest change of a log-prob of the last rollout between the reference and the policy."""
    batch = model._rollout
    with th.no_grad():
        args = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
        own, _ = model.policy.log_probs(*args)
    return float((own - model._reference_log_probs(batch)).abs().max())


SETUPS = {
    "built-in": lambda folder: ({**TINY, "lora": LORA}, None),
    "qwen2 folder": lambda folder: ({"model": str(folder), "lora": LORA}, str(folder)),
}


@pytest.fixture
def one_thread():
    """One torch thread for a bit-exact comparison of two runs. With 2 threads on a busy machine the CPU kernels of
    the backward are not bitwise reproducible (two fresh LoRA runs in one process already differ in the last bits,
    and AdamW turns a last-bit difference of a near-zero gradient into a full step; LoRA's gradients are such small
    sums, B starting at 0); with 1 thread they agree. Save and load themselves are exact either way."""
    threads = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(threads)


@pytest.mark.parametrize("setup", SETUPS)
def test_lora_run_saves_loads_and_resumes_exactly(setup: str, qwen2_folder: Path, tmp_path: Path, one_thread) -> None:
    """A LoRA run: few trainable parameters, the reference is the base model without a copy, and
    ``learn(2n)`` == ``learn(n); save; load; learn(n)`` bit for bit (adapter weights and their AdamW state)."""
    policy_kwargs, tokenizer = SETUPS[setup](qwen2_folder)
    whole = make_model(policy_kwargs, tokenizer)
    assert trainable_fraction(whole) < 0.05
    assert whole.ref_model is None and modules_held(whole) == [whole.policy]  # no reference copy
    with reference_network(whole.policy, whole.ref_model) as reference:
        assert reference is whole.policy.model  # the same network, adapters disabled
    optimized = {id(p) for group in whole.policy.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in whole.policy.parameters() if p.requires_grad}
    whole.learn(16)
    assert moved_from_reference(whole) > 1e-4  # the trained adapters moved the policy away from the base model
    first = make_model(policy_kwargs, tokenizer)
    first.learn(8)
    first.save(tmp_path / "half.zip")
    second = GRPO.load(tmp_path / "half.zip", env=make_env(tokenizer))
    assert second.ref_model is None and second.policy.frozen_parameters == first.policy.frozen_parameters
    assert_same_training_state(first, second)  # frozen layers frozen, the same weights and optimizer state
    second.learn(8, reset_num_timesteps=False)
    assert_same_training_state(whole, second)
    with zipfile.ZipFile(tmp_path / "half.zip") as archive:
        arguments = json.loads(archive.read("data"))["arguments"]["policy_kwargs"]
    assert arguments["lora"] == {**DEFAULTS, **LORA} and arguments["model"] == policy_kwargs["model"]


def test_a_folder_base_is_saved_as_adapters_only(qwen2_folder: Path, tmp_path: Path) -> None:
    """The base read from a folder stays out of the zip (read from the folder at load); a built-in is saved whole."""
    entries = {}
    for name, (policy_kwargs, tokenizer) in {n: setup(qwen2_folder) for n, setup in SETUPS.items()}.items():
        model = make_model(policy_kwargs, tokenizer, cold_start=False)
        model.save(tmp_path / "m.zip")
        with zipfile.ZipFile(tmp_path / "m.zip") as archive:
            state = th.load(archive.open("policy.pth"), weights_only=True)
        entries[name] = state.keys()
        assert model.policy.saves_adapters_only == (name == "qwen2 folder")
    assert entries["qwen2 folder"] and all("lora_" in key for key in entries["qwen2 folder"])
    whole = entries["built-in"]
    assert any("base_layer" in key for key in whole) and any("lora_" in key for key in whole)


def test_the_reference_is_the_base_model(tmp_path: Path) -> None:
    """The KL term's reference log-probs are the base model's (a fresh built-in of the same seed), and
    ``protected_rollouts`` samples from it too, while the policy's adapters change its own log-probs."""
    model = make_model(
        {**TINY, "lora": ACTIVE},
        cold_start=False,
        controls_kwargs={"protected_rollouts": 1},
    )
    base = load_model("tiny", seed=0, vocab_size=model.policy.vocab_size, **TINY_KWARGS).eval()
    model.learn(8)
    batch = model._rollout
    args = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    with th.no_grad():
        expected, _ = model.policy.log_probs(*args, model=base)
        adapted, _ = model.policy.log_probs(*args)
    th.testing.assert_close(model._reference_log_probs(batch), expected, atol=1e-5, rtol=0)
    th.testing.assert_close(batch.old_log_probs, expected, atol=1e-5, rtol=0)  # the protected rollout: the base's
    assert (adapted - expected).abs().max() > 1e-3


def test_a_ready_peft_model_is_accepted_and_saved_whole(tmp_path: Path) -> None:
    network = apply_lora(load_model("tiny", seed=0, **TINY_KWARGS), {"r": 2, "alpha": 4, "target_modules": ["q_proj"]})
    model = make_model({"model": network}, cold_start=False)
    assert model.policy.model is network and model.ref_model is None
    assert model.policy_kwargs["lora"] == {"r": 2, "alpha": 4, "target_modules": ["q_proj"], "dropout": 0.0}
    model.learn(8)
    model.save(tmp_path / "m.zip")
    loaded = GRPO.load(tmp_path / "m.zip", env=make_env())  # rebuilt from the recorded config and adapter layout
    assert_same_training_state(model, loaded)
    with pytest.raises(ValueError, match="PeftModel already"):
        make_model({"model": network, "lora": {"r": 8}})
    frozen = peft.PeftModel.from_pretrained(load_model("tiny", seed=0, **TINY_KWARGS), _adapter(tmp_path, network))
    with pytest.raises(ValueError, match="is_trainable=True"):
        make_model({"model": frozen})


def _adapter(tmp_path: Path, network) -> Path:
    network.save_pretrained(tmp_path / "adapter")
    return tmp_path / "adapter"


def test_exported_adapter_and_merged_folders(qwen2_folder: Path, tmp_path: Path) -> None:
    """``save_pretrained`` writes a peft adapter folder that PeftModel.from_pretrained reads back onto the base,
    ``merge=True`` a plain model folder; both give the policy's greedy output, and the policy keeps its adapters."""
    model = make_model({"model": str(qwen2_folder), "lora": ACTIVE}, str(qwen2_folder), cold_start=False)
    model.learn(8)
    model.save_pretrained(str(tmp_path / "adapter"))
    model.save_pretrained(str(tmp_path / "merged"), merge=True)
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert not (tmp_path / "adapter" / "config.json").exists() and (tmp_path / "merged" / "config.json").is_file()
    assert isinstance(model.policy.model, peft.PeftModel) and model.policy.model.peft_config
    ids, mask = batch(build_char_tokenizer())
    ours = model.policy.generate(ids, mask, greedy=True).tokens
    adapter = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(qwen2_folder), tmp_path / "adapter")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    plain = AutoModelForCausalLM.from_pretrained(qwen2_folder)
    for network in (adapter, merged):
        assert th.equal(model.policy.generate(ids, mask, greedy=True, model=network.eval()).tokens, ours)
    assert not th.equal(model.policy.generate(ids, mask, greedy=True, model=plain.eval()).tokens, ours)
    from algorithms.deploy.loading import load_policy

    served, tokenizer = load_policy(tmp_path / "adapter")  # what grpo-gym serve reads: base + adapters, merged
    assert len(tokenizer) == model.policy.vocab_size and not isinstance(served.model, peft.PeftModel)
    assert th.equal(served.generate(ids, mask, greedy=True, max_new_tokens=ours.shape[1]).tokens, ours)
