"""Tests for algorithms/common/losses.py, and the discounted returns (algorithms/common/rollout/rows.py): every
function against numbers worked out by hand."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from algorithms.common.generation.sampler import log_probs_of
from algorithms.common.losses import (
    aggregate,
    clipped_surrogate,
    gspo_token_log_ratio,
    kl_k3,
    sequence_log_ratio,
)
from algorithms.common.rollout.rows import returns_to_go

F64 = torch.float64

# ---------------------------------------------------------------------------------------------------------
# returns_to_go
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "gamma, expected",
    [
        (0.5, [2.75, 5.0]),  # row 0: 1 + 0.5 * 2 + 0.25 * 3 = 2.75; row 1: only turn 0 is valid -> 5
        (1.0, [6.0, 5.0]),  # undiscounted: 1 + 2 + 3
        (0.0, [1.0, 5.0]),  # gamma^0 = 1 for turn 0, nothing after it
    ],
)
def test_episode_returns_by_hand(gamma, expected):
    rewards = torch.tensor([[1.0, 2.0, 3.0], [5.0, float("nan"), float("inf")]], dtype=F64)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    torch.testing.assert_close(returns_to_go(rewards, gamma, mask)[:, 0], torch.tensor(expected, dtype=F64))


def test_returns_to_go_rejects_bad_input():
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
        returns_to_go(torch.ones(1, 2), 1.5, torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask has shape"):
        returns_to_go(torch.ones(1, 2), 0.9, torch.ones(1, 3, dtype=torch.bool))


# ---------------------------------------------------------------------------------------------------------
# clipped_surrogate
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "advantage, ratio, clip_low, clip_high, expected_loss, expected_clipped",
    [
        # A > 0, ratio 1.5 above 1.2: min(1.5, 1.2) = 1.2 -> loss -1.2, clipped (no gradient)
        (1.0, 1.5, 0.2, None, -1.2, True),
        # A > 0, ratio 0.5 below 0.8: min(0.5, 0.8) = 0.5 -> unclipped is active, loss -0.5
        (1.0, 0.5, 0.2, None, -0.5, False),
        # A < 0, ratio 1.5: min(-1.5, -1.2) = -1.5 -> unclipped, loss 1.5
        (-1.0, 1.5, 0.2, None, 1.5, False),
        # A < 0, ratio 0.5: min(-0.5, -0.8) = -0.8 -> clipped, loss 0.8
        (-1.0, 0.5, 0.2, None, 0.8, True),
        # inside the range: A = 2, ratio 1.1 -> 2.2 both ways, loss -2.2
        (2.0, 1.1, 0.2, None, -2.2, False),
        # clip-higher: ratio 1.25 is clipped at 1 + 0.2 but not at 1 + 0.28
        (1.0, 1.25, 0.2, 0.2, -1.2, True),
        (1.0, 1.25, 0.2, 0.28, -1.25, False),
        (1.0, 1.3, 0.2, 0.28, -1.28, True),
        # the lower bound stays at 1 - 0.2 with clip-higher: A < 0, ratio 0.75 -> min(-0.75, -0.8) = -0.8
        (-1.0, 0.75, 0.2, 0.28, 0.8, True),
        # A = 0: loss 0, nothing counted as clipped
        (0.0, 1.5, 0.2, None, 0.0, False),
    ],
)
def test_clipped_surrogate_by_hand(advantage, ratio, clip_low, clip_high, expected_loss, expected_clipped):
    logp = torch.tensor([[math.log(ratio) - 1.0]], dtype=F64)
    old_logp = torch.tensor([[-1.0]], dtype=F64)
    loss, r, clipped = clipped_surrogate(logp, old_logp, torch.tensor([advantage], dtype=F64), clip_low, clip_high)
    assert r.item() == pytest.approx(ratio, rel=1e-12)
    assert loss.item() == pytest.approx(expected_loss, rel=1e-12, abs=1e-15)
    assert clipped.item() is expected_clipped


def test_on_policy_ratio_is_one_and_gradient_is_minus_advantage_times_grad_logp():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=gen, dtype=F64, requires_grad=True)  # (B, T, V)
    tokens = torch.tensor([[0, 4, 2], [1, 1, 3]])
    advantages = torch.tensor([0.7, -1.3], dtype=F64)
    logp = log_probs_of(logits, tokens)  # (B, T)
    loss, ratio, clipped = clipped_surrogate(logp, logp.detach(), advantages, 0.2)
    assert torch.equal(ratio, torch.ones_like(ratio)) and not clipped.any()
    (grad,) = torch.autograd.grad(loss.sum(), logits, retain_graph=True)
    # d/dθ of -A * ratio at ratio = 1 is -A * ∇logp: weight each sequence's log-prob by -A
    (expected,) = torch.autograd.grad((-advantages.unsqueeze(1) * logp).sum(), logits)
    torch.testing.assert_close(grad, expected)


def test_clipped_surrogate_per_token_advantages_and_bad_input():
    logp = torch.zeros(2, 3)
    per_token_adv = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.0, 1.0]])
    loss, _, _ = clipped_surrogate(logp, logp, per_token_adv, 0.2)
    torch.testing.assert_close(loss, -per_token_adv)  # ratio 1 -> loss = -A
    with pytest.raises(ValueError, match=">= 0"):
        clipped_surrogate(logp, logp, torch.ones(2), -0.2)
    with pytest.raises(ValueError, match=r"advantages must be \(B,\) or \(B, T\)"):
        clipped_surrogate(logp, logp, torch.ones(3), 0.2)
    with pytest.raises(ValueError, match="old_logp has shape"):
        clipped_surrogate(logp, torch.zeros(2, 4), torch.ones(2), 0.2)


# ---------------------------------------------------------------------------------------------------------
# kl_k3
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "log_r, expected",
    [
        (0.0, 0.0),  # r = 1: 1 - 0 - 1 = 0
        (math.log(2), 2 - math.log(2) - 1),  # r = 2: 0.306853
        (-math.log(2), 0.5 + math.log(2) - 1),  # r = 1/2: 0.193147
        (-1.0, math.exp(-1) + 1 - 1),  # r = e^-1: 0.367879
    ],
)
def test_kl_k3_by_hand(log_r, expected):
    logp = torch.tensor([[-1.5]], dtype=F64)
    assert kl_k3(logp, logp + log_r).item() == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, F64])
def test_kl_k3_is_never_negative(dtype):
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(10_000, generator=gen).to(dtype).reshape(100, 100) * 5
    for scale in (1e-8, 1e-4, 1e-1, 3.0):  # near-equal log-probs are where round-off could go negative
        ref_logp = logp + (torch.randn(100, 100, generator=gen) * scale).to(dtype)
        assert (kl_k3(logp, ref_logp) >= 0).all()
    assert torch.equal(kl_k3(logp, logp), torch.zeros_like(logp))


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(p || q) = sum_x p(x) (log p(x) - log q(x)) for log-probabilities over the last dim."""
    return (p_log.exp() * (p_log - q_log)).sum(-1)


def test_kl_k3_expectation_under_policy_is_exactly_the_kl():
    # E_pi[r - log r - 1] with r = ref/pi: E_pi[r] = sum_x ref(x) = 1 and E_pi[-log r] = KL(pi || ref),
    # so the expectation is 1 + KL - 1 = KL(pi || ref), not only its sign.
    gen = torch.Generator().manual_seed(0)
    pi_log = torch.log_softmax(torch.randn(4, 7, generator=gen, dtype=F64), -1)  # (4 policies, V=7)
    ref_log = torch.log_softmax(torch.randn(4, 7, generator=gen, dtype=F64), -1)
    exact = (pi_log.exp() * kl_k3(pi_log, ref_log)).sum(-1)  # (4,)
    torch.testing.assert_close(exact, _kl(pi_log, ref_log))
    # The Monte Carlo mean over the policy's own samples converges to the same number.
    samples = torch.multinomial(pi_log[0].exp(), 200_000, replacement=True, generator=gen)
    mc = kl_k3(pi_log[0, samples], ref_log[0, samples]).mean()
    assert mc.item() == pytest.approx(exact[0].item(), rel=0.05)
    # Monotone: mixing pi toward ref shrinks the expected k3 to 0.
    mixes = [torch.log((1 - w) * pi_log.exp() + w * ref_log.exp()) for w in (0.0, 0.3, 0.6, 0.9, 1.0)]
    expected_k3 = [(m.exp() * kl_k3(m, ref_log)).sum(-1) for m in mixes]
    for before, after in itertools.pairwise(expected_k3):
        assert (after < before).all() or torch.allclose(after, torch.zeros_like(after))
    torch.testing.assert_close(expected_k3[-1], torch.zeros(4, dtype=F64))


@pytest.mark.parametrize("estimate", ["exact", "sampled"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_kl_k3_gradient_descent_pulls_policy_toward_reference(estimate, sign):
    # A categorical policy over V=6 tokens with learnable logits, a fixed reference; minimise beta * k3 on
    # tokens from the policy (weights detached, as in training). sign=-1 is the known sign bug
    # (`loss - beta * kl`): it must push the policy away, so this test would catch it.
    gen = torch.Generator().manual_seed(0)
    ref_log = torch.log_softmax(torch.randn(6, generator=gen, dtype=F64) * 2, -1)
    logits = torch.zeros(6, dtype=F64, requires_grad=True)
    optimizer = torch.optim.SGD([logits], lr=0.5)
    kls = []
    for _ in range(10):
        pi_log = torch.log_softmax(logits, -1)
        kls.append(_kl(pi_log.detach(), ref_log).item())
        if estimate == "exact":
            k3 = (pi_log.exp().detach() * kl_k3(pi_log, ref_log)).sum()
        else:
            tokens = torch.multinomial(pi_log.exp().detach(), 4096, replacement=True, generator=gen)
            k3 = kl_k3(pi_log[tokens], ref_log[tokens]).mean()
        optimizer.zero_grad()
        (sign * k3).backward()
        optimizer.step()
    if sign > 0:
        assert all(after < before for before, after in itertools.pairwise(kls)), kls
        assert kls[-1] < 0.5 * kls[0]
    else:
        assert kls[-1] > kls[0]


# ---------------------------------------------------------------------------------------------------------
# aggregate
# ---------------------------------------------------------------------------------------------------------

# (2, 3) example, lengths 3 and 1; masked slots hold garbage:
#   row 0: [1, 2, 3] all valid; row 1: [4, nan, inf] with only 4 valid.
#   sequence: mean(1, 2, 3) = 2 and mean(4) = 4 -> (2 + 4) / 2 = 3
#   token:    (1 + 2 + 3 + 4) / 4 valid tokens = 2.5
#   constant: (1 + 2 + 3 + 4) / (B=2 * max_tokens=5) = 1.0
# d(loss)/d(per_token) on valid slots: sequence 1/(2*3) on row 0 and 1/(2*1) on row 1; token 1/4;
# constant 1/10; masked slots 0.
MASK_2x3 = torch.tensor([[True, True, True], [True, False, False]])
GARBAGE = [[1.0, 2.0, 3.0], [4.0, float("nan"), float("inf")]]


@pytest.mark.parametrize(
    "mode, expected, expected_grad",
    [
        ("sequence", 3.0, [[1 / 6, 1 / 6, 1 / 6], [1 / 2, 0, 0]]),
        ("token", 2.5, [[1 / 4] * 3, [1 / 4, 0, 0]]),
        ("constant", 1.0, [[1 / 10] * 3, [1 / 10, 0, 0]]),
    ],
)
def test_aggregate_by_hand_with_nan_in_masked_positions(mode, expected, expected_grad):
    per_token = torch.tensor(GARBAGE, dtype=F64, requires_grad=True)
    value = aggregate(per_token, MASK_2x3, mode, max_tokens=5)
    assert value.item() == pytest.approx(expected, rel=1e-12)
    value.backward()
    torch.testing.assert_close(per_token.grad, torch.tensor(expected_grad, dtype=F64))


def test_aggregate_constant_uses_max_tokens():
    # (1 + 2 + 3 + 4) / (2 * 3) = 10/6
    assert aggregate(torch.tensor(GARBAGE), MASK_2x3, "constant", max_tokens=3).item() == pytest.approx(10 / 6)


@pytest.mark.parametrize(
    "mask, expected",
    [
        # row 1 empty: sequence (mean(1, 2, 3) + 0) / 2 = 1; token 6 / 3 = 2; constant 6 / (2 * 3) = 1
        ([[1, 1, 1], [0, 0, 0]], {"sequence": 1.0, "token": 2.0, "constant": 1.0}),
        # nothing valid: 0 everywhere, no 0/0
        ([[0, 0, 0], [0, 0, 0]], {"sequence": 0.0, "token": 0.0, "constant": 0.0}),
    ],
)
@pytest.mark.parametrize("mode", ["sequence", "token", "constant"])
def test_aggregate_with_empty_sequences(mask, expected, mode):
    value = aggregate(torch.tensor(GARBAGE), torch.tensor(mask), mode, max_tokens=3)  # int mask is fine
    assert value.item() == pytest.approx(expected[mode])


def test_aggregate_rejects_bad_input():
    with pytest.raises(ValueError, match="'sequence', 'token', 'constant'"):
        aggregate(torch.zeros(2, 3), MASK_2x3, "mean")
    with pytest.raises(ValueError, match="needs max_tokens"):
        aggregate(torch.zeros(2, 3), MASK_2x3, "constant")
    with pytest.raises(ValueError, match="mask has shape"):
        aggregate(torch.zeros(2, 4), MASK_2x3)


# ---------------------------------------------------------------------------------------------------------
# GSPO: sequence_log_ratio / gspo_token_log_ratio
# ---------------------------------------------------------------------------------------------------------


def test_sequence_log_ratio_is_the_mean_token_log_ratio_by_hand():
    # row 0: token ratios 2 and 1 -> log s = (log 2 + 0) / 2, s = sqrt(2); the masked third token is garbage
    # row 1: one token, ratio 1/4 -> s = 1/4; row 2: no valid token -> log s = 0
    logp = torch.tensor([[math.log(0.5), math.log(0.25), float("nan")], [math.log(0.1), 0.0, 0.0], [1.0, 2.0, 3.0]],
                        dtype=F64)  # fmt: skip
    old = torch.tensor([[math.log(0.25), math.log(0.25), 5.0], [math.log(0.4), 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    log_s = sequence_log_ratio(logp, old, mask)
    assert torch.allclose(log_s.exp(), torch.tensor([math.sqrt(2), 0.25, 1.0], dtype=F64))


def test_gspo_token_ratio_has_the_sequence_value_and_a_unit_gradient_per_token():
    logp = torch.tensor([[math.log(0.5), math.log(0.25), 0.0]], dtype=F64, requires_grad=True)
    old = torch.full((1, 3), math.log(0.25), dtype=F64)
    mask = torch.tensor([[True, True, False]])
    log_ratio = gspo_token_log_ratio(logp, old, mask)
    assert torch.allclose(log_ratio, torch.full((1, 3), math.log(2) / 2, dtype=F64))  # log s at every token
    # d/d logp of sum_t s_i,t over the valid tokens: s_i at each valid token (GSPO-token), 0 at the masked one
    (log_ratio.exp() * mask).sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[math.sqrt(2), math.sqrt(2), 0.0]], dtype=F64))
