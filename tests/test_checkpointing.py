"""Gradient checkpointing every N layers: the same gradients as the plain model, less memory kept."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from algorithms.common.generation.completion_pass import completion_log_probs
from algorithms.common.model.gradient_checkpointing import checkpoint_every, decoder_layers
from algorithms.common.model.loading import load_model


def _batch():
    generator = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(3, 100, (6, 5), generator=generator)
    prompt_mask = torch.ones(6, 5, dtype=torch.long)
    prompt_mask[:2, :2] = 0
    completion_ids = torch.randint(3, 100, (6, 8), generator=generator)
    completion_mask = torch.arange(8) < torch.tensor([8, 3, 5, 1, 8, 6])[:, None]
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def _gradients(model, layout):
    model.zero_grad()
    log_probs, entropy = completion_log_probs(model, *_batch(), with_entropy=True, vocab_size=103, layout=layout)
    (log_probs.sum() + 0.1 * entropy.sum()).backward()
    return log_probs.detach(), [p.grad.clone() for p in model.parameters()]


def _gpt2():
    config = GPT2Config(vocab_size=103, n_embd=32, n_layer=5, n_head=4, n_positions=64)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("every", [1, 2, 4, 5])
@pytest.mark.parametrize("make", [lambda: load_model("tiny", seed=0, num_hidden_layers=5), _gpt2])
@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_checkpointed_gradients_equal_plain_ones(make, every, layout):
    plain, checkpointed = make(), make()
    checkpointed.load_state_dict(plain.state_dict())
    chunks = checkpoint_every(checkpointed, every)
    assert chunks == -(-5 // every)
    log_probs, grads = _gradients(plain, layout)
    checkpointed_log_probs, checkpointed_grads = _gradients(checkpointed, layout)
    torch.testing.assert_close(checkpointed_log_probs, log_probs, atol=0, rtol=0)
    for grad, checkpointed_grad in zip(grads, checkpointed_grads, strict=True):
        torch.testing.assert_close(checkpointed_grad, grad, atol=1e-6, rtol=1e-5)


def test_checkpointing_keeps_fewer_tensors_for_backward():
    """Count what autograd saves: with chunks of 2 over 4 layers, only the chunks' inputs are kept."""
    saved = {}
    for every in (None, 2):
        model = load_model("tiny", seed=0)
        if every:
            checkpoint_every(model, every)
        total = 0

        def pack(tensor):
            nonlocal total
            total += tensor.numel()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            completion_log_probs(model, *_batch(), vocab_size=103)[0].sum()
        saved[every] = total
    assert saved[2] < 0.5 * saved[None]


def test_no_grad_forward_and_state_dict_are_untouched():
    model, plain = load_model("tiny", seed=0), load_model("tiny", seed=0)
    checkpoint_every(model, 2)
    assert list(model.state_dict()) == list(plain.state_dict())
    ids = torch.randint(3, 100, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, plain(input_ids=ids).logits, atol=0, rtol=0)
    checkpoint_every(model, 3)  # re-chunking starts from the original layer methods
    _, grads = _gradients(model, "packed")
    _, plain_grads = _gradients(plain, "packed")
    for grad, plain_grad in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(grad, plain_grad, atol=1e-6, rtol=1e-5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="N >= 1"):
        checkpoint_every(load_model("tiny"), 0)
    with pytest.raises(ValueError, match="layer list"):
        decoder_layers(torch.nn.Linear(2, 2))


def test_grpo_with_checkpointing_trains_the_same_weights(tmp_path):
    """End to end: two GRPO iterations with checkpointing every 2 layers give the plain run's weights, and the
    setting survives save/load."""
    from algorithms.grpo import GRPO
    from tests.sizes import TINY, TINY_KWARGS
    from tests.test_grpo import make_model, parameters

    kwargs = {**TINY, "model_kwargs": {**TINY_KWARGS, "num_hidden_layers": 3}}
    runs = []
    for every in (False, 2):
        model = make_model(policy_kwargs={**kwargs, "gradient_checkpointing": every}, learning_rate=1e-3)
        model.learn(16)
        runs.append(parameters(model))
    for plain, checkpointed in zip(*runs, strict=True):
        torch.testing.assert_close(checkpointed, plain, atol=1e-6, rtol=1e-5)
    model.save(tmp_path / "model.zip")
    loaded = GRPO.load(tmp_path / "model.zip", env=model.env)
    assert loaded.policy.gradient_checkpointing == 2
    assert "_plain_forward" in vars(decoder_layers(loaded.policy.model)[0])
