"""The collapse guard: a run that watches its own success, and steps back when it falls.

GRPO from a pretrained start can collapse: a few updates push the policy into writing perfect templates with wrong
answers, keeping the small format reward and losing the skill, and it does not come back (issue 30: one seed in
three from 72% to 4.5% held-out success). The guard watches a success figure every iteration:

- **the signal**, one of

  - ``monitor="held_out"`` (the default): every ``eval_every`` iterations, the greedy success rate on a fixed set of
    ``eval_problems`` held-out problems (the env's ``eval_problems`` with their own seed, never those of a final
    evaluation nor of training); the same problems every time, so the figure moves only when the model does;
  - ``monitor="rollout"``: the share of the rollout's episodes the env marked ``is_success`` (with several
    processes, every process's episodes), averaged over the last ``window`` iterations: free, but with few problems
    per rollout it is noisy (K=4 problems of 3-digit addition: the mean of 10 iterations moved 0.2-0.35 below its
    best in runs that ended 14 points up), so only a large ``margin`` (0.25 with ``window=10``) tells a collapse
    from noise;
  - ``monitor="eval"``: the success rate (else the mean reward) of an SB3 ``EvalCallback`` passed to ``learn()``,
    each time it evaluates;

- **the best**: the highest value of the signal so far, and a snapshot of the trainable weights and the optimizer
  state at that iteration (on the CPU; with LoRA, the adapters only);
- **a fall**: the signal more than ``margin`` below the best for ``patience`` checks in a row. The guard then puts
  the best snapshot back (weights and optimizer state), multiplies the learning rate by ``lr_factor``, skips the
  update on the rollout the fallen policy sampled, and logs the event: TensorBoard (``guard/restores``,
  ``guard/best_success``, ``guard/success``, ``guard/lr_scale``), the console (``verbose >= 1``) and the run's saved
  state (``events``). After ``max_restores`` restores it only watches.

Its state (the figures, the counters, the learning-rate scale, the events and the snapshot) is part of the run
state, so a saved and resumed run continues exactly as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback

from algorithms.common.evaluation import evaluate_problems, held_out_problems, held_out_source

MONITORS = ("held_out", "rollout", "eval")
#: the seed of the guard's held-out problems (``monitor="held_out"``): the final evaluation's are seed 0's
HELD_OUT_SEED = 7


def guards_by_default(policy: Any, env: Any) -> bool:
    """``collapse_guard="auto"``: whether the guard watches this run. On for a model from a folder or hub name (a
    pretrained start, where a collapse loses what the model already knew: issue 30's start at lr 1e-4, median
    +15.0 -> +25.5 points over 10 seeds, worst -4.0 -> +8.5, and no seed hurt at 3e-5) on a task with held-out
    problems of its own; off for the built-in model (its cold start climbs from nothing, so there is no skill to
    lose yet) and for an env without held-out problems (the guard would judge training rows)."""
    if env is None or getattr(policy, "is_builtin", True):
        return False
    try:
        return held_out_source(env) != "training rows"
    except AttributeError:  # an env without a task (e.g. a remote one): nothing held out to judge
        return False


@dataclass(frozen=True)
class GuardSettings:
    """What the guard watches and how it reacts (the fields of ``collapse_guard={...}``).

    :param margin: a fall is the signal more than this many success points (as a fraction: 0.1 = 10 points)
        below its best
    :param patience: checks in a row below the margin before the guard acts
    :param window: checks the signal averages (1: each check's figure alone)
    :param lr_factor: the learning rate is multiplied by this at every restore
    :param max_restores: restores at most; then the guard only watches
    :param monitor: ``"held_out"`` (greedy success on fixed held-out problems), ``"rollout"`` (the rollouts'
        success) or ``"eval"`` (an ``EvalCallback`` given to ``learn()``)
    :param eval_problems: the held-out problems of ``monitor="held_out"``
    :param eval_every: iterations between two held-out checks (``monitor="held_out"``)
    """

    margin: float = 0.1
    patience: int = 2
    window: int = 1
    lr_factor: float = 0.5
    max_restores: int = 3
    monitor: str = "held_out"
    eval_problems: int = 16
    eval_every: int = 5

    @classmethod
    def parse(cls, value: Any) -> GuardSettings | None:
        """``collapse_guard``'s value as settings: ``True`` (the defaults), a dict of fields, or ``None``/``False``
        (off); anything else is a ``ValueError`` naming what it takes."""
        if value is None or value is False:
            return None
        if value is True or value == "auto":  # "auto": the defaults, where :func:`guards_by_default` says so
            return cls()
        names = [f.name for f in fields(cls)]
        if not isinstance(value, dict):
            raise ValueError(f"collapse_guard must be 'auto', True, False/None or a dict of {names}, got {value!r}")
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise ValueError(f"collapse_guard takes the keys {names}; unknown: {unknown}")
        settings = cls(**value)
        settings.check()
        return settings

    def check(self) -> None:
        """A ``ValueError`` naming the first field out of range."""
        numbers = {"margin": (self.margin, 0.0, 1.0), "lr_factor": (self.lr_factor, 0.0, 1.0)}
        for name, (number, low, high) in numbers.items():
            if isinstance(number, bool) or not isinstance(number, (int, float)) or not low < number <= high:
                raise ValueError(f"collapse_guard {name} must be a number in ({low}, {high}], got {number!r}")
        counts = {"patience": (self.patience, 1), "window": (self.window, 1), "max_restores": (self.max_restores, 0),
                  "eval_problems": (self.eval_problems, 1), "eval_every": (self.eval_every, 1)}  # fmt: skip
        for name, (count, low) in counts.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < low:
                raise ValueError(f"collapse_guard {name} must be an integer >= {low}, got {count!r}")
        if self.monitor not in MONITORS:
            raise ValueError(f"collapse_guard monitor must be one of {list(MONITORS)}, got {self.monitor!r}")


@dataclass
class Snapshot:
    """Trainable weights (by parameter name) and the optimizer's state dict, cloned to the CPU."""

    weights: dict[str, th.Tensor]
    optimizer: dict[str, Any]

    @classmethod
    def take(cls, named_parameters: Iterable[tuple[str, th.nn.Parameter]], optimizer: th.optim.Optimizer) -> Snapshot:
        weights = {name: _local(p).detach().to("cpu", copy=True) for name, p in named_parameters if p.requires_grad}
        return cls(weights, _cloned(optimizer.state_dict()))

    def restore(self, named_parameters: Iterable[tuple[str, th.nn.Parameter]], optimizer: th.optim.Optimizer) -> None:
        with th.no_grad():
            for name, p in named_parameters:
                if name in self.weights:
                    _local(p).copy_(self.weights[name])
        optimizer.load_state_dict(_cloned(self.optimizer))


def _local(tensor: th.Tensor) -> th.Tensor:
    """A tensor's local part (this rank's shard of a DTensor; the tensor itself otherwise)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _cloned(value: Any) -> Any:
    """``value`` with every tensor cloned to the CPU (dicts and lists copied)."""
    if isinstance(value, th.Tensor):
        return _local(value).detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _cloned(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cloned(item) for item in value)
    return value


@dataclass
class CollapseGuard:
    """The guard of one run: see the module doc. The algorithm calls :meth:`check` once per iteration, after the
    rollout and before the update, and skips the update when it returns True."""

    settings: GuardSettings
    recent: list[float] = field(default_factory=list)
    best: float | None = None
    best_iteration: int = -1
    below: int = 0
    restores: int = 0
    lr_scale: float = 1.0
    evaluations_seen: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    snapshot: Snapshot | None = None
    difficulty: float | None = None  # the level the held-out problems of monitor="held_out" are drawn at, once
    problems: list[Any] | None = None  # those problems (drawn again from their seed after a resume)

    def figure(
        self, iteration: int, env: Any, policy: Any, successes: tuple[int, int], callback: BaseCallback, dist: Any
    ) -> float | None:
        """What the guard judges at ``iteration`` (None: nothing new): the greedy success on its held-out problems
        every ``eval_every`` iterations, the rollout's success rate (``successes``: this process's ``(successes,
        episodes)``, summed over ``dist``'s processes), or the newest figure of an ``EvalCallback`` in ``callback``."""
        settings = self.settings
        if settings.monitor == "held_out":
            if iteration % settings.eval_every:
                return None
            if self.problems is None:  # the same problems at every check, also after a resume
                if self.difficulty is None:
                    self.difficulty = float(env.get_attr("difficulty", indices=[0])[0])
                self.problems = held_out_problems(env, settings.eval_problems, self.difficulty, HELD_OUT_SEED)
            return evaluate_problems(policy, env, self.problems, seed=0, greedy=True).success_rate
        if settings.monitor == "rollout":
            won, count = successes
            if dist.enabled:
                won, count = dist.sum(float(won)), dist.sum(float(count))
            return won / count if count else None
        evaluator = find_eval_callback(callback)
        if evaluator is None:
            raise ValueError(
                "collapse_guard={'monitor': 'eval'} watches an EvalCallback: pass one to learn(callback=...), or use "
                "monitor='held_out'"
            )
        evaluations = evaluator.n_calls // evaluator.eval_freq if evaluator.eval_freq > 0 else 0
        if evaluations <= self.evaluations_seen:
            return None
        self.evaluations_seen = evaluations
        won = evaluator._is_success_buffer  # the last evaluation's, as SB3 logs eval/success_rate from it
        return float(np.mean(won)) if won else float(evaluator.last_mean_reward)

    def signal(self, success: float | None) -> float | None:
        """Add this check's figure (``None``: nothing new to judge) and return the signal, or ``None`` while the
        window is filling."""
        if success is None:
            return None
        self.recent = [*self.recent, float(success)][-self.settings.window :]
        return float(np.mean(self.recent)) if len(self.recent) >= self.settings.window else None

    def check(self, success: float | None, iteration: int, model: th.nn.Module, optimizer: th.optim.Optimizer) -> bool:
        """Judge this iteration's figure; True when the guard restored the best snapshot (skip the update)."""
        value = self.signal(success)
        if value is None:
            return False
        if self.best is None or value > self.best:
            self.best, self.best_iteration, self.below = value, iteration, 0
            self.snapshot = Snapshot.take(model.named_parameters(), optimizer)
            return False
        if value >= self.best - self.settings.margin or self.restores >= self.settings.max_restores:
            self.below = 0
            return False
        self.below += 1
        if self.below < self.settings.patience or self.snapshot is None:
            return False
        self.snapshot.restore(model.named_parameters(), optimizer)
        self.restores += 1
        self.lr_scale *= self.settings.lr_factor
        self.below, self.recent = 0, []  # the signal restarts from the restored weights
        self.events.append(
            {
                "iteration": iteration,
                "success": value,
                "best": self.best,
                "best_iteration": self.best_iteration,
                "lr_scale": self.lr_scale,
            }
        )
        return True

    def describe_last_event(self, learning_rate: float) -> str:
        """The console line of the last restore."""
        event, s = self.events[-1], self.settings
        what = {"held_out": "held-out greedy success", "rollout": "rollout success", "eval": "evaluation figure"}
        what = what[s.monitor]
        mean = f" (mean of the last {s.window} checks)" if s.window > 1 else ""
        return (
            f"collapse guard: {what} {event['success']:.3f}{mean} stayed more than {s.margin:g} below its best "
            f"{event['best']:.3f} (iteration {event['best_iteration']}) for {s.patience} checks at iteration "
            f"{event['iteration']}: restored the weights and optimizer state of iteration {event['best_iteration']}, "
            f"learning rate x{event['lr_scale']:g} (now {learning_rate:.3g}); restore {self.restores} of at most "
            f"{s.max_restores}"
        )

    # ------------------------------------------------------------------ run state
    def get_state(self) -> tuple[dict[str, Any], dict[str, th.Tensor]]:
        """The guard's state as JSON data and tensors (the snapshot's weights and optimizer tensors, by key)."""
        state = {
            "settings": asdict(self.settings),
            "recent": list(self.recent),
            "best": self.best,
            "best_iteration": self.best_iteration,
            "below": self.below,
            "restores": self.restores,
            "lr_scale": self.lr_scale,
            "evaluations_seen": self.evaluations_seen,
            "events": [dict(event) for event in self.events],
            "difficulty": self.difficulty,
        }
        tensors: dict[str, th.Tensor] = {}
        if self.snapshot is not None:
            tensors = {f"weights/{name}": value for name, value in self.snapshot.weights.items()}
            state["snapshot_optimizer"] = _flatten(self.snapshot.optimizer, "optimizer", tensors)
        return state, tensors

    @classmethod
    def from_state(cls, state: dict[str, Any], tensors: dict[str, th.Tensor]) -> CollapseGuard:
        """A guard continuing from :meth:`get_state`'s data."""
        snapshot = None
        if "snapshot_optimizer" in state:
            weights = {key[len("weights/") :]: value for key, value in tensors.items() if key.startswith("weights/")}
            snapshot = Snapshot(weights, _unflatten(state["snapshot_optimizer"], tensors))
        names = ("recent", "best", "best_iteration", "below", "restores", "lr_scale", "evaluations_seen", "events",
                 "difficulty")  # fmt: skip
        return cls(GuardSettings(**state["settings"]), **{n: state[n] for n in names if n in state}, snapshot=snapshot)


def _flatten(value: Any, key: str, tensors: dict[str, th.Tensor]) -> Any:
    """``value`` as JSON data, its tensors moved to ``tensors`` under paths from ``key`` (``{"tensor": path}``)."""
    if isinstance(value, th.Tensor):
        tensors[key] = value
        return {"tensor": key}
    if isinstance(value, dict):
        return {"dict": [[k, _flatten(v, f"{key}/{k}", tensors)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {"list": [_flatten(v, f"{key}/{i}", tensors) for i, v in enumerate(value)]}
    return value


def _unflatten(value: Any, tensors: dict[str, th.Tensor]) -> Any:
    """The inverse of :func:`_flatten`."""
    if isinstance(value, dict) and "tensor" in value:
        return tensors[value["tensor"]]
    if isinstance(value, dict) and "dict" in value:
        return {k: _unflatten(v, tensors) for k, v in value["dict"]}
    if isinstance(value, dict) and "list" in value:
        return [_unflatten(v, tensors) for v in value["list"]]
    return value


def find_eval_callback(callback: BaseCallback | None) -> EvalCallback | None:
    """The first SB3 ``EvalCallback`` in ``callback`` (a ``CallbackList`` is searched through), or None."""
    if isinstance(callback, EvalCallback):
        return callback
    for inner in getattr(callback, "callbacks", []):
        found = find_eval_callback(inner)
        if found is not None:
            return found
    return None
