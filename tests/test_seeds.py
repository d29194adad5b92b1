"""The job-wide randomness of rollouts (algorithms/common/runtime/seeds.py): each rollout's sampler noise comes from
``(seed, iteration)`` alone, and no two runs or iterations share a noise stream."""

from __future__ import annotations

import torch as th

from algorithms.common.runtime.seeds import RolloutSeeds


def noise(seed: int, iteration: int, refill: int = 0) -> th.Tensor:
    seeds = RolloutSeeds(seed, th.device("cpu"))
    seeds.reseed_for_rollout(iteration) if refill == 0 else seeds.reseed_for_refill(iteration, refill)
    return th.rand(64, generator=seeds.generator)


def test_a_rollouts_noise_depends_on_the_seed_and_the_iteration_only():
    assert th.equal(noise(3, 5), noise(3, 5))
    keys = [(seed, iteration, refill) for seed in range(4) for iteration in range(4) for refill in range(2)]
    streams = {key: noise(*key) for key in keys}
    for a in keys:
        for b in keys:
            if a < b:  # seed s's iteration t + 1 once drew seed s + 1's iteration t noise (seed + 1 + iteration)
                assert not th.equal(streams[a], streams[b]), (a, b)


def test_the_problem_stream_is_the_seeds_numpy_generator():
    first, again = RolloutSeeds(7, th.device("cpu")), RolloutSeeds(7, th.device("cpu"))
    assert first.problem_keys(3) == again.problem_keys(3)
    assert first.problem_keys(3) != RolloutSeeds(8, th.device("cpu")).problem_keys(3)
