"""Bounded-staleness rollouts (``max_staleness=k``): sampling that overlaps the update, on a fixed schedule.

With ``k >= 1`` the first-turn sampling of rollout ``i`` (the bulk of a rollout) runs in a producer thread while the
learner updates on rollout ``i - 1``; the rollout is sampled by the policy's weights of version
``max(0, i - k)`` (:func:`sampling_version`: version ``v`` is the weights after ``v`` iterations), a function of the
iteration and not of timing, so a run with a fixed seed and ``k`` is reproducible and resumes exactly. The pieces:

- :class:`WeightVersions`: the trainable parameters of the versions later rollouts still need (at most ``k + 1``
  copies), taken under ``torch.no_grad`` after every update, loaded into the producer's own copy of the network
  before its rollout, and saved with the run state (what is in flight is the recipe of the next rollouts: their
  weights, with the RNG and env states the run state holds already).
- :class:`RolloutProducer`: the thread that samples; the learner waits for its answer at most ``timeout`` seconds,
  and a producer that raised, died or hangs ends ``learn()`` with a :class:`RolloutProducerError` naming it.
- :func:`split_cores`: the two sides share the cores, half each (torch's intra-op pool is process-wide: two pools
  of all the cores would fight).

Why a thread and not a process: the producer's only work is the sampler's forward passes, during which torch releases
the GIL, and a thread reads its copy of the weights without any transfer; envs, callbacks and collectives stay on
the main thread, so torchrun's ranks each drive their own producer with no extra communication.
"""

from __future__ import annotations

import contextlib
import copy
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch as th
from torch import nn

#: the run-state tensors' prefix for the saved weight versions
VERSIONS_PREFIX = "weight_versions/"


def sampling_version(iteration: int, max_staleness: int) -> int:
    """The weights' version that samples the rollout of ``iteration``: ``max(0, iteration - max_staleness)``."""
    if max_staleness < 0 or iteration < 0:
        raise ValueError(f"iteration ({iteration}) and max_staleness ({max_staleness}) must be >= 0")
    return max(0, iteration - max_staleness)


def trainable(module: nn.Module) -> list[th.Tensor]:
    """The parameters of ``module`` that train, in its order (frozen ones never change between versions)."""
    return [p for p in module.parameters() if p.requires_grad]


class WeightVersions:
    """Copies of a network's trainable parameters by version, for the producer's copy to load.

    :param max_staleness: ``k``: rollout ``i`` needs version ``max(0, i - k)``
    """

    def __init__(self, max_staleness: int) -> None:
        self.max_staleness = max_staleness
        self._copies: dict[int, list[th.Tensor]] = {}

    @property
    def versions(self) -> list[int]:
        """The versions held, oldest first."""
        return sorted(self._copies)

    def keep(self, version: int, model: nn.Module) -> None:
        """Copy ``model``'s trainable parameters as ``version`` (once; a version never changes)."""
        if version not in self._copies:
            with th.no_grad():
                self._copies[version] = [p.detach().clone() for p in trainable(model)]

    def load(self, iteration: int, targets: list[th.Tensor]) -> int:
        """Copy the version that samples ``iteration``'s rollout into ``targets`` (the sampler's trainable parameters,
        :func:`trainable`; under ``torch.no_grad``), drop the versions no later rollout needs, and return the version
        used: the scheduled one, or the oldest newer one held when it is missing (a run that was synchronous until
        now)."""
        wanted = sampling_version(iteration, self.max_staleness)
        held = [v for v in self.versions if v >= wanted]
        if not held:
            raise RuntimeError(f"no weights of version >= {wanted} to sample iteration {iteration}'s rollout")
        version = held[0]
        with th.no_grad():
            for target, source in zip(targets, self._copies[version], strict=True):
                target.copy_(source)
        for old in [v for v in self._copies if v < version]:
            del self._copies[old]
        return version

    def get_state(self) -> tuple[list[int], dict[str, th.Tensor]]:
        """The versions held and their tensors (``weight_versions/<version>/<index>``), for the run state."""
        tensors = {
            f"{VERSIONS_PREFIX}{version}/{index}": tensor.detach().cpu()
            for version, copies in self._copies.items()
            for index, tensor in enumerate(copies)
        }
        return self.versions, tensors

    def set_state(self, versions: list[int], tensors: dict[str, th.Tensor], device: th.device) -> None:
        """Put back what :meth:`get_state` gave."""
        self._copies = {}
        for version in versions:
            prefix = f"{VERSIONS_PREFIX}{version}/"
            count = sum(key.startswith(prefix) for key in tensors)
            self._copies[int(version)] = [tensors[f"{prefix}{i}"].to(device) for i in range(count)]


class RolloutProducerError(RuntimeError):
    """The rollout producer raised, died or did not answer in time."""


class RolloutProducer:
    """A thread that runs sampling jobs one at a time, and owns a copy of the policy's network to run them with.

    :param model: the policy's network; the producer samples with a copy of it (:attr:`model`)
    :param timeout: the most seconds :meth:`result` waits for a job's answer
    :param device: the policy's device
    """

    NAME = "grpo-gym rollout producer"

    def __init__(self, model: nn.Module, timeout: float, device: th.device) -> None:
        self.model = copy.deepcopy(model)  # sampled under torch.no_grad (the policy's generate)
        #: the sampler's noise while a job runs (the learner copies the rollouts' generator in and back out)
        self.generator = th.Generator(device=device)
        #: the update's minibatch shuffling, apart from the rollouts' generator
        self.update_generator = th.Generator(device=device)
        self.timeout = float(timeout)
        self.idle_seconds = 0.0  # time waiting for a job since the last report
        self._jobs: queue.Queue[Callable[[], Any] | None] = queue.Queue()
        self._answer: tuple[bool, Any, float] | None = None
        self._answered = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=self.NAME, daemon=True)
        self._thread.start()

    def sampler_network(self, from_reference: bool, reference: nn.Module | None) -> nn.Module:
        """The network that samples: the producer's copy, or the frozen ``reference`` (GRPO's protected rollouts)."""
        if not from_reference:
            return self.model
        if reference is None:
            raise ValueError(
                "max_staleness >= 1 samples protected rollouts from a frozen copy of the reference, and with LoRA "
                "there is none (the reference is the policy with its adapters off): pass max_staleness=0 or "
                "controls_kwargs={'protected_rollouts': 0}"
            )
        return reference

    @property
    def alive(self) -> bool:
        """Whether the producer's thread still runs."""
        return self._thread.is_alive()

    def _run(self) -> None:
        while True:
            waited = time.perf_counter()
            job = self._jobs.get()
            with self._lock:
                self.idle_seconds += time.perf_counter() - waited
            if job is None:
                return
            start = time.perf_counter()
            try:
                answer: tuple[bool, Any, float] = (True, job(), time.perf_counter() - start)
            except Exception as error:  # reported to the learner, which raises it
                answer = (False, error, time.perf_counter() - start)
            self._answer = answer
            self._answered.set()

    def submit(self, job: Callable[[], Any]) -> None:
        """Run ``job`` on the producer (one at a time: :meth:`result` must collect the previous one first)."""
        if not self.alive:
            raise RolloutProducerError(f"the {self.NAME} is not running (it died earlier); start learn() again")
        self._answered.clear()
        self._jobs.put(job)

    def result(self, what: str) -> tuple[Any, float]:
        """The submitted job's answer and its seconds; a :class:`RolloutProducerError` naming the producer and
        ``what`` it was doing when it raised, died or gave no answer within :attr:`timeout` seconds."""
        deadline = time.perf_counter() + self.timeout
        while not self._answered.wait(timeout=min(0.05, self.timeout)):
            if not self.alive:
                raise RolloutProducerError(f"the {self.NAME} died while {what} (its thread ended without an answer)")
            if time.perf_counter() > deadline:
                raise RolloutProducerError(
                    f"the {self.NAME} gave no answer within {self.timeout:g} s while {what}: it hangs (raise "
                    "distributed_kwargs['timeout'] if sampling a rollout takes longer)"
                )
        assert self._answer is not None
        ok, value, seconds = self._answer
        self._answer = None
        if not ok:
            raise RolloutProducerError(f"the {self.NAME} raised while {what}: {value!r}") from value
        return value, seconds

    def take_idle_seconds(self) -> float:
        """The producer's idle seconds since the last call."""
        with self._lock:
            idle, self.idle_seconds = self.idle_seconds, 0.0
        return idle

    def close(self) -> None:
        """Stop the producer after its current job (a job still running finishes; its answer is dropped)."""
        self._jobs.put(None)
        self._thread.join(timeout=0.05)


@contextlib.contextmanager
def split_cores() -> Iterator[int]:
    """Give torch's intra-op pool half the threads it had (at least 1) for the block: the producer's sampling and
    the learner's update then use one half each, instead of two pools of every core fighting. Yields the threads."""
    before = th.get_num_threads()
    half = max(1, before // 2)
    th.set_num_threads(half)
    try:
        yield half
    finally:
        th.set_num_threads(before)
