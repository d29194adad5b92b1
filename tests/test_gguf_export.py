"""GGUF export (algorithms/common/saving/gguf_export.py): files written by ``save_gguf`` / ``GRPO.save_gguf`` /
``grpo-gym export`` read back by transformers and run by llama.cpp itself (``llama-cpp-python``: skipped with the
reason where it is not installed), greedy completions compared token for token; the source file's metadata written
back; the Ollama Modelfile's template against the chat template (rendered by jinja2, as transformers renders it); and
each bad input refused with nothing written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from stable_baselines3.common.vec_env import DummyVecEnv

import grpo_gym
from algorithms import GRPO
from algorithms.cli import main
from algorithms.common.saving.gguf_export import ExportInfo, export_types, modelfile_text, ollama_template, save_gguf
from tests.gguf_files import byte_level_tokenizer, tiny_llama, write_gguf
from tests.sizes import TINY_KWARGS

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tokenizer():
    return byte_level_tokenizer()


@pytest.fixture(scope="module")
def llama(tokenizer):
    """A tiny Llama whose greedy completions vary (weights drawn wider than the default initialisation)."""
    model = tiny_llama(len(tokenizer), seed=1)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "norm" not in name:
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.3)
    return model


def llama_cpp_model(path: Path) -> Any:
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp's Python bindings (the llama-cpp-python wheel)")
    return llama_cpp.Llama(model_path=str(path), n_ctx=512, n_threads=1, verbose=False)


def llama_cpp_greedy(llm: Any, prompt: list[int], budget: int) -> list[int]:
    out: list[int] = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(token))
        if token == llm.token_eos() or len(out) >= budget:
            return out
    return out


def hf_greedy(model: Any, prompt: list[int], budget: int, eos: int) -> list[int]:
    with torch.no_grad():
        ids = model.generate(torch.tensor([prompt]), max_new_tokens=budget, do_sample=False, eos_token_id=eos,
                             pad_token_id=eos)[0, len(prompt):].tolist()  # fmt: skip
    return ids[: ids.index(eos) + 1] if eos in ids else ids


PROMPTS = ["What is 3 + 4?", "Compute 12 * 7 - 5.", "<think>", "Solve: 81 / 9 + 2"]


@pytest.mark.parametrize("kind", ["f32", "f16"])
def test_llama_cpp_writes_our_greedy_completions_token_for_token(tmp_path, llama, tokenizer, kind):
    path = save_gguf(llama, tokenizer, tmp_path / f"tiny-{kind}.gguf", kind)
    llm = llama_cpp_model(path)
    reference = llama if kind == "f32" else tiny_half(llama)
    completions = []
    for text in PROMPTS:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               tokenize=False)  # fmt: skip
        ids = tokenizer(prompt)["input_ids"]
        assert llm.tokenize(prompt.encode(), add_bos=False, special=True) == ids  # its tokenizer reads as ours
        ours = hf_greedy(reference, ids, 24, tokenizer.eos_token_id)
        assert llama_cpp_greedy(llm, ids, 24) == ours, text
        completions.append(ours)
    llm.close()
    assert len({token for c in completions for token in c}) > 5  # not one token repeated: a real comparison


def tiny_half(model: Any) -> Any:
    """``model`` with its matrices rounded to float16 and back, as an f16 file holds them."""
    import copy

    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for tensor in rounded.parameters():
            if tensor.ndim == 2:
                tensor.copy_(tensor.half().float())
    return rounded


def test_the_file_reads_back_into_transformers_with_the_same_weights(tmp_path, llama, tokenizer):
    from grpo_gym.gguf import load_gguf_model, load_gguf_tokenizer

    path = save_gguf(llama, tokenizer, tmp_path / "tiny.gguf", "f32")
    back = load_gguf_model(path)
    for name, tensor in llama.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name  # the rotary permutation undone exactly
    again = load_gguf_tokenizer(path)
    assert again.get_vocab() == tokenizer.get_vocab() and again.chat_template == tokenizer.chat_template
    reader = gguf.GGUFReader(path)
    assert reader.fields["general.file_type"].contents() == gguf.LlamaFileType.ALL_F32
    assert "output.weight" not in {t.name for t in reader.tensors}  # tied to the embeddings, as llama.cpp reads it


def test_q8_0_and_bf16_files_hold_those_types_and_norms_stay_f32(tmp_path, llama, tokenizer):
    for kind in ("q8_0", "bf16"):
        reader = gguf.GGUFReader(save_gguf(llama, tokenizer, tmp_path / f"t-{kind}.gguf", kind, force=True))
        types = {t.name: t.tensor_type.name for t in reader.tensors}
        assert types["blk.0.attn_q.weight"] == kind.upper() and types["blk.0.attn_norm.weight"] == "F32"
    assert {"f32", "f16", "bf16", "q8_0", "q4_0"} <= set(export_types())
    assert not {"tq1_0", "q4_k"} & set(export_types())


def test_a_model_trained_from_a_gguf_file_writes_its_metadata_back(tmp_path, llama, tokenizer):
    source = write_gguf(llama, tokenizer, tmp_path / "source.gguf")
    env = DummyVecEnv([lambda: grpo_gym.R1ZeroEnv(tokenizer=source, max_new_tokens=8)])
    model = GRPO("TransformerPolicy", env, n_groups=2, group_size=2, policy_kwargs={"model": source}, cold_start=False)
    model.learn(4)
    path = model.save_gguf(str(tmp_path / "out.gguf"), type="f32")
    before, after = gguf.GGUFReader(source).fields, gguf.GGUFReader(path).fields
    for key, field in before.items():
        if key.startswith("tokenizer.") or key.startswith("llama."):
            assert after[key].contents() == field.contents(), key
    assert "GRPO with grpo-gym" in after["general.description"].contents()
    assert after["general.base_model.0.name"].contents() == "source.gguf"
    llm = llama_cpp_model(Path(path))  # the trained weights run in llama.cpp
    prompt = env.env_method("encode_example", "What is 2 + 2?", "", indices=[0])[0][0].tolist()
    completion = hf_greedy(model.policy.model, prompt, 8, tokenizer.eos_token_id)
    assert llama_cpp_greedy(llm, prompt, 8) == completion
    llm.close()


def test_the_built_in_tiny_model_exports_and_llama_cpp_reads_its_tokenizer(tmp_path):
    env = DummyVecEnv([lambda: grpo_gym.R1ZeroEnv(max_new_tokens=12)])
    tiny = {"model_kwargs": TINY_KWARGS}
    model = GRPO("TransformerPolicy", env, n_groups=2, group_size=2, policy_kwargs=tiny, cold_start=False, seed=0)
    path = model.save_gguf(str(tmp_path / "tiny.gguf"), type="f32")
    tokenizer = model.env.get_attr("tokenizer", [0])[0]
    llm = llama_cpp_model(Path(path))
    text = "User: What is 12 + 7? é\nAssistant: <think>"
    ids = tokenizer(text)["input_ids"]
    assert llm.tokenize(text.encode(), add_bos=False, special=False) == ids  # characters, bytes, the template tags
    assert llama_cpp_greedy(llm, ids, 12) == hf_greedy(model.policy.model, ids, 12, tokenizer.eos_token_id)
    llm.close()
    from grpo_gym.gguf import load_gguf_model
    from grpo_gym.tokenizer import gguf_tokenizer

    again = gguf_tokenizer(path)  # read back into grpo-gym: the built-in tokenizer itself
    assert again.get_vocab() == tokenizer.get_vocab() and again(text)["input_ids"] == ids
    back = load_gguf_model(path)
    assert all(torch.equal(back.state_dict()[k], v) for k, v in model.policy.model.state_dict().items())
    modelfile = (tmp_path / "Modelfile").read_text()
    assert "FROM ./tiny.gguf" in modelfile and "{{ .Prompt }}" in modelfile and 'PARAMETER stop "<eos>"' in modelfile


# ------------------------------------------------------------------------------------------------ the Modelfile
def render_go(template: str, messages: list[dict[str, str]]) -> str:
    """Ollama's template engine (Go's text/template) for what the export writes: text, ``{{ .Content }}``,
    ``{{ range .Messages }}``, ``{{ if/else if/else/end }}`` on ``eq .Role "x"`` and
    ``ne (index .Messages 0).Role "x"``, and ``{{ "literal" }}``."""
    tokens = re.split(r"(\{\{.*?\}\})", template)

    def condition(text: str, message: dict[str, str] | None) -> bool:
        found = re.fullmatch(r'(eq|ne) (\.Role|\(index \.Messages 0\)\.Role) "(\w+)"', text)
        assert found, text
        role = messages[0]["role"] if found[2].startswith("(index") else message["role"]
        return (role == found[3]) == (found[1] == "eq")

    def block(i: int, message: dict[str, str] | None, out: list[str], live: bool) -> int:
        """Render from tokens[i] to the end of the block (its ``end`` or ``else``); the index after it."""
        while i < len(tokens):
            token = tokens[i]
            action = token[2:-2].strip() if token.startswith("{{") else None
            if action is None:
                out.append(token if live else "")
            elif action in ("end",) or action.startswith("else"):
                return i
            elif action == ".Content":
                out.append(message["content"] if live else "")
            elif action.startswith('"'):
                out.append(action.strip('"') if live else "")
            elif action == "range .Messages":
                end = i
                for each in messages if live else [None]:
                    end = block(i + 1, each, out, live and each is not None)
                i = end
            elif action.startswith("if "):
                taken = live and condition(action[3:], message)
                i = block(i + 1, message, out, taken)
                done = taken
                while tokens[i][2:-2].strip().startswith("else"):
                    branch = tokens[i][2:-2].strip()
                    go = live and not done and (branch == "else" or condition(branch[8:], message))
                    i = block(i + 1, message, out, go)
                    done = done or go
            i += 1
        return i

    out: list[str] = []
    block(0, None, out, True)
    return "".join(out)


def smollm2_like_tokenizer(tokenizer: Any) -> Any:
    """The test tokenizer with SmolLM2-135M-Instruct's chat template: a default system message when there is none."""
    import copy

    smol = copy.deepcopy(tokenizer)
    smol.chat_template = (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    return smol


@pytest.mark.parametrize("smollm", [False, True])
def test_the_modelfile_template_renders_what_the_chat_template_renders(tokenizer, smollm):
    chat = smollm2_like_tokenizer(tokenizer) if smollm else tokenizer
    template = ollama_template(chat)
    conversations = [
        [{"role": "system", "content": "Answer in <answer> tags."}, {"role": "user", "content": "What is 2 + 3?"}],
        [{"role": "user", "content": "Hi {{ there }}"}, {"role": "assistant", "content": "Hello."}],
        [{"role": "user", "content": "What is 2 + 3?"}],
    ]
    for messages in conversations:
        expected = chat.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert render_go(template, messages) == expected
    text = modelfile_text("m.gguf", chat, ExportInfo(system="Think first.", sampling={"temperature": 0.7}))
    assert text.splitlines()[1:3] == ["FROM ./m.gguf", f'TEMPLATE """{template.splitlines()[0]}']
    assert 'SYSTEM """Think first."""' in text and 'PARAMETER stop "<|im_end|>"' in text
    assert "PARAMETER temperature 0.7" in text
    plain = modelfile_text("m.gguf", chat, ExportInfo(chat=False, prompt_affixes=("Q: ", "\nA: <think>")))
    assert 'TEMPLATE """Q: {{ .Prompt }}\nA: <think>"""' in plain and "im_start" not in plain  # as trained: no chat


def test_a_chat_template_of_another_shape_is_refused_by_name_before_anything_is_written(tmp_path, llama, tokenizer):
    import copy

    odd = copy.deepcopy(tokenizer)
    odd.chat_template = "{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'user' %}!{% endif %}{% endfor %}"
    with pytest.raises(ValueError, match="prefix \\+ content \\+ suffix"):
        ollama_template(odd)
    with pytest.raises(ValueError, match="prefix \\+ content \\+ suffix"):
        save_gguf(llama, odd, tmp_path / "odd.gguf")
    with pytest.raises(ValueError, match='system prompt holds """'):
        save_gguf(llama, tokenizer, tmp_path / "odd.gguf", info=ExportInfo(system='say """hi"""'))
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------ bad input
def test_bad_inputs_are_refused_and_leave_nothing_written(tmp_path, llama, tokenizer, monkeypatch):
    with pytest.raises(ValueError, match="choose one of f32, f16, bf16, q4_0"):
        save_gguf(llama, tokenizer, tmp_path / "a.gguf", "q4_k")
    with pytest.raises(ValueError, match=r"must end in \.gguf"):
        save_gguf(llama, tokenizer, tmp_path / "a.bin")
    with pytest.raises(ValueError, match="does not exist: create it"):
        save_gguf(llama, tokenizer, tmp_path / "no" / "a.gguf")
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tokenizer)))
    with pytest.raises(ValueError, match=r"Llama-family .* 'gpt2'.*convert_hf_to_gguf"):
        save_gguf(gpt2, tokenizer, tmp_path / "a.gguf")
    peft = pytest.importorskip("peft")
    adapted = peft.get_peft_model(tiny_llama(len(tokenizer)), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(ValueError, match="LoRA adapters: merge them first"):
        save_gguf(adapted, tokenizer, tmp_path / "a.gguf")
    assert list(tmp_path.iterdir()) == []
    first = save_gguf(llama, tokenizer, tmp_path / "a.gguf", "f32")
    written = first.read_bytes()
    with pytest.raises(ValueError, match="exists: choose another name, or replace it with --force"):
        save_gguf(llama, tokenizer, first, "f16")
    assert first.read_bytes() == written

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", fail)
    with pytest.raises(OSError, match="disk full"):
        save_gguf(llama, tokenizer, first, "f16", force=True)
    assert first.read_bytes() == written and sorted(p.name for p in tmp_path.iterdir()) == ["Modelfile", "a.gguf"]


def test_a_lora_model_exports_its_merged_weights(tmp_path, llama, tokenizer):
    pytest.importorskip("peft")
    source = write_gguf(llama, tokenizer, tmp_path / "source.gguf")
    env = DummyVecEnv([lambda: grpo_gym.R1ZeroEnv(tokenizer=source, max_new_tokens=8)])
    model = GRPO("TransformerPolicy", env, n_groups=2, group_size=2, cold_start=False, learning_rate=1e-2,
                 policy_kwargs={"model": source, "lora": {"r": 4, "alpha": 8}})  # fmt: skip
    model.learn(4)
    from grpo_gym.gguf import load_gguf_model

    back = load_gguf_model(model.save_gguf(str(tmp_path / "merged.gguf"), type="f32"))
    merged = model.policy._plain_copy(None).merge_and_unload()
    for name, tensor in merged.state_dict().items():
        assert torch.allclose(back.state_dict()[name], tensor, atol=1e-6), name
    assert model.policy.lora is not None  # the policy keeps its adapters


def test_the_command_line_exports_a_saved_model(tmp_path, llama, tokenizer, capsys):
    source = write_gguf(llama, tokenizer, tmp_path / "source.gguf")
    env = DummyVecEnv([lambda: grpo_gym.R1ZeroEnv(tokenizer=source, max_new_tokens=8)])
    model = GRPO("TransformerPolicy", env, n_groups=2, group_size=2, policy_kwargs={"model": source}, cold_start=False)
    model.save(tmp_path / "run.zip")
    out = tmp_path / "run.gguf"
    assert main(["export", str(tmp_path / "run.zip"), "--gguf", str(out), "--type", "q8_0"]) == 0
    printed = capsys.readouterr().out
    assert "(q8_0)" in printed and "ollama create run -f Modelfile" in printed
    assert gguf.GGUFReader(out).fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q8_0
    with pytest.raises(SystemExit, match="2"):
        main(["export", str(tmp_path / "run.zip"), "--gguf", str(out)])  # exists: refused
    assert "replace it with --force" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "run.zip"), "--gguf", str(out), "--force", "--type", "f16"]) == 0
    with pytest.raises(SystemExit, match="2"):
        main(["export", str(tmp_path / "run.zip"), "--gguf", str(tmp_path / "x.gguf"), "--type", "q9"])
    assert "choose one of" in capsys.readouterr().err and not (tmp_path / "x.gguf").exists()
    with pytest.raises(SystemExit, match="2"):  # the missing input named first, before the outputs
        main(["export", str(tmp_path / "missing.zip"), "--gguf", str(out)])
    assert "no model file at" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "Modelfile").write_text("FROM ./mine.gguf\n")
    with pytest.raises(SystemExit, match="2"):  # another export's Modelfile in the folder: kept
        main(["export", str(tmp_path / "run.zip"), "--gguf", str(tmp_path / "other" / "run.gguf")])
    assert "export into another folder, or replace it with --force" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["Modelfile"]
    capsys.readouterr()
    evaluation = ["--n", "4", "--difficulty", "0.1", "--greedy"]
    assert main(["eval", str(tmp_path / "run.zip"), *evaluation]) == 0
    from_zip = capsys.readouterr().out.splitlines()[1].split()[1:]
    assert main(["eval", "--model", str(out), "--max-new-tokens", "8", *evaluation]) == 0  # the f16 file, read back
    assert capsys.readouterr().out.splitlines()[1].split()[1:] == from_zip  # the same held-out results
