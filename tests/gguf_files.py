"""GGUF files written here, as llama.cpp's convert_hf_to_gguf.py writes them, from a tiny Llama and a byte-level BPE
tokenizer trained on the arithmetic task's text: what the GGUF tests load back through the user's path.

The ``gguf`` package's writer holds the metadata (architecture, sizes, the tokenizer's tokens, merges, special ids and
chat template) and the tensors, named as llama.cpp names them, with the query and key projections permuted as
llama.cpp stores them (transformers permutes them back when it reads the file)."""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from typing import Any

import numpy as np
import torch

from algorithms.common.saving.gguf_export import permute_rotary

#: the chat template of the tiny model's tokenizer (ChatML, as SmolLM2's)
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_level_tokenizer() -> Any:
    """A small byte-level BPE tokenizer (a ``PreTrainedTokenizerFast``: 256 bytes, merges learned on the arithmetic
    task's prompts and solutions, the ChatML specials), its EOS ``<|im_end|>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from grpo_gym.tasks import make_task
    from grpo_gym.templates import R1ZERO_INSTRUCTIONS

    task = make_task("arithmetic")
    texts = [R1ZERO_INSTRUCTIONS, "system user assistant"]
    for seed in range(200):
        problem = task.sample_seeded(0.3, seed)
        reasoning, answer = task.solution(problem)
        texts += [problem.prompt, f"<think>{reasoning}</think><answer>{answer}</answer>"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=list(SPECIALS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def tiny_llama(vocab_size: int, seed: int = 0) -> Any:
    """A tiny Llama (2 layers, hidden 64, 4 heads over 2 key/value heads), its output layer tied to the embeddings."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


def write_gguf(
    model: Any,
    tokenizer: Any,
    path: str | os.PathLike,
    quantization: str = "F32",
    architecture: str = "llama",
    chat_template: bool = True,
    leave_out: Collection[str] = (),
) -> str:
    """Write ``model`` (a Llama) and ``tokenizer`` (byte-level BPE) to a GGUF file at ``path``; returns the path.

    :param quantization: the type of the 2-D weights: ``"F32"``, ``"F16"``, ``"Q8_0"`` or any type the ``gguf``
        package quantizes to (norms stay F32, as llama.cpp keeps them)
    :param architecture: the ``general.architecture`` written (another than ``"llama"`` makes a file transformers
        cannot build, for the error tests)
    :param chat_template: write the tokenizer's chat template
    :param leave_out: the model's tensors (its state dict's names) not written, for the error tests
    """
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(os.fspath(path), arch=architecture)
    writer.add_name("tiny-llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    special = set(tokenizer.all_special_tokens)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token in special else 1 for token in tokens])  # 3: control, 1: normal
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]  # pairs, or "a b" strings
    writer.add_token_merges([" ".join(pair) if isinstance(pair, list) else pair for pair in merges])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_unk_token_id(tokenizer.unk_token_id)
    writer.add_add_bos_token(False)
    if chat_template:
        writer.add_chat_template(tokenizer.chat_template)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    kind = gguf.GGMLQuantizationType[quantization]
    for name, tensor in model.state_dict().items():
        if (name == "lm_head.weight" and config.tie_word_embeddings) or name in leave_out:
            continue
        base, _, suffix = name.rpartition(".")
        data = tensor.detach().float().numpy()
        if base.endswith("q_proj"):
            data = permute_rotary(data, config.num_attention_heads)
        elif base.endswith("k_proj"):
            data = permute_rotary(data, config.num_key_value_heads)
        target = f"{names.get_name(base)}.{suffix}"
        if data.ndim == 1 or kind == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(target, data.astype(np.float32))
        elif kind == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(target, data.astype(np.float16))
        else:
            writer.add_tensor(target, gguf.quants.quantize(data, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return os.fspath(path)
