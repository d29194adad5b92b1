"""Dynamic batching of generation requests by prompt length.

Requests wait in a queue for at most ``max_wait_ms``; then the oldest one's batch is formed: requests with the same
sampling settings (one batch is one call of the sampler), first those in its prompt-length bucket, then those in
the nearest buckets, in arrival order, while the batch stays within ``max_batch_size`` rows and ``max_batch_tokens``
(rows x (longest prompt + largest ``max_tokens``): the padded tokens the batch holds). A batch launches early when
nothing more fits. One batch runs at a time, in a worker thread, while the event loop keeps accepting requests;
rows that finish leave the running batch early (the sampler drops them).

A full queue refuses new requests (:class:`QueueFull`, with a retry delay from the measured throughput); a
request cancelled while queued (its client went away) gives its place back; :meth:`DynamicBatcher.drain` lets
every queued and running request finish.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from algorithms.common.generation.sampler import MIN_TEMPERATURE


@dataclass
class Job:
    """One prompt of a request: ``n`` completions of ``prompt`` (token ids) with one sampling setting.

    :param prompt: the prompt's token ids
    :param n: completions wanted (rows of the batch)
    :param max_tokens: the most new tokens per completion
    :param temperature: 0 (or anything below :data:`MIN_TEMPERATURE`, 1e-5) for greedy decoding
    :param top_p: nucleus mass (below 1e-5: greedy decoding, the nucleus being the most likely token)
    """

    prompt: Sequence[int]
    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    arrived: float = field(default_factory=time.monotonic)
    future: asyncio.Future | None = None

    @property
    def sampling(self) -> tuple[bool, float, float]:
        """The settings a batch shares: ``(greedy, temperature, top_p)`` (greedy ignores the other two)."""
        greedy = self.temperature < MIN_TEMPERATURE or self.top_p < MIN_TEMPERATURE
        return (True, 1.0, 1.0) if greedy else (False, float(self.temperature), float(self.top_p))


class QueueFull(Exception):
    """The queue holds ``max_queue`` rows already; ``retry_after`` seconds is the estimated wait."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"the queue is full; retry after {retry_after} s")
        self.retry_after = retry_after


def batch_tokens(jobs: Sequence[Job]) -> int:
    """Tokens a batch of ``jobs`` holds: rows x (longest prompt + largest budget)."""
    rows = sum(job.n for job in jobs)
    return rows * (max(len(job.prompt) for job in jobs) + max(job.max_tokens for job in jobs))


def choose_batch(
    pending: Sequence[Job], bucket_width: int, max_batch_size: int, max_batch_tokens: int
) -> tuple[list[Job], bool]:
    """The next batch from the queue (oldest first): ``(jobs, full)``, ``full`` when nothing more fits.

    The oldest job always goes in; then jobs with its sampling settings, nearest prompt-length bucket first (its own
    bucket, then one bucket away, ...), in arrival order within a bucket, while the batch stays within the limits.
    """
    if not pending:
        return [], False
    oldest = pending[0]
    bucket = len(oldest.prompt) // bucket_width
    candidates = [job for job in pending[1:] if job.sampling == oldest.sampling]
    candidates.sort(key=lambda job: abs(len(job.prompt) // bucket_width - bucket))  # stable: arrival order kept
    chosen, rows, full = [oldest], oldest.n, False
    for job in candidates:
        if rows + job.n > max_batch_size or batch_tokens([*chosen, job]) > max_batch_tokens:
            full = True
            continue
        chosen.append(job)
        rows += job.n
    return chosen, full or rows >= max_batch_size


class DynamicBatcher:
    """The queue and the loop that runs its batches (see the module docstring).

    :param run_batch: generates a batch in the worker thread: ``jobs -> one result per job``
    :param max_wait_ms: the longest a request waits for others before its batch launches
    :param max_batch_tokens: the most padded tokens in a batch (rows x (longest prompt + largest budget))
    :param max_batch_size: the most rows (completions) in a batch
    :param max_queue: the most rows waiting; more requests get :class:`QueueFull`
    :param bucket_width: prompt lengths ``[k * width, (k + 1) * width)`` share a bucket
    """

    def __init__(
        self,
        run_batch: Callable[[list[Job]], list[Any]],
        max_wait_ms: float = 5.0,
        max_batch_tokens: int = 8192,
        max_batch_size: int = 64,
        max_queue: int = 512,
        bucket_width: int = 16,
    ) -> None:
        if max_wait_ms < 0 or min(max_batch_tokens, max_batch_size, max_queue, bucket_width) < 1:
            raise ValueError("need max_wait_ms >= 0 and max_batch_tokens, max_batch_size, max_queue, bucket_width >= 1")
        self.run_batch = run_batch
        self.max_wait, self.max_batch_tokens = max_wait_ms / 1000, max_batch_tokens
        self.max_batch_size, self.max_queue, self.bucket_width = max_batch_size, max_queue, bucket_width
        self.pending: list[Job] = []
        self.running: list[Job] = []
        self.batches = 0  # batches run so far
        self._rows_per_second = 0.0  # a moving average of the measured throughput (for Retry-After)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None  # the generation thread, from start() to drain()

    @property
    def queued_rows(self) -> int:
        """Rows waiting in the queue (not yet in a batch)."""
        return sum(job.n for job in self.pending)

    def check(self, job: Job) -> None:
        """Raise a ``ValueError`` if ``job`` alone could never fit a batch."""
        if job.n > self.max_batch_size:
            raise ValueError(f"n: {job.n} completions exceed the server's max batch size ({self.max_batch_size})")
        if batch_tokens([job]) > self.max_batch_tokens:
            raise ValueError(
                f"max_tokens: the prompt's {len(job.prompt)} tokens + max_tokens ({job.max_tokens}), times n, exceed "
                f"the server's max batch tokens ({self.max_batch_tokens})"
            )

    def submit(self, job: Job) -> asyncio.Future:
        """Queue ``job``; its future gets the job's result. Raises :class:`QueueFull` when the queue is full."""
        self.check(job)
        if self.queued_rows + job.n > self.max_queue:
            rate = self._rows_per_second or 1.0
            raise QueueFull(max(1, math.ceil((self.queued_rows + sum(j.n for j in self.running)) / rate)))
        job.future = asyncio.get_running_loop().create_future()
        job.arrived = time.monotonic()
        self.pending.append(job)
        self._wake.set()
        return job.future

    def cancel(self, job: Job) -> None:
        """Give up ``job`` (its client left): out of the queue if still waiting, its result dropped if running."""
        if job in self.pending:
            self.pending.remove(job)
        if job.future is not None and not job.future.done():
            job.future.cancel()

    def start(self) -> None:
        """Start the batching loop on the running event loop."""
        if self._task is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def drain(self) -> None:
        """Wait until every queued and running job has finished, then stop the loop and the worker thread."""
        while self.pending or self.running:
            await asyncio.sleep(0.01)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    async def _loop(self) -> None:
        while True:
            if not self.pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            jobs, full = choose_batch(self.pending, self.bucket_width, self.max_batch_size, self.max_batch_tokens)
            wait = self.pending[0].arrived + self.max_wait - time.monotonic()
            if not full and wait > 0:  # wait for more requests, at most until the oldest one's deadline
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=wait)
                except asyncio.TimeoutError:
                    pass
                continue
            await self._run(jobs)

    async def _run(self, jobs: list[Job]) -> None:
        for job in jobs:
            self.pending.remove(job)
        self.running = jobs
        started = time.monotonic()
        try:
            results = await asyncio.get_running_loop().run_in_executor(self._executor, self.run_batch, jobs)
        except Exception as error:  # a failed batch fails its requests, not the server
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(error)
        else:
            for job, result in zip(jobs, results, strict=True):
                if not job.future.done():  # a cancelled job's result is dropped
                    job.future.set_result(result)
            rate = sum(job.n for job in jobs) / max(time.monotonic() - started, 1e-6)
            self._rows_per_second = rate if not self.batches else 0.8 * self._rows_per_second + 0.2 * rate
        finally:
            self.running = []
            self.batches += 1
