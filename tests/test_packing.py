"""Tests of the packed, prefix-shared layout of the update's forward pass (algorithms.common.generation.packing)."""

from __future__ import annotations

import pytest
import torch

from algorithms.common.generation.completion_pass import completion_log_probs
from algorithms.common.generation.packing import PADDING, PROMPT, pack_rows, packing_pays
from algorithms.common.model.loading import load_model


def test_layout_by_hand():
    prompt_ids = torch.tensor([[0, 7, 8], [0, 7, 8], [5, 6, 9]])  # rows 0 and 1 share the prompt (7, 8)
    prompt_mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1]])
    completion_ids = torch.tensor([[20, 21, 0], [30, 0, 0], [40, 41, 42]])
    completion_mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]]).bool()
    packed = pack_rows(prompt_ids, prompt_mask, completion_ids, completion_mask, pad_id=0)
    # distinct prompts in order of appearance: (7, 8) with two completions, then (5, 6, 9)
    assert packed.input_ids.tolist() == [[7, 8, 20, 21, 30, 0], [5, 6, 9, 40, 41, 42]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2, 0], [0, 1, 2, 3, 4, 5]]
    assert packed.segments.tolist() == [[PROMPT] * 2 + [0, 0, 1, PADDING], [PROMPT] * 3 + [2] * 3]
    # each completion token's predictor: the prompt's last token first, then the token before it (row * 6 + col)
    assert packed.source.tolist() == [1, 2, 1, 6 + 2, 6 + 3, 6 + 4]
    allowed = packed.attention_mask()[:, 0]
    assert allowed[0, 4].tolist() == [True, True, False, False, True, False]  # token 30 does not see 20, 21
    assert allowed[0, 3].tolist() == [True, True, True, True, False, False]
    assert allowed[0, 5].tolist() == [False] * 5 + [True]  # padding sees itself only


def test_long_groups_are_split_and_the_prompt_repeated():
    prompt_ids, prompt_mask = torch.tensor([[3, 4]] * 3), torch.ones(3, 2, dtype=torch.long)
    completion_ids = torch.arange(10, 22).view(3, 4)
    packed = pack_rows(prompt_ids, prompt_mask, completion_ids, torch.ones(3, 4, dtype=torch.bool), pack_length=10)
    assert packed.input_ids.tolist() == [[3, 4, 10, 11, 12, 13, 14, 15, 16, 17], [3, 4, 18, 19, 20, 21, 0, 0, 0, 0]]


def test_a_completion_needs_a_prompt():
    with pytest.raises(ValueError, match="at least one token"):
        pack_rows(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long),
                  torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool))  # fmt: skip


@pytest.mark.parametrize("pack_length", [512, 12])
def test_packed_equals_padded_values_and_gradients(monkeypatch, pack_length):
    """A GRPO-shaped batch (3 prompts x 4 completions of mixed lengths, one empty): the packed layout gives the
    padded layout's log-probs, entropies and parameter gradients."""
    import algorithms.common.generation.completion_pass as generation

    monkeypatch.setattr(generation, "pack_rows", lambda *a, **k: pack_rows(*a, **{**k, "pack_length": pack_length}))
    model = load_model("tiny", seed=0, num_hidden_layers=2).eval()
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 100, (n,), generator=generator) for n in (5, 9, 2)]
    prompt_ids = torch.zeros(12, 9, dtype=torch.long)
    prompt_mask = torch.zeros(12, 9, dtype=torch.long)
    for row in range(12):
        prompt = prompts[row // 4]
        prompt_ids[row, -len(prompt) :], prompt_mask[row, -len(prompt) :] = prompt, 1
    completion_ids = torch.randint(3, 100, (12, 7), generator=generator)
    lengths = torch.tensor([7, 1, 4, 0, 3, 3, 7, 2, 5, 6, 1, 7])
    completion_mask = torch.arange(7) < lengths[:, None]
    results = {}
    for layout in ("padded", "packed"):
        model.zero_grad()
        log_probs, entropy = completion_log_probs(
            model, prompt_ids, prompt_mask, completion_ids, completion_mask, with_entropy=True, vocab_size=103,
            layout=layout, temperature=0.8,
        )  # fmt: skip
        (log_probs.sum() + entropy.sum()).backward()
        results[layout] = (log_probs, entropy, [p.grad.clone() for p in model.parameters()])
    (lp_a, ent_a, grads_a), (lp_b, ent_b, grads_b) = results["padded"], results["packed"]
    assert (lp_b[~completion_mask] == 0).all() and (lp_b[completion_mask] < 0).all()
    torch.testing.assert_close(lp_b, lp_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_b, ent_a, atol=1e-5, rtol=0)
    for grad_a, grad_b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(grad_b, grad_a, atol=1e-4, rtol=1e-4)


def test_auto_packs_where_it_saves_work_and_pads_where_attention_would_grow():
    """Long shared prompts with short completions pack (the prompt runs once); a short prompt with 8 completions at
    the length cap pads (a packed row would be 8 completions long, and attention grows with its square)."""
    model = load_model("tiny", seed=0)
    long_prompts = torch.randint(3, 50, (4, 256)).repeat_interleave(8, 0)
    short_prompts = torch.randint(3, 50, (4, 17)).repeat_interleave(8, 0)
    short, full = torch.ones((32, 16), dtype=torch.bool), torch.ones((32, 64), dtype=torch.bool)
    assert packing_pays(model, long_prompts, torch.ones_like(long_prompts), short)
    assert not packing_pays(model, short_prompts, torch.ones_like(short_prompts), full)
