"""Learnability-prioritised prompts (algorithms/common/rollout/prompt_pool.py): the priority, the mix of fresh and
pooled problems, the sampling frequencies (a chi-square test), the estimates and the saved state."""

from __future__ import annotations

import json

import numpy as np
import pytest

from algorithms.common.rollout.prompt_pool import PRIORITY_FLOOR, LearnabilityPool, learnability, pool_draw_count

#: chi-square critical values at significance 0.001 (tabulated), by degrees of freedom
CHI2_CRITICAL_0_001 = {5: 20.515}


def fresh_keys(start: int = 1000):
    counter = iter(range(start, 10**6))
    return lambda m: [{"seed": next(counter)} for _ in range(m)]


def filled(estimates: list[float], capacity: int = 16, **kwargs) -> LearnabilityPool:
    pool = LearnabilityPool(capacity, **kwargs)
    pool.observe([((-1, {"seed": i}), p) for i, p in enumerate(estimates)])
    return pool


def test_learnability_is_the_bernoulli_variance() -> None:
    assert learnability([0.0, 0.5, 1.0, 0.2]).tolist() == pytest.approx([0.0, 0.25, 0.0, 0.16])


@pytest.mark.parametrize(
    ("n", "fraction", "size", "expected"),
    [(8, 0.25, 100, 6), (8, 0.25, 3, 3), (8, 0.0, 100, 8), (8, 1.0, 100, 0), (4, 0.5, 0, 0), (3, 0.25, 10, 2)],
)
def test_pool_draw_count(n: int, fraction: float, size: int, expected: int) -> None:
    assert pool_draw_count(n, fraction, size) == expected


def test_a_draw_mixes_distinct_pool_entries_and_fresh_problems() -> None:
    pool = filled([0.5] * 10, fresh_fraction=0.25, seed=0)
    entries = pool.draw(8, fresh_keys())
    slots = [slot for slot, _ in entries]
    assert len(entries) == 8 and slots[6:] == [-1, -1] and len(set(slots[:6])) == 6  # without replacement
    assert all(key == {"seed": slot} for slot, key in entries[:6]) and entries[6][1] == {"seed": 1000}
    assert np.isclose(pool.priorities().sum(), 10 * (0.25 + PRIORITY_FLOOR))  # drawn entries keep their priority
    empty = LearnabilityPool(4, fresh_fraction=0.0, seed=0)
    assert [slot for slot, _ in empty.draw(3, fresh_keys())] == [-1, -1, -1]  # nothing pooled yet: all fresh


def test_sampling_frequencies_follow_the_priorities_chi_square() -> None:
    estimates = [0.0, 0.1, 0.3, 0.5, 0.8, 1.0]
    pool = filled(estimates, fresh_fraction=0.0, seed=123)
    draws = 12_000
    counts = np.bincount([pool.draw(1, fresh_keys())[0][0] for _ in range(draws)], minlength=len(estimates))
    priority = learnability(estimates) + PRIORITY_FLOOR
    expected = draws * priority / priority.sum()
    statistic = float(((counts - expected) ** 2 / expected).sum())
    assert statistic < CHI2_CRITICAL_0_001[len(estimates) - 1], (counts, expected)
    uniform = np.full(len(estimates), draws / len(estimates))  # the test has power: uniform sampling is rejected
    assert float(((counts - uniform) ** 2 / uniform).sum()) > CHI2_CRITICAL_0_001[len(estimates) - 1]


def test_estimates_follow_observations_and_the_oldest_entry_leaves() -> None:
    pool = filled([0.0, 1.0], capacity=3)
    pool.observe([((0, {"seed": 0}), 1.0), ((1, {"seed": 99}), 0.0)])  # slot 1 no longer holds seed 99: ignored
    assert pool.success[:2].tolist() == [0.5, 1.0]
    pool.observe([((-1, {"seed": 7}), 0.25), ((-1, {"seed": 8}), 0.75)])  # full after seed 7: seed 8 replaces slot 0
    assert pool.keys == [{"seed": 8}, {"seed": 1}, {"seed": 7}] and pool.size == 3
    expected = [0.1875 + PRIORITY_FLOOR, PRIORITY_FLOOR, 0.1875 + PRIORITY_FLOOR]
    assert pool.priorities().tolist() == pytest.approx(expected)


def test_the_state_is_json_and_restores_the_same_draws() -> None:
    pool = filled([0.2, 0.4, 0.6, 0.9], capacity=8, seed=5)
    pool.draw(2, fresh_keys())
    state = json.loads(json.dumps(pool.get_state()))
    copy = LearnabilityPool(8, seed=99)
    copy.set_state(state)
    assert pool.draw(3, fresh_keys()) == copy.draw(3, fresh_keys())
    with pytest.raises(ValueError, match="slots"):
        LearnabilityPool(4).set_state(state)


def test_bad_pool_arguments_are_refused() -> None:
    for kwargs in ({"capacity": 0}, {"fresh_fraction": 1.5}, {"floor": 0.0}):
        with pytest.raises(ValueError, match="capacity"):
            LearnabilityPool(**kwargs)
