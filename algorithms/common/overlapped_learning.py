"""``OverlappedLoop``: the learning loop of ``max_staleness=k >= 1``, where sampling overlaps the update
(:mod:`algorithms.common.rollout.staleness`: the schedule, the weight versions, the producer thread). The algorithm
owns one (``model.overlapped``) and runs it from ``learn``.

One turn of the loop, for rollout ``i`` (``pending``: rollout ``i - 1``, collected and not yet trained on)::

    get_run_state                       the boundary before rollout i (the update's counters follow it)
    rollouts.start                      env settings, problems, the sampler reseeded, prompts (this thread)
    versions.load                       the producer's copy gets version max(0, i - k)
    producer.submit(first turns)  ----> the producer samples rollout i's first turns
    train (rollout i - 1), keep         meanwhile: the update, its weights kept as version i
    on_rollout_start                    callbacks (a checkpoint) see the state after the update, before rollout i
    producer.result                     waits at most distributed_kwargs timeout seconds; a failure is raised, naming it
    rollouts.finish, end_rollout        scoring, env steps, later turns and refills (the copy samples), the batch
"""

from __future__ import annotations

import time
from typing import Any

import torch as th
from stable_baselines3.common.callbacks import BaseCallback

from algorithms.common.rollout.staleness import VERSIONS_PREFIX, RolloutProducer, split_cores, trainable
from algorithms.common.runtime.determinism import deterministic_on_cpu


class OverlappedLoop:
    """The learning loop of ``max_staleness >= 1`` for ``algorithm`` (see the module docstring).

    :param algorithm: the algorithm that owns this loop
    """

    def __init__(self, algorithm: Any) -> None:  # an LMBaseAlgorithm (which imports this module)
        self.algorithm = algorithm
        self.staleness_max = 0  # rollout/staleness_max since the last dump

    def run(self, total_timesteps: int, callback: BaseCallback, log_interval: int | None) -> None:
        """``learn``'s loop with ``max_staleness=k >= 1``: the producer samples rollout ``i``'s first turns with the
        weights of version ``max(0, i - k)`` while the learner updates on rollout ``i - 1``; the rest of a rollout
        (scoring, env steps, later turns, refills, the batch) and every callback run on this thread, with the update
        done. A save during a rollout records the state after the last update and before the rollout, with the
        versions the next rollouts sample with."""
        model = self.algorithm
        assert model.env is not None and model._weight_versions is not None
        self.check()
        producer = RolloutProducer(model.policy.model, model.dist_timeout, model.device)
        model._overlap, pending, versions = producer, False, model._weight_versions
        self.staleness_max = 0
        try:
            with split_cores(), deterministic_on_cpu(model.device):  # sampling deterministic whatever the timing
                versions.keep(model._iteration, model.policy.model)  # the weights now: version = iterations done
                while model.num_timesteps < total_timesteps:
                    boundary = model.get_run_state()  # before the rollout; the update's counters follow it
                    start = model.rollouts.start(model.env)
                    version = versions.load(model._iteration, trainable(producer.model))
                    producer.generator.set_state(model._seeds.generator.get_state())  # the noise, drawn over there
                    call = model.rollouts.sampling_call(start.prompts, **start.sampling, generator=producer.generator)
                    producer.submit(call)
                    if pending:
                        self._train(log_interval)
                    model._boundary = self._boundary(boundary)
                    callback.on_rollout_start()
                    waited = time.perf_counter()
                    first, seconds = producer.result(f"sampling the rollout of iteration {model._iteration}")
                    model._seeds.generator.set_state(producer.generator.get_state())  # handed back
                    self._log_staleness(model._iteration - version, time.perf_counter() - waited)
                    collected = model.rollouts.finish(model.env, callback, start, first, seconds)
                    pending = model.end_rollout(collected, callback)
                    if not pending:
                        break
                    model._iteration += 1
                    model._update_current_progress_remaining(model.num_timesteps, total_timesteps)
                if pending:
                    self._train(log_interval)
        finally:
            producer.close()
            model._overlap = None

    def _train(self, log_interval: int | None) -> None:
        """Update on the pending rollout, keep the new weights as the next version, and log."""
        model = self.algorithm
        assert model._weight_versions is not None
        model.train()
        model.check_finite_state(f"training stopped at iteration {model._iteration}", agreed=True)
        model._weight_versions.keep(model._iteration, model.policy.model)
        if log_interval is not None and model._iteration % log_interval == 0:
            model.dump_logs()
            self.staleness_max = 0

    def _log_staleness(self, staleness: int, waited: float) -> None:
        """``rollout/staleness`` (the mean over the logged iterations, and its max), the producer's idle time and
        the learner's wait for it."""
        model = self.algorithm
        assert model._overlap is not None
        self.staleness_max = max(self.staleness_max, staleness)
        model.logger.record_mean("rollout/staleness", staleness)
        model.logger.record("rollout/staleness_max", self.staleness_max)
        model.logger.record_mean("time/producer_idle_seconds", model._overlap.take_idle_seconds())
        model.logger.record_mean("time/learner_wait_seconds", waited)

    def _boundary(self, boundary: tuple[dict[str, Any], dict[str, th.Tensor]]):
        """The state a save during the next rollout records: ``boundary`` (taken before the rollout started) with
        the update's counters and the weight versions as they are after the update."""
        model = self.algorithm
        assert model._weight_versions is not None
        state, tensors = boundary
        state = {**state, **{name: getattr(model, name) for name in model.learner_attributes}}
        state["weight_versions"], version_tensors = model._weight_versions.get_state()
        tensors = {key: value for key, value in tensors.items() if not key.startswith(VERSIONS_PREFIX)}
        return state, {**tensors, **version_tensors}

    def check(self) -> None:
        """What ``max_staleness >= 1`` does not run with: a clear error naming the fix."""
        model = self.algorithm
        reasons = {
            "sharding='fsdp' (the producer holds whole weights)": ("sharding=None", model._parallel.sharded),
            "the collapse guard (its restores would rewrite versions in flight)": (
                "collapse_guard=False",
                model._guard is not None,
            ),
            f"rollout_engine={model.rollout_engine!r} (the producer samples with the built-in sampler)": (
                "rollout_engine='builtin'",
                model.rollout_engine != "builtin" or model.policy.rollout_engine is not None,
            ),
        }
        for reason, (fix, present) in reasons.items():
            if present:
                raise ValueError(
                    f"max_staleness={model.max_staleness} does not run with {reason}: pass max_staleness=0 or {fix}"
                )
