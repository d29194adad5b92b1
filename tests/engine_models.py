"""What the engine tests share: whether vLLM imports (the skip reason), a 1-layer Llama-family model vLLM's CPU
backend runs (attention head size 32), a left-padded prompt batch with a repeated prompt (a GRPO group), and the
update's log-probs of a completion batch."""

from __future__ import annotations

import torch

from algorithms.common.generation.completion_pass import completion_log_probs
from algorithms.common.generation.engines.base import SamplingSettings
from algorithms.common.generation.sampler import Completions
from algorithms.common.model.loading import load_model
from grpo_gym.tokenizer import BUILTIN_VOCAB_SIZE

try:
    import vllm  # noqa: F401

    #: why the real vLLM tests are skipped here ("" where vLLM imports)
    VLLM_MISSING = ""
except Exception as error:  # ImportError, or a broken install (a CUDA torchvision beside the CPU torch)
    VLLM_MISSING = f"vLLM cannot be imported ({type(error).__name__}: {error}); install it: bash .ci/install_vllm.sh"

PAD, EOS = 0, 1
#: 1 layer, 64 wide, 2 heads of 32 (vLLM's CPU attention runs head sizes 32, 64, 80, ...; tests/sizes.py's has 16)
ENGINE_KWARGS = {
    "num_hidden_layers": 1,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


def tiny_model(seed: int = 0, vocab_size: int = BUILTIN_VOCAB_SIZE, **overrides) -> torch.nn.Module:
    """The built-in tiny Llama at :data:`ENGINE_KWARGS` sizes, in eval mode."""
    return load_model("tiny", vocab_size=vocab_size, seed=seed, **{**ENGINE_KWARGS, **overrides}).eval()


def settings(temperature: float = 1.0, top_p: float = 0.92, top_k: int = 0, vocab_size: int = BUILTIN_VOCAB_SIZE):
    """The built-in tokenizer's sampling settings."""
    return SamplingSettings(EOS, PAD, temperature=temperature, top_p=top_p, top_k=top_k, vocab_size=vocab_size)


def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """``(4, 6)`` left-padded ids and mask; rows 0 and 2 are the same prompt."""
    rows = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14], [5, 6, 7, 8], [40, 41]]
    ids = torch.full((len(rows), 6), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), 6), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, -len(row) :] = torch.tensor(row)
        mask[i, -len(row) :] = 1
    return ids, mask


def update_log_probs(model, ids, mask, out: Completions, sampling: SamplingSettings) -> torch.Tensor:
    """The update's ``(B, N)`` log-probs of ``out``'s tokens (the trainer's forward pass), 0 off the mask."""
    with torch.no_grad():
        return completion_log_probs(
            model, ids, mask, out.tokens, out.mask, temperature=sampling.temperature, vocab_size=sampling.vocab_size
        )[0]


def max_gap(model, ids, mask, out: Completions, sampling: SamplingSettings) -> float:
    """The largest difference between an engine's log-probs and the update's, over the real tokens."""
    return float((update_log_probs(model, ids, mask, out, sampling) - out.log_probs).abs().max())
