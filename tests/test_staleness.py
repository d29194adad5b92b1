"""Bounded-staleness rollouts (``max_staleness``; algorithms/common/rollout/staleness.py and overlapped_learning.py):
the schedule, the weight versions, exactness (0 is today's loop, a fixed seed reproduces, a resume continues the
run), the staleness logs, and the faults a producer can have."""

from __future__ import annotations

import csv
import threading
import time
from pathlib import Path

import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import configure

from algorithms import GRPO, LMPPO
from algorithms.common import overlapped_learning
from algorithms.common.rollout import staleness
from algorithms.common.rollout.staleness import RolloutProducer, RolloutProducerError, WeightVersions, sampling_version
from algorithms.common.runtime.determinism import deterministic_on_cpu
from algorithms.common.sampler_correction import truncated_fraction
from algorithms.common.saving.checkpoints import IterationCheckpoint, latest_checkpoint
from algorithms.common.saving.model_file import read_model_file
from grpo_gym.validation import ArgumentError
from tests.sizes import TINY
from tests.test_state import SaveMidRollout, assert_same_training_state, make_env, make_model


# ------------------------------------------------------------------------------------------------ pure pieces
def test_the_schedule_is_a_function_of_the_iteration() -> None:
    assert [sampling_version(i, 1) for i in range(5)] == [0, 0, 1, 2, 3]
    assert [sampling_version(i, 2) for i in range(5)] == [0, 0, 0, 1, 2]
    assert [sampling_version(i, 0) for i in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="must be >= 0"):
        sampling_version(3, -1)


def test_truncated_fraction_by_hand() -> None:
    update = th.log(th.tensor([[3.0, 1.0, 0.5], [2.5, 9.0, 1.0]]))  # pi_old / pi_sampler = these, sampler at 1
    sampler = th.zeros(2, 3)
    mask = th.tensor([[True, True, True], [True, False, True]])  # 9.0 is masked out
    assert truncated_fraction(update, sampler, mask, cap=2.0).item() == pytest.approx(2 / 5)  # 3.0 and 2.5
    assert truncated_fraction(update, sampler, mask, cap=4.0).item() == 0.0
    assert truncated_fraction(update, sampler, th.zeros_like(mask), cap=2.0).item() == 0.0


def test_weight_versions_keep_load_and_drop_by_the_schedule() -> None:
    model = th.nn.Linear(2, 1)
    sampler = th.nn.Linear(2, 1)
    versions = WeightVersions(max_staleness=2)
    for version in range(4):  # version v: every weight equal to v
        with th.no_grad():
            for p in model.parameters():
                p.fill_(float(version))
        versions.keep(version, model)
        versions.keep(version, th.nn.Linear(2, 1))  # a version is kept once: never overwritten
    assert versions.load(3, list(sampler.parameters())) == 1  # iteration 3 samples with version 3 - 2
    assert all(th.all(p == 1.0) for p in sampler.parameters())
    assert versions.versions == [1, 2, 3]  # version 0 is needed by no later rollout
    held, tensors = versions.get_state()
    again = WeightVersions(2)
    again.set_state(held, tensors, th.device("cpu"))
    assert again.load(4, list(sampler.parameters())) == 2 and all(th.all(p == 2.0) for p in sampler.parameters())
    resumed_sync = WeightVersions(2)
    resumed_sync.keep(7, model)  # a run synchronous until now holds only its current weights
    assert resumed_sync.load(8, list(sampler.parameters())) == 7


DIES = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # a producer dies on purpose


@DIES
def test_the_producer_names_a_failure_a_death_and_a_hang() -> None:
    producer = RolloutProducer(th.nn.Linear(2, 1), timeout=0.5, device=th.device("cpu"))
    producer.submit(lambda: 41 + 1)
    assert producer.result("adding")[0] == 42
    producer.submit(lambda: 1 / 0)
    with pytest.raises(RolloutProducerError, match="rollout producer raised while dividing: ZeroDivisionError"):
        producer.result("dividing")
    release = threading.Event()
    producer.submit(release.wait)
    started = time.perf_counter()
    with pytest.raises(RolloutProducerError, match=r"no answer within 0\.5 s while waiting: it hangs"):
        producer.result("waiting")
    assert time.perf_counter() - started < 5
    release.set()
    producer.close()

    def die() -> None:
        raise SystemExit  # ends the thread, as a crash inside the sampler would

    dying = RolloutProducer(th.nn.Linear(2, 1), timeout=30, device=th.device("cpu"))
    dying.submit(die)
    with pytest.raises(RolloutProducerError, match="died while sampling"):
        dying.result("sampling")
    with pytest.raises(RolloutProducerError, match="not running"):
        dying.submit(lambda: None)


# ------------------------------------------------------------------------------------------------ exactness
def test_zero_is_todays_loop_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """max_staleness=0 runs the synchronous loop, with no producer: the pinned fingerprint recorded before it."""
    from tests.test_pinned_run import PINS, PUBLISHED, run

    def no_producer(*_, **__):
        raise AssertionError("max_staleness=0 started a producer")

    monkeypatch.setattr(overlapped_learning, "RolloutProducer", no_producer)
    assert run({**PUBLISHED, "max_staleness": 0}) == pytest.approx(PINS["published"], rel=1e-4, abs=1e-6)


def test_with_frozen_weights_the_overlapped_loop_collects_and_updates_as_the_synchronous_one() -> None:
    """With a learning rate of 0 every version is the same weights, so k = 2 must sample the same rollouts and give
    the optimizer the same gradients as k = 0: the same problems, noise, minibatch order and counters."""
    settings = {"learning_rate": 0.0, "cold_start": False, "sampler_correction": None, "n_epochs": 2, "batch_size": 4}
    synchronous, overlapped = make_model(**settings), make_model(max_staleness=2, **settings)
    with staleness.split_cores(), deterministic_on_cpu("cpu"):  # the kernels the overlapped loop samples with
        synchronous.learn(32)
    overlapped.learn(32)
    assert_same_training_state(synchronous, overlapped)
    episodes = [[(info["r"], info["l"]) for info in model.ep_info_buffer] for model in (synchronous, overlapped)]
    assert episodes[0] == episodes[1] and len(episodes[0]) == 32


class Staleness(BaseCallback):
    """Record each rollout's staleness as logged, and the sampler correction's clipped fraction of updates."""

    def __init__(self) -> None:
        super().__init__()
        self.staleness: list[float] = []

    def _on_rollout_end(self) -> None:
        self.staleness.append(self.logger.name_to_value["rollout/staleness"])
        assert self.logger.name_to_value["rollout/staleness_max"] >= self.staleness[-1]
        assert self.logger.name_to_value["time/producer_idle_seconds"] >= 0.0

    def _on_step(self) -> bool:
        return True


def test_a_fixed_seed_reproduces_the_run_and_the_schedule_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded: list[tuple[int, int]] = []
    load = WeightVersions.load

    def spy(self, iteration: int, targets: list[th.Tensor]) -> int:
        loaded.append((iteration, load(self, iteration, targets)))
        return loaded[-1][1]

    monkeypatch.setattr(WeightVersions, "load", spy)
    first, logs = make_model(max_staleness=2), Staleness()
    first.learn(40, callback=logs)
    assert loaded == [(i, max(0, i - 2)) for i in range(5)]
    assert logs.staleness == [0, 1, 2, 2, 2]  # rollout i is trained on by version i
    assert first._sampler_correction == "tis"  # "auto" corrects stale rollouts
    second = make_model(max_staleness=2)
    second.set_logger(configure(str(tmp_path), ["csv"]))
    second.learn(40)
    assert_same_training_state(first, second)
    with open(tmp_path / "progress.csv", encoding="utf-8") as file:
        rows = [row for row in csv.DictReader(file) if row["rollout/staleness"]]  # not the cold start's row
    assert [float(row["rollout/staleness"]) for row in rows] == [0, 1, 2, 2, 2]
    assert [float(row["rollout/staleness_max"]) for row in rows] == [0, 1, 2, 2, 2]
    assert all(0.0 <= float(row["train/sampler_clipped_fraction"]) <= 1.0 for row in rows)
    assert all(float(row["time/producer_idle_seconds"]) >= 0.0 for row in rows)
    synchronous = make_model()
    synchronous.learn(40)
    pairs = zip(first.policy.parameters(), synchronous.policy.parameters(), strict=True)
    assert not all(th.equal(p, q) for p, q in pairs)  # the stale rollouts changed the run


def test_lmppo_overlaps_too_and_reproduces() -> None:
    settings = {"n_groups": 4, "group_size": 1, "cold_start": False, "seed": 0, "mixed_precision": "no",
                "policy_kwargs": TINY, "max_staleness": 1}  # fmt: skip
    first, second = (LMPPO("TransformerPolicy", make_env(), **settings) for _ in range(2))
    first.learn(12)
    second.learn(12)
    assert_same_training_state(first, second)
    assert first._iteration == 3 and first._sampler_correction == "tis" and 0.0 <= first._sampler_clipped <= 1.0


@pytest.mark.parametrize("mid_rollout", [False, True], ids=["after-learn", "mid-rollout"])
def test_resume_continues_exactly_as_the_uninterrupted_run(tmp_path: Path, mid_rollout: bool) -> None:
    """A save records the weights the rollouts in flight sample with: loaded, the run goes on as if never stopped."""
    whole = make_model(max_staleness=2)
    if mid_rollout:  # saved during the second rollout (its first turns on the producer, the first update done)
        whole.learn(40, callback=SaveMidRollout(tmp_path / "half.zip"))
        data = read_model_file(tmp_path / "half.zip")[0]
        assert data["state"]["_iteration"] == 1 and data["state"]["_n_updates"] == whole._n_updates // 5
        done = 8
    else:
        whole.learn(40)
        first = make_model(max_staleness=2)
        first.learn(16)
        first.save(tmp_path / "half.zip")
        done = first.num_timesteps
    second = GRPO.load(tmp_path / "half.zip", env=make_env())
    assert second._weight_versions is not None and second._weight_versions.versions
    second.learn(40 - done, reset_num_timesteps=False)
    assert_same_training_state(whole, second)


# ------------------------------------------------------------------------------------------------ faults
def failing_producer(monkeypatch: pytest.MonkeyPatch, at_job: int, fault) -> None:
    """Make the producer's ``at_job``-th job (1-based) run ``fault`` instead."""
    submit = RolloutProducer.submit
    count = [0]

    def submit_with_fault(self, job):
        count[0] += 1
        return submit(self, fault if count[0] == at_job else job)

    monkeypatch.setattr(RolloutProducer, "submit", submit_with_fault)


def boom() -> None:
    raise RuntimeError("injected sampler failure")


def die() -> None:
    raise SystemExit


@DIES
@pytest.mark.parametrize(
    "fault,message",
    [(boom, "raised while sampling the rollout of iteration 3"), (die, "died while sampling"),
     ("hang", "no answer within 1 s while sampling the rollout of iteration 3: it hangs")],
    ids=["raises", "dies", "hangs"],
)  # fmt: skip
def test_a_failing_producer_ends_learn_naming_it_with_the_checkpoint_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault, message: str
) -> None:
    release = threading.Event()
    failing_producer(monkeypatch, 4, release.wait if fault == "hang" else fault)
    model = make_model(max_staleness=1, distributed_kwargs={"timeout": 1.0})
    started = time.perf_counter()
    with pytest.raises(RolloutProducerError, match=message):
        model.learn(80, callback=IterationCheckpoint(tmp_path, every=1, run={}))
    assert time.perf_counter() - started < 60
    release.set()
    newest = latest_checkpoint(tmp_path)
    assert newest is not None and newest.name == "iteration_0000003"
    resumed = GRPO.load(newest / "model.zip", env=make_env())
    assert resumed.iteration == 3 and resumed._weight_versions is not None


def test_ctrl_c_stops_both_sides(monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_model(max_staleness=1)
    train, calls = model.train, [0]

    def interrupted() -> None:
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt
        train()

    model.train = interrupted
    with pytest.raises(KeyboardInterrupt):
        model.learn(80)
    deadline = time.perf_counter() + 30
    while any(t.name == RolloutProducer.NAME for t in threading.enumerate()) and time.perf_counter() < deadline:
        time.sleep(0.05)
    assert not any(t.name == RolloutProducer.NAME for t in threading.enumerate())
    assert model._overlap is None and th.get_num_threads() >= 1


# ------------------------------------------------------------------------------------------------ arguments
def test_bad_values_and_what_it_does_not_run_with_are_named() -> None:
    with pytest.raises(ArgumentError, match="max_staleness"):
        make_model(max_staleness=-1)
    with pytest.raises(ValueError, match=r"collapse guard.*pass max_staleness=0"):
        make_model(max_staleness=1, collapse_guard=True).learn(8)


def test_trls_async_config_field_ports() -> None:
    from algorithms.grpo.trl_port import config_values, translate

    algorithm, _, left = translate(*config_values({"max_staleness": 2, "weight_sync_steps": 4}), [])
    assert algorithm == {"max_staleness": 2}
    assert left and left[0].startswith("weight_sync_steps (no equivalent")
    with pytest.raises(TypeError, match=r"no equivalent \(the producer gets the new weights after every update\)"):
        GRPO("TransformerPolicy", None, weight_sync_steps=4)


def test_the_cores_are_split_for_the_block_and_given_back() -> None:
    before = th.get_num_threads()
    with staleness.split_cores() as threads:
        assert threads == th.get_num_threads() == max(1, before // 2)
    assert th.get_num_threads() == before
