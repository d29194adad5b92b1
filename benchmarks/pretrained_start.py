"""A user's pretrained start: a small Hugging Face Llama with its own character tokenizer, supervised-tuned on
2–3-digit addition with a digit-by-digit scratchpad, saved as a folder that loads the way a user's checkpoint
does (``policy_kwargs={"model": folder}`` + ``gym.make("R1Zero-v0", tokenizer=folder)``; TRL's
``GRPOTrainer(model=folder)``).

- **Task** (:class:`ScratchpadAddition`, ``task="pretrained_start:ScratchpadAddition"`` with ``benchmarks/`` on
  ``sys.path``): ``"What is 478+56?"`` with operands of 2 or 3 digits; the gold reasoning adds column by column
  from the right, carries written out (``8+6=14,7+5+1=13,4+0+1=5,534``), then the answer. Difficulty does not
  change it (a fixed distribution, as a user's data set).
- **Tokenizer** (:func:`build_tokenizer`): one token per character of a 75-character alphabet (letters, digits,
  the punctuation the prompts use), the four template tags as single tokens, ``<pad>``/``<eos>``/``<unk>``; a
  ``PreTrainedTokenizerFast`` built here, not the project's built-in one (other ids, no byte fallback).
- **Model** (:func:`build_model`): ``LlamaForCausalLM``, hidden 128, 4 layers, 4 heads, untied embeddings:
  about 1M parameters.
- **Supervised tuning** (:func:`supervised_tune`): a plain PyTorch loop (no trainer of either framework) on the
  gold completions, evaluated greedily every ``eval_every`` steps on a validation set (not the benchmark's
  held-out set), stopped at the first evaluation that reaches ``target`` success.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from grpo_gym.tasks.arithmetic import ArithmeticTask
from grpo_gym.tasks.base import Problem

SPECIALS = ("<pad>", "<eos>", "<unk>")
TAGS = ("<think>", "</think>", "<answer>", "</answer>")
ALPHABET = " \n0123456789+-*=,.:?" + "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
#: the env settings of this start: the compact template (the model learns the format from its tuning data)
ENV_KWARGS = {
    "task": "pretrained_start:ScratchpadAddition",
    "template": "compact",
    "max_new_tokens": 40,
    "reward_weights": {"syntax": 0.2, "consistency": 0.0, "task": 0.8},
}


class ScratchpadAddition(ArithmeticTask):
    """``a+b`` with ``a`` and ``b`` of 2 or 3 digits; the gold reasoning is a column-by-column scratchpad.

    ``verify`` is :class:`ArithmeticTask`'s (an integer answer, exactly the sum).
    """

    name = "scratchpad_addition"

    def sample(self, difficulty: float, rng: np.random.Generator) -> Problem:
        """Two operands, each of 2 or 3 digits (uniform), then uniform in that range."""
        digits = rng.integers(2, 4, size=2)
        a, b = (int(rng.integers(10 ** (d - 1), 10**d)) for d in digits)
        return Problem(
            prompt=f"What is {a}+{b}?",
            answer=str(a + b),
            task=self.name,
            difficulty=difficulty,
            metadata={"operands": [a, b], "ops": "+", "paren": None},
        )

    def solution(self, problem: Problem) -> tuple[str, str]:
        """``("8+6=14,7+5+1=13,4+0+1=5,534", "534")`` for 478+56: one step per column from the right (the carry
        added when there is one), then the digits read back."""
        a, b = problem.metadata["operands"]
        width = max(len(str(a)), len(str(b)))
        steps, carry = [], 0
        for column in range(width):
            x, y = (a // 10**column) % 10, (b // 10**column) % 10
            total = x + y + carry
            steps.append(f"{x}+{y}{f'+{carry}' if carry else ''}={total}")
            carry = total // 10
        return ",".join([*steps, str(a + b)]), str(a + b)


def build_tokenizer() -> Any:
    """The start's own character tokenizer (:data:`ALPHABET`, the tags, three specials) as a
    ``PreTrainedTokenizerFast``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate((*SPECIALS, *TAGS, *ALPHABET))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_tokens(list(TAGS))  # already in the vocabulary: matched whole before the text is split
    return tokenizer


def build_model(tokenizer: Any, seed: int) -> Any:
    """A freshly initialised ``LlamaForCausalLM`` of about 1M parameters for ``tokenizer``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        rms_norm_eps=1e-6,
    )
    return LlamaForCausalLM(config)


def _batch(env: Any, size: int) -> tuple[Any, Any]:
    """``(input_ids, labels)`` of ``size`` gold examples, right-padded; labels -100 outside the completions."""
    import torch

    examples = env.unwrapped.gold_examples(size)
    width = max(len(p) + len(c) for p, c in examples)
    pad = env.unwrapped.codec.pad_id
    ids = torch.full((size, width), pad, dtype=torch.long)
    labels = torch.full((size, width), -100, dtype=torch.long)
    for row, (prompt, completion) in enumerate(examples):
        sequence = np.concatenate([prompt, completion])
        ids[row, : len(sequence)] = torch.as_tensor(sequence)
        labels[row, len(prompt) : len(sequence)] = torch.as_tensor(completion)
    return ids, labels


def greedy_success(folder_or_model: Any, env: Any, problems: list[Problem]) -> float:
    """Greedy success on ``problems`` through this project's policy and evaluator (``model`` a folder)."""
    from algorithms import GRPO
    from algorithms.common.evaluation import evaluate_problems

    model = GRPO("TransformerPolicy", env, policy_kwargs={"model": folder_or_model}, cold_start=False,
                 mixed_precision="no", seed=0, device="cpu")  # fmt: skip
    return evaluate_problems(model.policy, model.env, problems, seed=0, greedy=True).success_rate


def supervised_tune(
    folder: str,
    seed: int = 0,
    target: float = 0.62,
    max_steps: int = 4000,
    eval_every: int = 100,
    batch_size: int = 32,
    learning_rate: float = 2e-3,
    validation: int = 100,
) -> dict[str, Any]:
    """Build the tokenizer and model, tune on gold completions until greedy validation success reaches ``target``
    (checked every ``eval_every`` steps), save both to ``folder``; returns what it did."""
    import gymnasium as gym
    import torch

    import grpo_gym  # noqa: F401  (registers R1Zero-v0)

    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed)
    env = gym.make("R1Zero-v0", tokenizer=tokenizer, **ENV_KWARGS)
    env.reset(seed=seed)
    valid = env.unwrapped.eval_problems(validation, env.unwrapped.difficulty, seed=1)  # not the held-out set (0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, 0.1, 1.0, total_iters=100)
    history, start = [], time.perf_counter()
    for step in range(1, max_steps + 1):
        model.train()
        ids, labels = _batch(env, batch_size)
        loss = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long(), labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        warmup.step()
        if step % eval_every == 0:
            model.eval()
            success = greedy_success(model, env, valid)
            history.append({"step": step, "loss": round(loss.item(), 4), "validation": success})
            print(f"sft step {step}: loss {loss.item():.4f}, greedy validation success {success:.1%}", flush=True)
            if success >= target:
                break
    model.eval()
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    parameters = sum(p.numel() for p in model.parameters())
    return {"steps": step, "seconds": time.perf_counter() - start, "parameters": parameters, "history": history}
