"""GRPO's objective against numbers worked out by hand: its advantages (algorithms/grpo/advantages.py) and its loss,
grpo_loss (algorithms/grpo/update.py; the rest of the update: tests/test_update.py)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from algorithms.common.advantages import group_advantages, leave_one_out_advantages, uniform_group_mask
from algorithms.common.losses import aggregate, clipped_surrogate, kl_k3
from algorithms.grpo.update import grpo_loss

F64 = torch.float64
MASK_2x3 = torch.tensor([[True, True, True], [True, False, False]])

# ---------------------------------------------------------------------------------------------------------
# group_advantages / uniform_group_mask
# ---------------------------------------------------------------------------------------------------------

# Group 0 = [1, 0, 0, 0]: mean 1/4, centred [3/4, -1/4, -1/4, -1/4],
#   unbiased var = (9/16 + 3 * 1/16) / 3 = 1/4, std = 1/2  -> group-scaled [3/2, -1/2, -1/2, -1/2].
# Group 1 = [1, 1, 0, 0]: mean 1/2, centred [1/2, 1/2, -1/2, -1/2],
#   unbiased var = (4 * 1/4) / 3 = 1/3, std = 1/sqrt(3) -> group-scaled ±sqrt(3)/2 = ±0.8660.
# Batch: all 8 rewards, mean 3/8; squared deviations 3 * (5/8)^2 + 5 * (3/8)^2 = 120/64,
#   unbiased var = (120/64) / 7 = 15/56, std = sqrt(15/56) = 0.517549 -> centred / 0.517549.
REWARDS_2x4 = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
CENTRED_2x4 = [[0.75, -0.25, -0.25, -0.25], [0.5, 0.5, -0.5, -0.5]]
S3 = math.sqrt(3) / 2
BATCH_STD = math.sqrt(15 / 56)


@pytest.mark.parametrize(
    "scale, expected",
    [
        ("group", [[1.5, -0.5, -0.5, -0.5], [S3, S3, -S3, -S3]]),
        ("batch", [[c / BATCH_STD for c in row] for row in CENTRED_2x4]),
        ("none", CENTRED_2x4),
    ],
)
def test_group_advantages_by_hand(scale, expected):
    advantages = group_advantages(torch.tensor(REWARDS_2x4, dtype=F64), scale=scale, eps=0.0)
    torch.testing.assert_close(advantages, torch.tensor(expected, dtype=F64))


def test_group_advantages_default_eps_is_added_to_std():
    # group 0: 0.75 / (0.5 + 1e-4) = 1.49970006
    advantages = group_advantages(torch.tensor(REWARDS_2x4, dtype=F64))
    assert advantages[0, 0].item() == pytest.approx(0.75 / 0.5001, rel=1e-12)


def test_group_advantages_zero_mean_unit_std_per_group():
    rewards = torch.randn(5, 8, generator=torch.Generator().manual_seed(0), dtype=F64)
    advantages = group_advantages(rewards, eps=0.0)
    torch.testing.assert_close(advantages.mean(dim=1), torch.zeros(5, dtype=F64))
    torch.testing.assert_close(advantages.std(dim=1), torch.ones(5, dtype=F64))


# 0.4900934100151062 in float32, three times: the float32 mean is 1 ulp off, so r - mean != 0 and
# (r - mean) / (std + eps) would be about 6e-4, not 0 (and garbage with eps=0).
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("eps", [1e-4, 0.0])
@pytest.mark.parametrize("value", [0.0, 1.0, -0.3, 0.4900934100151062])
def test_all_equal_group_gives_exact_zeros(scale, eps, value):
    rewards = torch.tensor([[value] * 3, [1.0, 0.0, 0.5]])
    advantages = group_advantages(rewards, scale=scale, eps=eps)
    assert torch.equal(advantages[0], torch.zeros(3))
    assert torch.isfinite(advantages).all() and (advantages[1] != 0).any()


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("num_groups", [1, 3])
def test_single_completion_groups_give_zeros_without_warning(scale, num_groups):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's std() warns about degrees of freedom <= 0
        advantages = group_advantages(torch.arange(num_groups, dtype=F64).unsqueeze(1), scale=scale)
    assert torch.equal(advantages, torch.zeros(num_groups, 1, dtype=F64))


def test_integer_rewards_are_accepted():
    advantages = group_advantages(torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0]]), scale="none")
    torch.testing.assert_close(advantages, torch.tensor(CENTRED_2x4))


@pytest.mark.parametrize(
    "rewards, kwargs, match",
    [
        (torch.ones(2, 3), {"scale": "std"}, "'group', 'batch', 'none'"),
        (torch.tensor([[1.0, float("nan")]]), {}, "NaN or inf"),
        (torch.tensor([[1.0, float("inf")]]), {}, "NaN or inf"),
        (torch.ones(6), {}, r"shape \(K, G\)"),
    ],
)
def test_group_advantages_rejects_bad_input(rewards, kwargs, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards, **kwargs)


@pytest.mark.parametrize(
    "atol, expected",
    [
        # spreads (max - min): 0, 1, 0, 0.05, 0 (one completion)
        (0.0, [True, False, True, False]),
        (0.1, [True, False, True, True]),
    ],
)
def test_uniform_group_mask(atol, expected):
    rewards = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [0.5, 0.5, 0.5], [1.0, 1.05, 1.0]])
    assert uniform_group_mask(rewards, atol=atol).tolist() == expected
    assert uniform_group_mask(torch.tensor([[0.3], [0.7]])).tolist() == [True, True]


# ---------------------------------------------------------------------------------------------------------
# grpo_loss
# ---------------------------------------------------------------------------------------------------------


def test_grpo_loss_by_hand():
    # Row 0 (A = +1): token 0 ratio 1.5 -> clipped at 1.2, loss -1.2; token 1 ratio 1 -> loss -1.
    # Row 1 (A = -1): token 0 ratio 1 -> loss +1; token 1 is padding (NaN everywhere).
    # sequence: (mean(-1.2, -1) + 1) / 2 = (-1.1 + 1) / 2 = -0.05
    # clip_fraction: 1 of 3 valid tokens; approx_kl: (1.5 - 1) - log 1.5 = 0.0945349 on 1 of 3 tokens.
    nan = float("nan")
    logp = torch.tensor([[math.log(1.5) - 1, -2.0], [-0.5, nan]], dtype=F64, requires_grad=True)
    old_logp = torch.tensor([[-1.0, -2.0], [-0.5, nan]], dtype=F64)
    mask = torch.tensor([[True, True], [True, False]])
    loss, stats = grpo_loss(logp, old_logp, None, torch.tensor([1.0, -1.0], dtype=F64), mask, clip_low=0.2)
    assert loss.item() == pytest.approx(-0.05, rel=1e-12)
    assert stats["policy_loss"].item() == pytest.approx(-0.05, rel=1e-12)
    assert stats["clip_fraction"].item() == pytest.approx(1 / 3)
    assert stats["approx_kl"].item() == pytest.approx((0.5 - math.log(1.5)) / 3, rel=1e-12)
    assert stats["kl"].item() == 0.0 and "entropy" not in stats
    loss.backward()
    # gradient: clipped token 0, on-policy token 1 gets -A * ratio / (2 * 2) = -1/4,
    # row 1 token 0 gets +1 / (2 * 1) = 1/2, padding 0
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.25], [0.5, 0.0]], dtype=F64))


@pytest.mark.parametrize("aggregation", ["sequence", "token", "constant"])
@pytest.mark.parametrize("clip_high", [None, 0.28])
def test_grpo_loss_is_the_sum_of_its_parts(aggregation, clip_high):
    gen = torch.Generator().manual_seed(0)
    shape = (4, 6)
    logp = -torch.rand(shape, generator=gen, dtype=F64) * 3
    old_logp = logp + torch.randn(shape, generator=gen, dtype=F64) * 0.3
    ref_logp = logp + torch.randn(shape, generator=gen, dtype=F64) * 0.3
    entropy = torch.rand(shape, generator=gen, dtype=F64) * 2
    advantages = torch.randn(4, generator=gen, dtype=F64)
    mask = torch.arange(6).unsqueeze(0) < torch.tensor([[6], [3], [1], [5]])  # lengths 6, 3, 1, 5
    beta, ent_coef = 0.04, 0.01
    loss, stats = grpo_loss(
        logp, old_logp, ref_logp, advantages, mask, clip_low=0.2, clip_high=clip_high, beta=beta,
        ent_coef=ent_coef, entropy=entropy, aggregation=aggregation, max_tokens=8,
    )  # fmt: skip
    pg, _, clipped = clipped_surrogate(logp, old_logp, advantages, 0.2, clip_high)
    k3 = kl_k3(logp, ref_logp)
    parts = [aggregate(x, mask, aggregation, max_tokens=8) for x in (pg, k3, entropy)]
    torch.testing.assert_close(loss, parts[0] + beta * parts[1] - ent_coef * parts[2])
    torch.testing.assert_close(stats["policy_loss"], parts[0])
    torch.testing.assert_close(stats["kl"], k3[mask].mean())
    torch.testing.assert_close(stats["entropy"], entropy[mask].mean())
    torch.testing.assert_close(stats["clip_fraction"], clipped[mask].to(F64).mean())
    assert all(not s.requires_grad and s.dim() == 0 for s in stats.values())


def test_grpo_loss_garbage_in_masked_positions_keeps_loss_and_gradient_finite():
    gen = torch.Generator().manual_seed(1)
    mask = torch.tensor([[True, True, False, False], [True, True, True, False]])

    def with_garbage(x: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, x, torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30]))

    clean = -torch.rand(2, 4, generator=gen)
    logp = with_garbage(clean).requires_grad_()
    entropy = with_garbage(torch.rand(2, 4, generator=gen)).requires_grad_()
    kwargs = {"clip_low": 0.2, "beta": 0.1, "ent_coef": 0.01, "aggregation": "token"}
    args = (with_garbage(clean + 0.1), with_garbage(clean - 0.2), torch.tensor([1.0, -1.0]), mask)
    loss, stats = grpo_loss(logp, *args, entropy=entropy, **kwargs)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(s) for s in stats.values())
    assert torch.isfinite(logp.grad).all() and torch.isfinite(entropy.grad).all()
    assert (logp.grad[~mask] == 0).all() and (entropy.grad[~mask] == 0).all()
    # and the value equals the one computed from clean inputs
    clean_loss, _ = grpo_loss(
        clean, clean + 0.1, clean - 0.2, *args[2:], entropy=torch.where(mask, entropy.detach(), 0.0), **kwargs
    )
    torch.testing.assert_close(loss.detach(), clean_loss)


def test_grpo_loss_kl_stat_is_zero_without_beta():
    logp = torch.zeros(1, 2)
    _, stats = grpo_loss(logp, logp, logp - 1.0, torch.ones(1), torch.ones(1, 2, dtype=torch.bool), clip_low=0.2)
    assert stats["kl"].item() == 0.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"beta": 0.04}, "needs ref_logp"),
        ({"beta": -0.04}, "beta must be >= 0"),
        ({"ent_coef": 0.01}, "needs entropy"),
        ({"aggregation": "constant"}, "needs max_tokens"),
        ({"aggregation": "seq"}, "aggregation mode must be one of"),
    ],
)
def test_grpo_loss_rejects_bad_arguments(kwargs, match):
    logp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=match):
        grpo_loss(logp, logp, None, torch.ones(2), MASK_2x3, clip_low=0.2, **kwargs)


# ---------------------------------------------------------------------------------------------------------
# grpo_loss, importance_level="sequence" (GSPO)
# ---------------------------------------------------------------------------------------------------------
# Row 0: token ratios 2 and 1 -> s_0 = sqrt(2) ~ 1.4142; row 1: token ratios 1 and 1 (+ a masked token) -> s_1 = 1.
GSPO_LOGP = [[math.log(0.5), math.log(0.25), 0.0], [math.log(0.3), math.log(0.2), 7.0]]
GSPO_OLD = [[math.log(0.25), math.log(0.25), 0.0], [math.log(0.3), math.log(0.2), -7.0]]
GSPO_MASK = torch.tensor([[True, True, False], [True, True, False]])


def gspo(advantages, clip_low, clip_high=None, aggregation="sequence"):
    logp = torch.tensor(GSPO_LOGP, dtype=F64, requires_grad=True)
    loss, stats = grpo_loss(
        logp, torch.tensor(GSPO_OLD, dtype=F64), None, torch.tensor(advantages, dtype=F64), GSPO_MASK,
        clip_low=clip_low, clip_high=clip_high, aggregation=aggregation, importance_level="sequence",
    )  # fmt: skip
    loss.backward()
    return loss, stats, logp.grad


def test_gspo_loss_unclipped_by_hand():
    # wide clip: loss = mean_i -(s_i A_i) = -(sqrt(2) * 1 + 1 * (-1)) / 2;
    # gradient at token t of row i: -s_i A_i / |y_i| / B
    loss, stats, grad = gspo([1.0, -1.0], clip_low=10.0)
    assert loss.item() == pytest.approx(-(math.sqrt(2) - 1) / 2)
    expected = torch.tensor([[-math.sqrt(2) / 4, -math.sqrt(2) / 4, 0.0], [0.25, 0.25, 0.0]], dtype=F64)
    assert torch.allclose(grad, expected)
    assert stats["clip_fraction"].item() == 0.0


def test_gspo_clips_whole_sequences_with_zero_gradient_there():
    # eps 3e-4 / 4e-4: s_0 = 1.414 > 1 + 4e-4 with A > 0 -> clipped (loss -(1 + 4e-4) A, no gradient);
    # s_1 = 1 is inside the range -> unclipped. Sequence-level clip fraction: 1 of 2 sequences.
    loss, stats, grad = gspo([1.0, 2.0], clip_low=3e-4, clip_high=4e-4)
    assert loss.item() == pytest.approx(-((1 + 4e-4) * 1.0 + 1.0 * 2.0) / 2)
    assert torch.all(grad[0] == 0) and torch.allclose(grad[1, :2], torch.full((2,), -2.0 / 2 / 2, dtype=F64))
    assert stats["clip_fraction"].item() == pytest.approx(0.5)


def test_gspo_does_not_clip_a_high_ratio_with_a_negative_advantage():
    # A < 0 and s > 1 + eps: min(s A, clip(s) A) = s A (the pessimistic one), the gradient flows
    loss, stats, grad = gspo([-1.0, 0.0], clip_low=3e-4, clip_high=4e-4)
    assert loss.item() == pytest.approx(math.sqrt(2) / 2)
    assert torch.allclose(grad[0, :2], torch.full((2,), math.sqrt(2) / 2 / 2, dtype=F64))
    assert stats["clip_fraction"].item() == 0.0


def test_gspo_below_the_lower_clip_with_a_negative_advantage_is_clipped():
    logp = torch.tensor([[math.log(0.2)]], dtype=F64, requires_grad=True)  # s = 0.2 / 0.4 = 0.5 < 1 - 3e-4
    old, advantage = torch.tensor([[math.log(0.4)]], dtype=F64), torch.tensor([-1.0], dtype=F64)
    kwargs = {"clip_low": 3e-4, "clip_high": 4e-4, "importance_level": "sequence"}
    loss, stats = grpo_loss(logp, old, None, advantage, torch.tensor([[True]]), **kwargs)
    loss.backward()
    assert loss.item() == pytest.approx(1 - 3e-4) and logp.grad.item() == 0.0 and stats["clip_fraction"] == 1.0


def test_token_level_is_the_default_and_unchanged():
    logp = torch.tensor(GSPO_LOGP, dtype=F64)
    args = (logp, torch.tensor(GSPO_OLD, dtype=F64), None, torch.tensor([1.0, -1.0], dtype=F64), GSPO_MASK)
    default, _ = grpo_loss(*args, clip_low=0.2)
    token, _ = grpo_loss(*args, clip_low=0.2, importance_level="token")
    # token ratios 2 (clipped to 1.2 with A = 1) and 1: row 0 -(1.2 + 1) / 2, row 1 +(1 + 1) / 2
    assert default.item() == token.item() == pytest.approx((-(1.2 + 1) / 2 + 1) / 2)
    with pytest.raises(ValueError, match="importance_level"):
        grpo_loss(*args, clip_low=0.2, importance_level="episode")


def test_leave_one_out_advantages_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5], [3.0, 1.0, 2.0, 2.0]])
    # row 0: the baseline of a 1 is (0 + 0 + 1) / 3, of a 0 is 2 / 3; row 1: uniform, exactly 0
    # row 2: 3 - 5/3 = 4/3, 1 - 7/3 = -4/3, 2 - 2 = 0
    expected = torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3], [0.0] * 4, [4 / 3, -4 / 3, 0.0, 0.0]])
    advantages = leave_one_out_advantages(rewards)
    torch.testing.assert_close(advantages, expected)
    assert bool((advantages[1] == 0).all())
    torch.testing.assert_close(advantages, 4 / 3 * group_advantages(rewards, scale="none"))
    with pytest.raises(ValueError, match="at least 2"):
        leave_one_out_advantages(torch.ones(3, 1))
