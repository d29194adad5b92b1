"""The job-wide randomness of rollouts: which problems each iteration draws and the sampler's noise.

Every rank holds the same :class:`RolloutSeeds` (one seed for the whole job), so the problems and the sampled
tokens of group ``k`` at iteration ``t`` do not depend on the number of processes: every rank draws the problem
keys of all K groups and plays its own, and the sampler is reseeded from ``(seed, iteration)`` at the start of every
rollout (and from ``(seed, iteration, round)`` for each refill round of dynamic sampling).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th


class RolloutSeeds:
    """The problem stream (a numpy ``Generator``) and the sampler's torch ``Generator`` of a run.

    :param seed: the job's seed (the same on every rank)
    :param device: where the sampler's generator lives (the policy's device)
    """

    def __init__(self, seed: int, device: th.device) -> None:
        self.seed = int(seed)
        self.generator = th.Generator(device=device)
        self.generator.manual_seed(self.seed)
        self.problems = np.random.default_rng(self.seed)

    def problem_keys(self, n: int) -> list[dict[str, Any]]:
        """The ``sample_problem`` arguments of the next ``n`` problems: a fresh seed each, the same on every rank."""
        return [{"seed": int(s)} for s in self.problems.integers(2**63 - 1, size=n)]

    def reseed_for_rollout(self, iteration: int) -> None:
        """The sampler's noise for the rollout of ``iteration``: a seed hashed from ``(seed, iteration)``, so no two
        runs share a noise stream (``seed + 1 + iteration`` made seed s's iteration t + 1 draw seed s + 1's iteration t
        noise)."""
        self._reseed(self.seed, iteration, 0)

    def reseed_for_refill(self, iteration: int, refill_round: int) -> None:
        """The sampler's noise for refill round ``refill_round`` (1, 2, ...) of ``iteration``'s rollout."""
        self._reseed(self.seed, iteration, refill_round)

    def _reseed(self, *key: int) -> None:
        sequence = np.random.SeedSequence(list(key))
        self.generator.manual_seed(int(sequence.generate_state(1, dtype=np.uint64)[0] >> 1))

    def get_state(self) -> tuple[dict[str, Any], th.Tensor]:
        """The problem stream's state (JSON data) and the sampler generator's (a tensor)."""
        return self.problems.bit_generator.state, self.generator.get_state()

    def set_state(self, problems: dict[str, Any], generator: th.Tensor) -> None:
        """Put back what :meth:`get_state` gave."""
        self.problems.bit_generator.state = problems
        self.generator.set_state(generator)
