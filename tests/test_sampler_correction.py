"""The sampler/trainer mismatch (algorithms.common.sampler_correction): the TIS weights and the sampler KL against
hand math, the loss they weight, ``"auto"`` when sampling and update run in different precisions (float32 sampling
and a bf16 update, asked for per stage), and float32's zero."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from algorithms.common import sampler_correction
from algorithms.common.losses import sampler_kl
from algorithms.common.runtime.precision import STAGES, PrecisionChoice
from algorithms.common.sampler_correction import (
    correct_fresh_rollout,
    corrected,
    masked_fraction,
    masked_sequence_weights,
    resolve_sampler_correction,
    truncated_importance_weights,
)
from algorithms.grpo.update import grpo_loss
from tests import test_replay
from tests.test_grpo import make_model
from tests.test_ppo import make_model as make_ppo
from tests.test_precision import MIXED

# the sampler's and the update's log-probs of three sampled tokens of one completion, and a fourth one masked out
SAMPLER = torch.tensor([[math.log(0.5), math.log(0.1), math.log(0.4), 0.0]])
UPDATE = torch.tensor([[math.log(0.6), math.log(0.3), math.log(0.2), 5.0]])
MASK = torch.tensor([[True, True, True, False]])


def scalars(folder: Path, tag: str, run: str = "GRPO_1") -> list[float]:
    events = EventAccumulator(str(folder / run), size_guidance={"scalars": 0}).Reload()
    return [event.value for event in events.Scalars(tag)]


def test_truncated_importance_weights_by_hand():
    weights = truncated_importance_weights(UPDATE, SAMPLER, MASK, cap=2.0)
    # pi_old / pi_sampler: 0.6 / 0.5 = 1.2; 0.3 / 0.1 = 3 -> capped at 2; 0.2 / 0.4 = 0.5; masked -> 0
    assert torch.allclose(weights, torch.tensor([[1.2, 2.0, 0.5, 0.0]]), atol=1e-6)
    assert not weights.requires_grad
    assert truncated_importance_weights(UPDATE, SAMPLER, MASK, cap=4.0)[0, 1].item() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_importance_weights(UPDATE, SAMPLER, MASK, cap=0.0)


def test_masked_sequence_weights_by_hand():
    """Each sequence weighted by its whole ratio; one above the cap left out (TRL's sequence_mask)."""
    sampler = torch.cat([SAMPLER, SAMPLER, torch.zeros(1, 4)])
    update = torch.cat([UPDATE, torch.tensor([[math.log(0.5), math.log(0.1), math.log(0.1), 0.0]]), torch.zeros(1, 4)])
    mask = torch.cat([MASK, MASK, torch.zeros(1, 4, dtype=torch.bool)])
    weights = masked_sequence_weights(update, sampler, mask, cap=2.0)
    # row 0: (0.6 / 0.5) (0.3 / 0.1) (0.2 / 0.4) = 1.2 * 3 * 0.5 = 1.8 <= 2: kept, 1.8 at each valid token
    # row 1: 1 * 1 * 0.25 = 0.25: kept (no lower bound); row 2: no valid token: 0
    assert torch.allclose(weights, torch.tensor([[1.8, 1.8, 1.8, 0.0], [0.25, 0.25, 0.25, 0.0], [0.0] * 4]), atol=1e-6)
    assert masked_sequence_weights(update, sampler, mask, cap=1.5)[0].abs().sum() == 0  # 1.8 > 1.5: left out
    assert not weights.requires_grad
    with pytest.raises(ValueError, match="must be > 0"):
        masked_sequence_weights(update, sampler, mask, cap=0.0)


def test_the_mask_correction_and_its_left_out_share():
    batch = test_replay._batch(2, 3, 4)
    logp = batch.old_log_probs.clone()
    logp[0, 0] += 2.0  # row 0's ratio e^2 > cap: left out; row 1's is 1
    out = corrected(batch, logp, cap=2.0, mode="mask")
    valid = batch.completion_mask
    assert (out.sampler_weights[0] == 0).all() and torch.allclose(out.sampler_weights[1][valid[1]], torch.ones(1))
    assert torch.equal(out.old_log_probs, logp) and masked_fraction(out) == 0.5
    assert masked_fraction(corrected(batch, logp, cap=10.0, mode="mask")) == 0.0


def test_auto_corrects_every_external_engine():
    same = PrecisionChoice("no", dict.fromkeys(STAGES, "no"), "forced")
    assert resolve_sampler_correction("auto", same, "builtin") is None
    assert resolve_sampler_correction("auto", same, "hf") == "tis" == resolve_sampler_correction("auto", same, "vllm")
    assert resolve_sampler_correction("mask", same, "builtin") == "mask"


def test_sampler_kl_is_the_mean_k3_over_the_sampled_tokens():
    # k3 with r = pi_update / pi_sampler: r - 1 - log r, averaged over the 3 valid tokens
    expected = sum(r - 1 - math.log(r) for r in (1.2, 3.0, 0.5)) / 3
    assert sampler_kl(UPDATE, SAMPLER, MASK).item() == pytest.approx(expected, rel=1e-5)
    assert sampler_kl(SAMPLER, SAMPLER, MASK).item() == 0.0


def test_the_weights_scale_each_tokens_surrogate():
    logp = UPDATE.clone().requires_grad_(True)
    advantages = torch.tensor([1.0])
    weights = torch.tensor([[1.2, 2.0, 0.5, 7.0]])  # the masked token's weight is never used
    kwargs = {"clip_low": 0.2, "aggregation": "token"}
    loss, _ = grpo_loss(logp, UPDATE, None, advantages, MASK, sampler_weights=weights, **kwargs)
    # ratio 1 at every token (old = the update's own): each token's loss is -w * A, the mean over 3 tokens
    assert loss.item() == pytest.approx(-(1.2 + 2.0 + 0.5) / 3, rel=1e-6)
    loss.backward()
    assert torch.allclose(logp.grad, -torch.tensor([[1.2, 2.0, 0.5, 0.0]]) / 3, atol=1e-6)
    unweighted, _ = grpo_loss(UPDATE, UPDATE, None, advantages, MASK, **kwargs)
    assert unweighted.item() == pytest.approx(-1.0)


def test_auto_turns_the_correction_on_exactly_when_the_stages_differ():
    mixed = PrecisionChoice(MIXED, MIXED, "chosen per stage")
    same = PrecisionChoice("bf16", dict.fromkeys(STAGES, "bf16"), "forced")
    assert resolve_sampler_correction("auto", mixed) == "tis" and resolve_sampler_correction("auto", same) is None
    assert resolve_sampler_correction("tis", same) == "tis" and resolve_sampler_correction(None, mixed) is None


def test_mixed_stages_are_corrected_and_the_mismatch_logged(monkeypatch, tmp_path: Path):
    """Sampling in float32 and updating in bf16: ``auto`` turns the correction on and the mismatch is logged. Two
    minibatches: the update's own log-probs come from a pass before the first step."""
    model = make_model(mixed_precision=MIXED, tensorboard_log=str(tmp_path), cold_start=False, batch_size=4)
    assert model.precision.stages == MIXED
    assert model._sampler_correction == "tis"
    corrected = []

    def correct(policy, batch, cap, mode):  # the update's own log-probs before the first step, and the TIS weights
        corrected.append((batch, *correct_fresh_rollout(policy, batch, cap, mode)))
        return corrected[-1][1:]

    monkeypatch.setattr(sampler_correction, "correct_fresh_rollout", correct)
    model.learn(16)
    kl = scalars(tmp_path, "train/sampler_kl")
    assert len(kl) == 2 and all(0 < value < 0.1 for value in kl)  # bf16 rounding: small, never exactly 0
    assert [value.item() for *_, value in corrected] == pytest.approx(kl, rel=1e-5)
    for sampled, fresh, _ in corrected:
        mask = sampled.completion_mask
        assert not torch.equal(fresh.old_log_probs[mask], sampled.old_log_probs[mask])  # the update's, in bf16
        weights = fresh.sampler_weights[mask]
        assert ((weights > 0) & (weights <= 2.0)).all() and (weights != 1).any()
        assert (fresh.sampler_weights[~mask] == 0).all()


def test_mixed_stages_without_the_correction_run_as_asked():
    model = make_model(mixed_precision=MIXED, sampler_correction=None, cold_start=False)
    assert model._sampler_correction is None and model.precision.stages == MIXED


@pytest.mark.parametrize("sampler_correction", [None, "tis"])
def test_the_sampler_kl_is_zero_in_float32(tmp_path: Path, sampler_correction):
    model = make_model(mixed_precision="no", sampler_correction=sampler_correction, tensorboard_log=str(tmp_path))
    assert model._sampler_correction == sampler_correction
    model.learn(16)
    kl = scalars(tmp_path, "train/sampler_kl")
    assert len(kl) == 2 and all(abs(value) < 1e-9 for value in kl)  # float rounding only (the decoder's KV cache)


def test_the_mask_correction_trains_and_logs_its_share(tmp_path: Path):
    model = make_model(sampler_correction="mask", mixed_precision="no", tensorboard_log=str(tmp_path))
    model.learn(16)
    assert scalars(tmp_path, "train/sampler_masked_fraction") == [0.0, 0.0]  # float32: every ratio 1
    ppo = make_ppo(sampler_correction="mask", mixed_precision="no", cold_start=False)
    ppo.learn(8)
    assert ppo._rollout.sampler_weights is not None


def test_the_correction_arguments_are_checked():
    with pytest.raises(ValueError, match="sampler_correction"):
        make_model(sampler_correction="is")
    with pytest.raises(ValueError, match="sampler_correction_cap"):
        make_model(sampler_correction_cap=0.5)


@pytest.mark.parametrize("stages", ["mixed", "float32"])
def test_lmppo_measures_and_corrects_the_mismatch_from_its_value_pass(monkeypatch, tmp_path: Path, stages):
    """LMPPO takes the update's log-probs from the forward pass that computes its values (no extra pass)."""
    precision = MIXED if stages == "mixed" else "no"
    model = make_ppo(tensorboard_log=str(tmp_path), cold_start=False, mixed_precision=precision)
    assert model._sampler_correction == ("tis" if stages == "mixed" else None)
    model.learn(8)
    batch = model._rollout
    kl = scalars(tmp_path, "train/sampler_kl", run="LMPPO_1")
    assert len(kl) == 2
    if stages == "mixed":
        assert all(0 < value < 0.1 for value in kl) and batch.sampler_weights is not None
    else:
        assert all(abs(value) < 1e-9 for value in kl) and batch.sampler_weights is None


def test_replayed_rows_join_a_corrected_rollout_with_weight_one(tmp_path: Path):
    """Replayed rows were sampled by older weights: the correction is the fresh rollout's; they get weight 1."""
    fresh = test_replay._batch(2, 3, 4, sampler_weights=torch.full((2, 4), 0.5))
    replayed = test_replay._batch(1, 5, 2, weights=torch.tensor([0.5]), slots=torch.tensor([9]))
    both = fresh.concat(replayed)
    assert both.sampler_weights.tolist() == [[0.5] * 4, [0.5] * 4, [1.0, 1.0, 0.0, 0.0]]
    model = make_model(
        controls_kwargs={"replay_ratio": 0.5},
        sampler_correction="tis",
        mixed_precision="no",
        tensorboard_log=str(tmp_path),
    )
    model.learn(8 * 3)  # a corrected fresh rollout with replayed rows in the last two updates
    assert len(scalars(tmp_path, "train/sampler_kl")) == 3


@pytest.mark.parametrize("mode", ["tis", "mask"])
def test_one_step_updates_take_the_correction_from_their_own_pass(monkeypatch, tmp_path: Path, mode):
    """One epoch, one minibatch: ``pi_old`` is the weights before the one step, so the correction comes from the
    update's own forward pass (no pass before it) and trains the same weights as with that pass, up to rounding."""
    passes = []
    monkeypatch.setattr(sampler_correction, "correct_fresh_rollout", lambda *a: passes.append(1) or None)
    model = make_model(mixed_precision=MIXED, sampler_correction=mode, cold_start=False, tensorboard_log=str(tmp_path))
    assert model._corrects_in_pass()
    model.learn(16)
    assert not passes  # no pass before the step
    tag = "train/sampler_clipped_fraction" if mode == "tis" else "train/sampler_masked_fraction"
    assert len(scalars(tmp_path, tag)) == 2 and len(scalars(tmp_path, "train/sampler_kl")) == 2
    monkeypatch.undo()
    before = make_model(mixed_precision=MIXED, sampler_correction=mode, cold_start=False)
    monkeypatch.setattr(type(before), "_corrects_in_pass", lambda self: False)  # the pass before the step
    before.learn(16)
    for ours, theirs in zip(model.policy.parameters(), before.policy.parameters(), strict=True):
        assert torch.allclose(ours, theirs, atol=1e-6)
