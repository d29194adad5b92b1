"""Start ``c`` of the robustness benchmark: the pretrained start of issue 30, built as the issue describes it.

- **Tokenizer** (:func:`build_tokenizer`): word-level, one token per character: ``<pad>``=0, ``<s>``=1, ``</s>``=2,
  digits, ``+-*=() <>/``, a-z, ``?:.,``, newline, and ``<unk>`` last (55 tokens); a ``PreTrainedTokenizerFast``.
  The template tags are no tokens of their own: ``<think>`` is seven characters.
- **Model** (:func:`build_model`): a fresh ``LlamaForCausalLM``, hidden 128, intermediate 512, 4 layers, 4 heads,
  4 key-value heads, max positions 4096 (about 0.9M parameters).
- **Data** (:class:`CarryAddition`): ``what is 484+357?\\n`` then
  ``<think>4+7+0=11,8+5+1=14,4+3+1=8</think><answer>841</answer>``: one step per column from the right with the
  carry written every time (``+0`` too), then the answer. Supervised tuning sees 2- and 3-digit additions (both
  operands with the same number of digits, half each); GRPO and the held-out evaluation 3-digit ones. The
  task's prompt is the question with its newline and no template around it (``template="{prompt}"``), and no
  ``<s>``: the tokenizer adds no special tokens to a prompt.
- **Supervised tuning** (:func:`supervised_tune`): 300 steps of AdamW (lr 1e-3, PyTorch's default weight decay),
  batch 64, seed 0, the loss on the completion only (its ``</s>`` included); each sequence is
  ``<s>`` + prompt + completion + ``</s>``. A plain PyTorch loop, no trainer of either framework.
- **GRPO from it** (:data:`ENV_KWARGS`, the issue's settings): reward 0.1 for a well-formed completion + 0.9 for
  the right answer, 64 new tokens.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from grpo_gym.tasks.arithmetic import ArithmeticTask
from grpo_gym.tasks.base import Problem

SPECIALS = ("<pad>", "<s>", "</s>")
CHARACTERS = "0123456789" + "+-*=() <>/" + "abcdefghijklmnopqrstuvwxyz" + "?:.," + "\n"
#: the env settings of this start (both trainers and the evaluator use them)
ENV_KWARGS = {
    "task": "carry_start:CarryAddition",
    "template": "{prompt}",
    "max_new_tokens": 64,
    "reward_weights": {"syntax": 0.1, "consistency": 0.0, "task": 0.9},
}


class CarryAddition(ArithmeticTask):
    """``what is a+b?\\n`` with ``a`` and ``b`` of ``digits`` digits each (3 unless the problem's metadata says);
    the gold reasoning adds the columns from the right, writing the carry every time.

    ``verify`` is :class:`ArithmeticTask`'s (an integer answer, exactly the sum). Difficulty does not change the
    problems (a fixed distribution, as a user's data set).
    """

    name = "carry_addition"

    def sample(self, difficulty: float, rng: np.random.Generator, digits: tuple[int, int] = (3, 3)) -> Problem:
        """Two operands of ``digits`` digits, uniform."""
        a, b = (int(rng.integers(10 ** (d - 1), 10**d)) for d in digits)
        return Problem(
            prompt=f"what is {a}+{b}?\n",
            answer=str(a + b),
            task=self.name,
            difficulty=difficulty,
            metadata={"operands": [a, b], "ops": "+", "paren": None},
        )

    def solution(self, problem: Problem) -> tuple[str, str]:
        """``("4+7+0=11,8+5+1=14,4+3+1=8", "841")`` for 484+357."""
        a, b = problem.metadata["operands"]
        steps, carry = [], 0
        for column in range(max(len(str(a)), len(str(b)))):
            x, y = (a // 10**column) % 10, (b // 10**column) % 10
            steps.append(f"{x}+{y}+{carry}={x + y + carry}")
            carry = (x + y + carry) // 10
        return ",".join(steps), str(a + b)


def completion_text(task: CarryAddition, problem: Problem) -> str:
    """The gold completion of ``problem`` (without ``</s>``)."""
    reasoning, answer = task.solution(problem)
    return f"<think>{reasoning}</think><answer>{answer}</answer>"


def build_tokenizer() -> Any:
    """The start's word-level character tokenizer (see the module doc) as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate((*SPECIALS, *CHARACTERS, "<unk>"))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def build_model(tokenizer: Any, seed: int = 0) -> Any:
    """A freshly initialised ``LlamaForCausalLM`` of the issue's shape for ``tokenizer``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config)


def tuning_batch(tokenizer: Any, task: CarryAddition, rng: np.random.Generator, size: int) -> tuple[Any, Any]:
    """``(input_ids, labels)`` of ``size`` sequences ``<s> prompt completion </s>`` (2 or 3 digits, half each),
    right-padded; labels -100 outside the completion."""
    import torch

    rows = []
    for _ in range(size):
        problem = task.sample(0.5, rng, digits=tuple(int(d) for d in rng.integers(2, 4, size=2)))
        prompt = [tokenizer.bos_token_id, *tokenizer.encode(problem.prompt)]
        completion = [*tokenizer.encode(completion_text(task, problem)), tokenizer.eos_token_id]
        rows.append((prompt, completion))
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((size, width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((size, width), -100, dtype=torch.long)
    for row, (prompt, completion) in enumerate(rows):
        ids[row, : len(prompt) + len(completion)] = torch.tensor(prompt + completion)
        labels[row, len(prompt) : len(prompt) + len(completion)] = torch.tensor(completion)
    return ids, labels


def supervised_tune(
    folder: str, seed: int = 0, steps: int = 300, batch_size: int = 64, learning_rate: float = 1e-3
) -> dict[str, Any]:
    """Build the tokenizer and the model, tune them as the module doc says, save both to ``folder``."""
    import torch

    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed)
    task, rng = CarryAddition(), np.random.default_rng(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    start, losses = time.perf_counter(), []
    model.train()
    for step in range(1, steps + 1):
        ids, labels = tuning_batch(tokenizer, task, rng, batch_size)
        loss = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long(), labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % 50 == 0:
            print(f"tuning step {step}: loss {np.mean(losses[-50:]):.4f}", flush=True)
    model.eval()
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    parameters = sum(p.numel() for p in model.parameters())
    return {"steps": steps, "seconds": time.perf_counter() - start, "parameters": parameters, "loss": losses[-1]}
