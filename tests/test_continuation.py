"""Tests of algorithms.common.generation.continuation: the KV cache kept across the turns of multi-turn episodes.

A later turn sampled from the cache of the turn before runs only the tokens the env added; its tokens and log-probs
are those of a fresh pass over the whole context (float32, ~1e-6), for every row still playing, and a row whose
window dropped old tokens is prefilled afresh in the same batch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

import grpo_gym
from algorithms import GRPO
from algorithms.common.generation.completion_pass import completion_log_probs
from algorithms.common.generation.sampler import sample
from algorithms.common.model.loading import load_model
from algorithms.common.rollout.batch import left_pad
from tests.sizes import TINY

PAD, VOCAB = 0, 120
EOS = list(range(1, 12))  # many EOS ids: rows end at different steps, so the sampler drops (parks) finished rows
SETTINGS = {"max_new_tokens": 10, "eos_token_id": EOS, "pad_token_id": PAD, "vocab_size": VOCAB, "top_p": 1.0}


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request):
    if request.param == "llama":
        return load_model("tiny", seed=0, vocab_size=VOCAB, num_hidden_layers=2, hidden_size=64,
                          intermediate_size=128, num_attention_heads=4, num_key_value_heads=2).eval()  # fmt: skip
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def draw(model: Any, contexts: list[torch.Tensor], seed: int, **kwargs: Any):
    ids, mask = left_pad(contexts, PAD)
    return sample(model, ids, mask, generator=torch.Generator().manual_seed(seed), **SETTINGS, **kwargs), ids, mask


def next_contexts(contexts: list[torch.Tensor], done: Any, added: list[int]) -> list[torch.Tensor]:
    """What an env shows next: each context, the completion's tokens without its EOS, then ``added[i]`` new tokens."""
    out = []
    for i, context in enumerate(contexts):
        body = done.tokens[i, : int(done.lengths[i])]
        if len(body) and int(body[-1]) in EOS:
            body = body[:-1]
        new = torch.randint(20, VOCAB, (added[i],), generator=torch.Generator().manual_seed(100 + i))
        out.append(torch.cat([context, body, new]))
    return out


def test_later_turns_from_the_cache_equal_a_fresh_pass(model) -> None:
    """Three turns: each later turn, sampled from the cache of the last for the rows still playing (in another
    order), draws the tokens a fresh prefill draws, and its log-probs equal a full pass over the whole context."""
    prompts = [torch.randint(20, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in (5, 9, 9, 12, 3, 7)]
    first, _, _ = draw(model, prompts, seed=1, keep_cache=True)
    assert first.cache is not None and len(first.cache) == 6
    assert len(set(first.lengths.tolist())) > 1  # rows ended at different steps: finished rows were parked
    contexts, rows = next_contexts(prompts, first, [2, 3, 1, 4, 2, 5]), [5, 0, 2, 4, 1]
    cache = first.cache
    for turn, seed in enumerate((2, 3)):
        picked = [contexts[r] for r in rows]
        kept, ids, mask = draw(model, picked, seed, cache=cache, cache_rows=rows, keep_cache=True)
        fresh, _, _ = draw(model, picked, seed)
        assert torch.equal(kept.tokens, fresh.tokens) and torch.equal(kept.mask, fresh.mask)
        assert torch.allclose(kept.log_probs, fresh.log_probs, atol=1e-5)
        full, _ = completion_log_probs(model, ids, mask, kept.tokens, kept.mask, vocab_size=VOCAB)
        assert (full - kept.log_probs).abs().max() < 1e-5
        contexts, cache = next_contexts(picked, kept, [3] * len(picked)), kept.cache
        rows = [3, 1, 0] if turn == 0 else rows


def test_a_window_that_dropped_old_tokens_is_prefilled_afresh(model) -> None:
    """A row whose new context does not extend what its cache holds (the window cut its oldest tokens, or the env
    rewrote it) is prefilled from scratch in the same batch; the other rows continue from the cache."""
    prompts = [torch.randint(20, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in (6, 8, 4)]
    first, _, _ = draw(model, prompts, seed=4, keep_cache=True)
    contexts = next_contexts(prompts, first, [2, 2, 2])
    contexts[1] = contexts[1][3:]  # the window dropped its three oldest tokens
    contexts[2] = torch.cat([torch.tensor([25, 26]), contexts[2][2:]])  # rewritten
    kept, ids, mask = draw(model, contexts, seed=5, cache=first.cache, cache_rows=[0, 1, 2])
    fresh, _, _ = draw(model, contexts, seed=5)
    assert torch.equal(kept.tokens, fresh.tokens)
    full, _ = completion_log_probs(model, ids, mask, kept.tokens, kept.mask, vocab_size=VOCAB)
    assert (full - kept.log_probs).abs().max() < 1e-5


def test_a_cache_is_refused_by_another_model_and_not_kept_by_the_hf_decoder(model) -> None:
    prompts = [torch.tensor([30, 31, 32])]
    first, _, _ = draw(model, prompts, seed=0, keep_cache=True)
    other = load_model("tiny", seed=1, vocab_size=VOCAB).eval()
    with pytest.raises(ValueError, match="same model"):
        draw(other, prompts, seed=0, cache=first.cache, cache_rows=[0])
    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=128)
    gpt2 = GPT2LMHeadModel(config).eval()  # the model's own forward: no cache across calls, every turn prefilled
    assert draw(gpt2, prompts, seed=0, keep_cache=True)[0].cache is None


def feedback_env(n_envs: int) -> DummyVecEnv:
    kwargs = {"template": "compact", "max_new_tokens": 16, "context_length": 512, "max_turns": 3}
    return DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**kwargs))] * n_envs)


def rollout(turn_cache: bool, n_envs: int) -> Any:
    model = GRPO("TransformerPolicy", feedback_env(n_envs), n_groups=2, group_size=4, cold_start=False,
                 policy_kwargs=TINY, seed=3, mixed_precision="no", turn_kwargs={"cache": turn_cache})  # fmt: skip
    rows_seen, ratios = [], []
    build = model._build_batch

    def build_and_check(rows: Any, seconds: float) -> Any:
        batch = build(rows, seconds)
        args = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
        ratios.append((model.policy.log_probs(*args)[0] - batch.old_log_probs).abs().max().item())  # before the update
        rows_seen.append(rows)
        return batch

    model._build_batch = build_and_check
    model.learn(8)
    assert ratios[0] < 1e-5  # the sampled log-probs are those the update recomputes: a ratio of 1
    return model, rows_seen[0]


@pytest.mark.parametrize("n_envs", [8, 4])
def test_a_multi_turn_rollout_with_the_cache_samples_what_one_without_it_samples(n_envs: int) -> None:
    """GRPO's rollout on feedback episodes (three answers each): every later turn continues from the cache of the
    last; the rows, their tokens and log-probs are those of the rollout that prefills every turn, and the sampled
    log-probs are those the update recomputes."""
    cached, with_cache = rollout(True, n_envs)
    fresh, without = rollout(False, n_envs)
    assert max(with_cache.turns) == 2 and with_cache.turns == without.turns
    assert with_cache.episodes == without.episodes
    for a, b in zip(with_cache.tokens, without.tokens, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(with_cache.log_probs, without.log_probs, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    for a, b in zip(cached.policy.parameters(), fresh.policy.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
