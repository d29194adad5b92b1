"""Dynamic batching: which requests form a batch, waiting, the queue's limit, cancellation and draining."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from algorithms.deploy.batching import DynamicBatcher, Job, QueueFull, batch_tokens, choose_batch


def job(length: int, n: int = 1, max_tokens: int = 8, temperature: float = 0.0) -> Job:
    return Job(list(range(length)), n=n, max_tokens=max_tokens, temperature=temperature)


def test_the_oldest_job_leads_and_its_bucket_comes_first() -> None:
    oldest, far, near, same = job(20), job(70), job(40), job(25)
    chosen, full = choose_batch([oldest, far, near, same], bucket_width=16, max_batch_size=64, max_batch_tokens=10**6)
    assert chosen == [oldest, same, near, far] and not full


def test_only_jobs_with_the_same_sampling_settings_share_a_batch() -> None:
    greedy, hot, greedy_too = job(10), job(10, temperature=0.7), job(12)
    chosen, _ = choose_batch([greedy, hot, greedy_too], 16, 64, 10**6)
    assert chosen == [greedy, greedy_too]
    assert job(5, temperature=0).sampling == job(9, temperature=0).sampling == (True, 1.0, 1.0)


def test_limits_on_rows_and_padded_tokens() -> None:
    jobs = [job(10, n=3), job(10, n=3), job(10, n=3)]
    chosen, full = choose_batch(jobs, 16, max_batch_size=7, max_batch_tokens=10**6)
    assert chosen == jobs[:2] and full
    assert batch_tokens([job(10), job(30, max_tokens=4)]) == 2 * (30 + 8)
    chosen, full = choose_batch([job(10), job(30), job(11)], 16, 64, max_batch_tokens=2 * (11 + 8))
    assert [len(j.prompt) for j in chosen] == [10, 11] and full  # the long prompt would pad both past the budget


def run(coroutine):
    return asyncio.run(coroutine)


def test_concurrent_requests_share_one_batch_after_waiting() -> None:
    seen: list[int] = []

    def generate(jobs: list[Job]) -> list[int]:
        seen.append(len(jobs))
        return [len(j.prompt) for j in jobs]

    async def main() -> list[int]:
        batcher = DynamicBatcher(generate, max_wait_ms=50)
        batcher.start()
        results = await asyncio.gather(*(batcher.submit(job(i + 1)) for i in range(5)))
        await batcher.drain()
        return results

    assert run(main()) == [1, 2, 3, 4, 5]
    assert seen == [5]


def test_a_full_batch_does_not_wait() -> None:
    def generate(jobs: list[Job]) -> list[None]:
        return [None] * len(jobs)

    async def main() -> float:
        batcher = DynamicBatcher(generate, max_wait_ms=10_000, max_batch_size=2)
        batcher.start()
        started = time.monotonic()
        await asyncio.gather(batcher.submit(job(4)), batcher.submit(job(4)))
        waited = time.monotonic() - started
        await batcher.drain()
        return waited

    assert run(main()) < 10  # launched as soon as it was full, not after max_wait_ms


def test_full_queue_refuses_with_a_retry_delay_and_cancel_frees_the_place() -> None:
    release = threading.Event()

    def generate(jobs: list[Job]) -> list[None]:
        release.wait(timeout=10)
        return [None] * len(jobs)

    async def main() -> None:
        batcher = DynamicBatcher(generate, max_wait_ms=0, max_queue=2, max_batch_size=1)
        batcher.start()
        first = batcher.submit(job(3))
        while not batcher.running:  # the first job runs (blocked); the next two wait in the queue
            await asyncio.sleep(0.01)
        waiting = [job(3), job(3)]
        futures = [batcher.submit(j) for j in waiting]
        with pytest.raises(QueueFull) as refused:
            batcher.submit(job(3))
        assert refused.value.retry_after >= 1
        batcher.cancel(waiting[0])  # its client left: the place is free again
        assert futures[0].cancelled() and batcher.queued_rows == 1
        last = batcher.submit(job(3))
        release.set()
        await asyncio.gather(first, futures[1], last)
        await batcher.drain()

    run(main())


def test_drain_finishes_queued_and_running_jobs() -> None:
    def generate(jobs: list[Job]) -> list[str]:
        time.sleep(0.05)
        return ["done"] * len(jobs)

    async def main() -> list:
        batcher = DynamicBatcher(generate, max_wait_ms=0, max_batch_size=1)
        batcher.start()
        futures = [batcher.submit(job(2)) for _ in range(3)]
        await batcher.drain()
        return [f.result() for f in futures]

    assert run(main()) == ["done"] * 3


def test_a_failing_batch_fails_its_requests_only() -> None:
    def generate(jobs: list[Job]) -> list[int]:
        if any(len(j.prompt) == 13 for j in jobs):
            raise RuntimeError("boom")
        return [1] * len(jobs)

    async def main() -> None:
        batcher = DynamicBatcher(generate, max_wait_ms=0, max_batch_size=1)
        batcher.start()
        bad, good = batcher.submit(job(13)), batcher.submit(job(2))
        with pytest.raises(RuntimeError, match="boom"):
            await bad
        assert await good == 1
        await batcher.drain()

    run(main())


def test_jobs_that_can_never_fit_are_refused() -> None:
    batcher = DynamicBatcher(lambda jobs: jobs, max_batch_size=4, max_batch_tokens=100)
    with pytest.raises(ValueError, match=r"^n:"):
        batcher.check(job(2, n=5))
    with pytest.raises(ValueError, match=r"^max_tokens:"):
        batcher.check(job(50, max_tokens=60))
    with pytest.raises(ValueError, match="max_wait_ms"):
        DynamicBatcher(lambda jobs: jobs, max_wait_ms=-1)
