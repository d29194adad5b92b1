"""What GRPO's rollout samples (algorithms/grpo/sampling.py): the refill decision and loop and their bounds, group
replacement, and the options in learn() with their TensorBoard tags; the truncated completions mask_truncated leaves
out (algorithms/grpo/advantages.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import grpo_gym
from algorithms import GRPO
from algorithms.common.rollout.rows import Rows
from algorithms.grpo.advantages import truncated_rows
from algorithms.grpo.sampling import dynamic_sampling, group_outcomes, refill_slots, replace_groups
from tests.sizes import ENV_KWARGS, TINY


# ---------------------------------------------------------------------------------------------- the refill loop
@pytest.mark.parametrize(
    ("uniform", "done", "rounds", "expected"),
    [([True, False, True], 0, 3, [0, 2]), ([True, False, True], 2, 3, [0, 2]), ([True, True], 3, 3, []),
     ([False, False], 0, 3, []), ([True], 0, 0, [])],
)  # fmt: skip
def test_refill_slots(uniform, done, rounds, expected) -> None:
    assert refill_slots(uniform, done, rounds) == expected


class FakeRounds:
    """``play`` that records the slots it is asked for and answers from a script (else: uniform again)."""

    def __init__(self, answers: list[list[bool]] | None = None) -> None:
        self.answers, self.asked = list(answers or []), []

    def __call__(self, slots: list[int]) -> list[bool]:
        self.asked.append(list(slots))
        return self.answers.pop(0) if self.answers else [True] * len(slots)


@pytest.mark.parametrize("max_rounds", [0, 1, 3, 5])
def test_the_refill_loop_never_exceeds_its_rounds(max_rounds: int) -> None:
    play = FakeRounds()  # every new group is uniform again: the rounds run out
    rounds, resampled = dynamic_sampling([True, False, True, True], play, max_rounds)
    assert rounds == len(play.asked) == max_rounds and resampled == 3 * max_rounds
    assert all(slots == [0, 2, 3] for slots in play.asked)


def test_the_refill_loop_stops_when_every_group_has_signal() -> None:
    play = FakeRounds([[False, True, False], [False]])
    assert dynamic_sampling([True, False, True, True], play, 10) == (2, 4)
    assert play.asked == [[0, 2, 3], [2]]
    nothing = FakeRounds()
    assert dynamic_sampling([False, False], nothing, 3) == (0, 0) and nothing.asked == []


# ---------------------------------------------------------------------------------------------- rows
def rows_of(episodes: list[int], tag: float, width: int = 3) -> Rows:
    rows = Rows()
    for e in episodes:
        tokens = th.full((width,), e)
        rows.add([e], 0, [tokens], (tokens[None], th.ones(1, width, dtype=th.bool)), th.zeros(1, width), [tag], [{}])
    return rows


def test_replace_groups_puts_the_new_groups_in_place() -> None:
    rows = rows_of(list(range(6)), 0.0)  # 3 groups of 2
    replace_groups(rows, rows_of([0, 1, 2, 3], 1.0), [2, 0], group_size=2)  # new group 0 -> slot 2, 1 -> slot 0
    assert rows.episodes == list(range(6)) and rows.rewards == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert [int(t[0]) for t in rows.tokens] == [2, 3, 2, 3, 0, 1]  # slot 0 holds new group 1, slot 2 new group 0


def test_truncated_rows_from_the_env_or_from_the_mask() -> None:
    rows = Rows()
    eos = 1
    tokens = th.tensor([[5, 6, 7], [5, 1, 0], [5, 6, 7]])
    masks = th.tensor([[True, True, True], [True, True, False], [True, True, True]])
    infos = [{}, {}, {"completion_clipped": False}]  # the env's word wins over the mask
    rows.add([0, 1, 2], 0, list(tokens), (tokens, masks), th.zeros(3, 3), [0.0] * 3, infos)
    assert truncated_rows(rows, [eos]) == [True, False, False]


# ---------------------------------------------------------------------------------------------- in learn()
def make_env(n_envs: int = 1) -> DummyVecEnv:
    return DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**ENV_KWARGS)) for _ in range(n_envs)])


def make_model(env=None, **kwargs) -> GRPO:
    defaults = {"n_groups": 2, "group_size": 4, "cold_start_kwargs": {"steps": 2, "batch_size": 4},  "seed": 0,
                "mixed_precision": "no", "policy_kwargs": TINY}  # fmt: skip
    return GRPO("TransformerPolicy", env or make_env(), **{**defaults, **kwargs})


OPTIONS = {
    "importance_level": "sequence",
    "clip_range": 3e-4,  # GSPO's paper's range, on the sequence ratio
    "dynamic_sampling": True,
    "max_resample_rounds": 2,
    "mask_truncated": True,
    "controls_kwargs": {"prompt_sampling": "learnability", "prompt_pool_size": 8, "fresh_prompt_fraction": 0.5},
}


def test_every_option_in_learn_logs_its_tags(tmp_path: Path) -> None:
    model = make_model(tensorboard_log=str(tmp_path), **OPTIONS)
    model.learn(16)
    events = EventAccumulator(str(tmp_path / "GRPO_1"), size_guidance={"scalars": 0}).Reload()
    scalars = {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    rounds, resampled = scalars["rollout/resample_rounds"], scalars["rollout/resampled_groups"]
    assert len(rounds) == model._iteration >= 1
    assert all(0 <= r <= 2 for r in rounds) and all(0 <= g <= 2 * 2 for g in resampled)
    assert model.num_timesteps == 8 * model._iteration + 4 * int(sum(resampled))  # refills are counted
    assert all(0 <= v <= 0.25 + 0.01 for v in scalars["rollout/prompt_priority_mean"])
    assert 0 < scalars["rollout/prompt_pool_size"][-1] <= 8
    assert all(0 <= v <= 1 for v in scalars["rollout/prompt_fresh_fraction"] + scalars["rollout/truncated_fraction"])
    assert 0 <= scalars["train/clip_fraction"][-1] <= 1
    assert scalars["train/clip_range"][-1] == pytest.approx(3e-4)  # the sequence ratio's


class RoundSpy(BaseCallback):
    """At each rollout's end: which of its final groups are uniform, and the refill rounds it logged."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[list[bool], float, float]] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        uniform, _ = group_outcomes(self.locals["rows"], self.model.n_groups, self.model.group_size, 1.0)
        logged = self.model.logger.name_to_value
        self.seen.append((uniform.tolist(), logged["rollout/resample_rounds"], logged["rollout/resampled_groups"]))


def test_refills_run_until_every_group_has_signal_or_the_rounds_are_spent() -> None:
    spy = RoundSpy()
    model = make_model(dynamic_sampling=True, max_resample_rounds=3, cold_start=False, seed=3)
    model.learn(40, callback=spy)
    for uniform, rounds, resampled in spy.seen:
        assert 0 <= rounds <= 3 and resampled <= 3 * model.n_groups
        assert not any(uniform) or rounds == 3  # a uniform group is left only when the rounds ran out
        assert (rounds == 0) == (resampled == 0)


def test_dynamic_sampling_needs_whole_groups_per_env() -> None:
    with pytest.raises(ValueError, match="group_size"):
        make_model(make_env(3), n_groups=3, group_size=4, dynamic_sampling=True)


def test_options_off_draw_the_same_problems_as_before() -> None:
    first, second = (
        make_model(cold_start=False),
        make_model(cold_start=False, mask_truncated=False, max_resample_rounds=7),
    )
    first.learn(8)
    second.learn(8)
    for p, q in zip(first.policy.parameters(), second.policy.parameters(), strict=True):
        assert th.equal(p, q)
