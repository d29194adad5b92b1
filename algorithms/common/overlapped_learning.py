"""``OverlappedLearning``: :meth:`~algorithms.common.lm_algorithm.LMAlgorithm.learn`'s loop with ``max_staleness=k
>= 1``, where sampling overlaps the update (:mod:`algorithms.common.rollout.staleness`: the schedule, the weight
versions, the producer thread).

One turn of the loop, for rollout ``i`` (``pending``: rollout ``i - 1``, collected and not yet trained on)::

    get_run_state                       the boundary before rollout i (the update's counters follow it)
    _start_rollout                      env settings, problems, the sampler reseeded, prompts (this thread)
    versions.load                       the producer's copy gets version max(0, i - k)
    producer.submit(first turns)  ----> the producer samples rollout i's first turns
    train (rollout i - 1), keep         meanwhile: the update, its weights kept as version i
    on_rollout_start                    callbacks (a checkpoint) see the state after the update, before rollout i
    producer.result                     waits at most dist_timeout seconds; a failure is raised, naming it
    _finish_rollout                     scoring, env steps, later turns and refills (the copy samples), the batch

The base of :class:`~algorithms.common.lm_algorithm.LMAlgorithm`, on
:class:`~algorithms.common.rollout_collection.RolloutCollection` (``_start_rollout``, ``_sampling_call``,
``_finish_rollout``); ``train`` and ``dump_logs`` are the algorithm's.
"""

from __future__ import annotations

import time
from typing import Any

import torch as th
from stable_baselines3.common.callbacks import BaseCallback

from algorithms.common.rollout.staleness import VERSIONS_PREFIX, RolloutProducer, split_cores, trainable
from algorithms.common.rollout_collection import RolloutCollection
from algorithms.common.runtime.determinism import deterministic_on_cpu


class OverlappedLearning(RolloutCollection):
    """The learning loop of ``max_staleness >= 1``: see the module docstring."""

    def _learn_overlapped(self, total_timesteps: int, callback: BaseCallback, log_interval: int | None) -> None:
        """:meth:`learn`'s loop with ``max_staleness=k >= 1`` (:mod:`~algorithms.common.rollout.staleness`): the
        producer samples rollout ``i``'s first turns with the weights of version ``max(0, i - k)`` while the learner
        updates on rollout ``i - 1``; the rest of a rollout (scoring, env steps, later turns, refills, the batch) and
        every callback run on this thread, with the update done. A save during a rollout records the state after
        the last update and before the rollout, with the versions the next rollouts sample with."""
        assert self.env is not None and self._weight_versions is not None
        self._check_overlap()
        producer = RolloutProducer(self.policy.model, self.dist_timeout, self.device)
        self._overlap, pending, versions = producer, False, self._weight_versions
        self._staleness_max = 0
        try:
            with split_cores(), deterministic_on_cpu(self.device):  # sampling deterministic whatever the timing
                versions.keep(self._iteration, self.policy.model)  # the weights now: version = iterations done
                while self.num_timesteps < total_timesteps:
                    boundary = self.get_run_state()  # before the rollout; the update's counters follow it
                    start = self._start_rollout(self.env)
                    version = versions.load(self._iteration, trainable(producer.model))
                    producer.generator.set_state(self._seeds.generator.get_state())  # the noise, drawn over there
                    producer.submit(self._sampling_call(start.prompts, **start.sampling, generator=producer.generator))
                    if pending:
                        self._train_overlapped(log_interval)
                    self._boundary = self._overlap_boundary(boundary)
                    callback.on_rollout_start()
                    waited = time.perf_counter()
                    first, seconds = producer.result(f"sampling the rollout of iteration {self._iteration}")
                    self._seeds.generator.set_state(producer.generator.get_state())  # handed back
                    self._log_staleness(self._iteration - version, time.perf_counter() - waited)
                    pending = self._finish_rollout(self.env, callback, start, first, seconds)
                    if not pending:
                        break
                    self._iteration += 1
                    self._update_current_progress_remaining(self.num_timesteps, total_timesteps)
                if pending:
                    self._train_overlapped(log_interval)
        finally:
            producer.close()
            self._overlap = None

    def _train_overlapped(self, log_interval: int | None) -> None:
        """Update on the pending rollout, keep the new weights as the next version, and log."""
        assert self._weight_versions is not None
        self.train()
        self.check_finite_state(f"training stopped at iteration {self._iteration}", agreed=True)
        self._weight_versions.keep(self._iteration, self.policy.model)
        if log_interval is not None and self._iteration % log_interval == 0:
            self.dump_logs()
            self._staleness_max = 0

    def _log_staleness(self, staleness: int, waited: float) -> None:
        """``rollout/staleness`` (the mean over the logged iterations, and its max), the producer's idle time and
        the learner's wait for it."""
        assert self._overlap is not None
        self._staleness_max = max(self._staleness_max, staleness)
        self.logger.record_mean("rollout/staleness", staleness)
        self.logger.record("rollout/staleness_max", self._staleness_max)
        self.logger.record_mean("time/producer_idle_seconds", self._overlap.take_idle_seconds())
        self.logger.record_mean("time/learner_wait_seconds", waited)

    def _overlap_boundary(self, boundary: tuple[dict[str, Any], dict[str, th.Tensor]]):
        """The state a save during the next rollout records: ``boundary`` (taken before the rollout started) with
        the update's counters and the weight versions as they are after the update."""
        assert self._weight_versions is not None
        state, tensors = boundary
        state = {**state, **{name: getattr(self, name) for name in self.learner_attributes}}
        state["weight_versions"], version_tensors = self._weight_versions.get_state()
        tensors = {key: value for key, value in tensors.items() if not key.startswith(VERSIONS_PREFIX)}
        return state, {**tensors, **version_tensors}

    def _check_overlap(self) -> None:
        """What ``max_staleness >= 1`` does not run with: a clear error naming the fix."""
        reasons = {
            "sharding='fsdp' (the producer holds whole weights)": ("sharding=None", self._parallel.sharded),
            "the collapse guard (its restores would rewrite versions in flight)": (
                "collapse_guard=False",
                self._guard is not None,
            ),
            f"rollout_engine={self.rollout_engine!r} (the producer samples with the built-in sampler)": (
                "rollout_engine='builtin'",
                self.rollout_engine != "builtin" or self.policy.rollout_engine is not None,
            ),
        }
        for reason, (fix, present) in reasons.items():
            if present:
                raise ValueError(
                    f"max_staleness={self.max_staleness} does not run with {reason}: pass max_staleness=0 or {fix}"
                )

    @property
    def _minibatch_generator(self) -> th.Generator:
        """What shuffles the update's minibatches: the rollouts' generator as the rollout left it, or with
        ``max_staleness`` its copy taken then (the producer draws the next rollout's noise meanwhile)."""
        return self._seeds.generator if self._overlap is None else self._overlap.update_generator
