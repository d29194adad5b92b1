"""``LMBaseAlgorithm``: what every language-model algorithm on R1Zero-style envs shares (GRPO and the PPO baseline
build on it, at one level, as SB3's algorithms build on ``BaseAlgorithm``).

SB3's ``BaseAlgorithm`` role: the constructor's shared arguments, the policy with its mixed precision, the frozen
reference, the rollouts' seeds (:class:`~algorithms.common.runtime.seeds.RolloutSeeds`), several processes (whole
replicas or FSDP2 shards, :mod:`algorithms.common.runtime.parallel`), the run state
(:meth:`LMBaseAlgorithm.get_run_state` / :meth:`~LMBaseAlgorithm.set_run_state`), ``save`` / ``load`` (the file's
contents: :mod:`algorithms.common.saving.run_file`); and the steps every algorithm's ``learn`` shares around its own
(:meth:`~LMBaseAlgorithm._start_learning`, :meth:`~LMBaseAlgorithm.collect_rollouts`,
:meth:`~LMBaseAlgorithm._next_iteration`, the guarded optimizer step, :meth:`~LMBaseAlgorithm._end_iteration`,
:meth:`~LMBaseAlgorithm.dump_logs`). It owns two parts, built in its constructor: ``rollouts``
(:class:`~algorithms.common.rollout_collection.RolloutCollector`) collects a rollout; with ``max_staleness >= 1``,
``overlapped`` (:class:`~algorithms.common.overlapped_learning.OverlappedLoop`) runs the loop with sampling overlapping
the update.

The learning loop is written once, :meth:`LMBaseAlgorithm.learn` (collect, score, update, log), as SB3's
``OnPolicyAlgorithm.learn``; an algorithm builds its batch from a rollout's rows (``_build_batch``: returns and
advantages) and updates on it (``train``: minibatches, loss, the guarded step). The cold start
(:meth:`LMBaseAlgorithm.run_cold_start`) runs before the first rollout.

The frozen reference is a copy of the policy's network (``ref_model``), or with LoRA adapters the policy's own
network with its adapters disabled, i.e. the base model, with no copy (``ref_model`` stays None; see
:mod:`algorithms.common.model.reference`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import json
import os
import time
import warnings
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, TypeVar

import numpy as np
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback
from stable_baselines3.common.utils import (
    FloatSchedule,
    configure_logger,
    get_system_info,
    safe_mean,
    update_learning_rate,
)
from stable_baselines3.common.vec_env import VecEnv

import grpo_gym  # noqa: F401  (registers R1Zero-v0, so Algorithm("TransformerPolicy", "R1Zero-v0") works)
from algorithms.common import sampler_correction as correction
from algorithms.common.arguments import Arguments
from algorithms.common.callbacks import CurriculumCallback
from algorithms.common.cold_start import check_pretrained, supervised_finetune
from algorithms.common.collapse_guard import CollapseGuard, GuardSettings, guards_by_default
from algorithms.common.env_util import MissingEnv, make_env_for_model, rollout_token_ids
from algorithms.common.generation.engines.setup import EngineLink, EngineSpec, check_spec
from algorithms.common.lm_arguments import LM_ARGUMENTS
from algorithms.common.losses import LossFunction, PolicyOutputs, UpdateLoss
from algorithms.common.model.finite_state import NonFiniteStateError, find_nonfinite
from algorithms.common.model.loading import check_finite_weights
from algorithms.common.model.reference import frozen_copy, reference_network
from algorithms.common.model.tokenizer_check import check_embedding_rows, check_model_tokenizer
from algorithms.common.overlapped_learning import OverlappedLoop
from algorithms.common.policies import TransformerPolicy
from algorithms.common.rollout.batch import (
    RolloutBatch,
    loss_share,
    minibatches,
    rows_to_batch,
    rows_with_gradient,
    sampler_kl_of_fresh,
)
from algorithms.common.rollout.rows import TEXT_ONLY, Rows, log_rollout, turn_returns
from algorithms.common.rollout.staleness import VERSIONS_PREFIX, RolloutProducer, WeightVersions
from algorithms.common.rollout_collection import Collected, RolloutCollector, RolloutSampling
from algorithms.common.runtime.determinism import deterministic_on_cpu
from algorithms.common.runtime.distributed import Distributed
from algorithms.common.runtime.parallel import parallelism
from algorithms.common.runtime.precision import choose_precision
from algorithms.common.runtime.seeds import RolloutSeeds
from algorithms.common.runtime.sharding import clip_grad_norm, copy_weights, load_full_state
from algorithms.common.sampler_correction import resolve_sampler_correction
from algorithms.common.saving import checks, run_file
from algorithms.common.saving.checkpoints import MODEL
from algorithms.common.saving.model_file import FORMAT, encode, read_model_file
from algorithms.common.saving.sharded import load_policy
from algorithms.common.schedules import UpdateDecay
from algorithms.common.trl_names import TRL_NAMES
from grpo_gym.trl_names import hint
from grpo_gym.validation import ArgumentError, user_stacklevel

SelfLMBaseAlgorithm = TypeVar("SelfLMBaseAlgorithm", bound="LMBaseAlgorithm")
#: the arguments SB3's ``BaseAlgorithm`` takes and stores itself (``stats_window_size`` as ``_stats_window_size``)
SB3_ARGUMENTS = ("learning_rate", "policy_kwargs", "stats_window_size", "tensorboard_log", "verbose", "device", "seed")
ATTRIBUTE_OF = {"stats_window_size": "_stats_window_size"}

GUARD_PREFIX = "collapse_guard/"  # the collapse guard's snapshot among a saved run's tensors


class Step(NamedTuple):
    """One minibatch's optimizer step (:meth:`LMBaseAlgorithm._step`): its loss, its stats (``None``: stopped before
    the step) and the ``(B, C)`` log-probs of the rows the forward pass ran, before the step."""

    loss: th.Tensor
    stats: dict[str, Any] | None
    log_probs: th.Tensor


def step_stats(minibatch: RolloutBatch, stats: dict[str, Any], grad_norm: th.Tensor) -> dict[str, Any]:
    """A step's stats with its ``grad_norm`` (a finite one: a skipped step's is counted, not averaged) and, when the
    loss has no entropy term, the entropy estimated from the sampled tokens, ``-E[log p]``."""
    if "entropy" not in stats:
        stats["entropy"] = -minibatch.old_log_probs[minibatch.completion_mask].mean()
    if th.isfinite(grad_norm):
        stats["grad_norm"] = grad_norm
    return stats


def record_step(history: dict[str, list[float]], loss: th.Tensor, stats: dict[str, Any]) -> None:
    """Append one optimizer step's loss and stats to an update's ``history`` (name -> one float per step)."""
    for key, value in {"loss": loss, **stats}.items():
        history.setdefault(key, []).append(float(value.detach()) if th.is_tensor(value) else float(value))


class LMBaseAlgorithm(BaseAlgorithm):
    """Base class of the language-model algorithms (:class:`~algorithms.grpo.GRPO`, the PPO baseline): see the
    module docstring.

    The constructor's arguments are the table :attr:`arguments` (an algorithm's: the shared ones and its own); each
    is checked once, by its rule, and stored under its name.
    """

    policy_aliases: ClassVar[dict[str, type[TransformerPolicy]]] = {"TransformerPolicy": TransformerPolicy}
    policy: TransformerPolicy

    #: the command line's name of an algorithm (``--algo grpo``) and its default rl-zoo3 config in ``zoo_configs/``:
    #: a subclass that sets ``algo_name`` is registered in :attr:`registry`, where the command line (train, eval,
    #: serve, export, distill, quantize) finds it, by that name or by the class name its zip records
    algo_name: ClassVar[str | None] = None
    config_file: ClassVar[str | None] = None
    #: the dynamic curriculum: off unless an algorithm takes the ``curriculum`` argument
    curriculum: bool = False
    #: the algorithm's arguments that take a constant or an SB3 schedule (``clip_range``, ...): made functions of the
    #: remaining progress at setup, as SB3's PPO does
    schedules: ClassVar[tuple[str, ...]] = ()
    registry: ClassVar[dict[str, type[LMBaseAlgorithm]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("algo_name"):
            if not cls.config_file:
                raise TypeError(f"{cls.__name__} sets algo_name: set config_file too (its config in zoo_configs/)")
            LMBaseAlgorithm.registry[cls.algo_name] = cls

    @classmethod
    def registered(cls, class_name: str) -> type[LMBaseAlgorithm] | None:
        """The registered algorithm whose class is named ``class_name`` (as a zip records it), or ``None``."""
        return next((algorithm for algorithm in cls.registry.values() if algorithm.__name__ == class_name), None)

    #: the constructor's arguments after ``policy`` and ``env`` (each declared once: default, rule, doc); an
    #: algorithm's table adds its own (:mod:`algorithms.common.arguments`)
    arguments: ClassVar[Arguments] = LM_ARGUMENTS

    def __init__(self, policy: str | type[TransformerPolicy], env: GymEnv | str | None, **arguments: Any) -> None:
        values = type(self).arguments.check(arguments)  # each argument by its one rule, in its canonical type
        self._dist = Distributed(timeout=values["distributed_kwargs"]["timeout"])
        if isinstance(env, str):  # SB3 would ask for render_mode="rgb_array": see make_env_for_model
            env = make_env_for_model(env, values["policy_kwargs"].get("model"))
        main = self._dist.is_main  # several processes: only rank 0 logs and prints
        super().__init__(
            policy,
            env,
            learning_rate=values["learning_rate"],
            policy_kwargs=values["policy_kwargs"],
            stats_window_size=values["stats_window_size"],
            tensorboard_log=values["tensorboard_log"] if main else None,
            verbose=values["verbose"] if main else 0,
            device=self._dist.device(values["device"]),
            support_multi_env=True,
            seed=values["seed"],
        )
        for name, value in type(self).arguments.flattened(values).items():
            if name not in SB3_ARGUMENTS:  # SB3's BaseAlgorithm stored those (stats_window_size as a private)
                setattr(self, name, value)  # a settings dict's values too, each under its attribute (vllm_mode)
        #: whole replicas (DDP) or FSDP2 shards: see :mod:`algorithms.common.runtime.parallel`
        self._parallel = parallelism(self.sharding, self._dist, self.device, self.gradient_compression)
        self._placeholder = False  # this rank's groups were all left out: one weightless row keeps ranks in step
        self._skipped_steps = 0
        self._warned_skipped = False  # a step skipped for non-finite gradients is warned of once
        self.ref_model: th.nn.Module | None = None
        self._n_updates = 0
        self._iteration = 0
        self._cold_start_done = False
        self._token_info: dict[str, int] = {}
        self._rollout: RolloutBatch | None = None
        self._boundary: tuple[dict[str, Any], dict[str, th.Tensor]] | None = None  # the state a save records
        self._pending_env_states: list[dict[str, Any]] | None = None  # from load(), applied when training starts
        self._loaded_from = "the loaded model"  # the file load() read, named when its env states do not fit
        self._env_missing = ""  # why load() could not rebuild the recorded env (learn() says it)
        self._curriculum: CurriculumCallback | None = None
        guard = GuardSettings.parse(self.collapse_guard)
        #: the collapse guard of this run (None: off): see :mod:`algorithms.common.collapse_guard`
        self._guard = CollapseGuard(guard) if guard is not None and self.collapse_guard != "auto" else None
        self._rollout_successes = (0, 0)  # (successes, episodes) of the last rollout's finished episodes
        #: what a rollout samples, called at fixed points of collect_rollouts (an algorithm may own its own)
        self._sampling = RolloutSampling()
        spec = EngineSpec.of(self)
        check_spec(spec, self.sharding, self.device, self._dist.world_size)
        #: the rollout engine (built by _setup_model; "builtin": none, the policy's own sampler)
        self._engine = EngineLink(spec)
        #: max_staleness >= 1: the weights later rollouts sample with, and learn()'s producer while it runs
        self._weight_versions = WeightVersions(self.max_staleness) if self.max_staleness > 0 else None
        self._overlap: RolloutProducer | None = None
        #: the parts it owns: rollout collection, and with max_staleness >= 1 the overlapped learning loop
        self.rollouts = RolloutCollector(self)
        self.overlapped = OverlappedLoop(self) if self.max_staleness > 0 else None

    # ------------------------------------------------------------------ setup
    def _setup_model(self) -> None:
        """Seeds, the rollouts' randomness, the policy, mixed precision, the reference; the :attr:`schedules`
        arguments as functions of the remaining progress (SB3's ``FloatSchedule``)."""
        self._setup_lr_schedule()
        for name in self.schedules:
            value = getattr(self, name)
            if value is not None and not isinstance(value, UpdateDecay):  # UpdateDecay counts updates itself
                setattr(self, name, FloatSchedule(value))
        self.set_random_seed(self.seed)
        # one seed for the whole job (every rank draws the same numbers): see RolloutSeeds
        seed = self.seed if self.seed is not None else int(self._dist.gather_objects(int(th.randint(2**62, (1,))))[0])
        self._seeds = RolloutSeeds(seed, self.device)
        if self.env is not None:
            world = self._dist.world_size
            name = type(self).__name__
            self._token_info = rollout_token_ids(self.env, name, self.n_groups, world, self.group_size)
        tokenizer = self.env.get_attr("tokenizer", indices=[0])[0] if self.env is not None else None
        verified = tokenizer is not None and check_model_tokenizer(tokenizer, self.policy_kwargs.get("model"))
        kwargs = {"seed": self.seed, **self._token_info, **self.policy_kwargs}
        self.policy = self.policy_class(self.observation_space, self.action_space, self.lr_schedule, **kwargs)
        self.policy = self.policy.to(self.device)
        self.precision = choose_precision(self.mixed_precision, self.device)
        #: "tis", "mask" or None: see algorithms.common.sampler_correction
        self._sampler_correction = resolve_sampler_correction(self.sampler_correction, self.precision,
                                                              self.rollout_engine, self.max_staleness)  # fmt: skip
        self.policy.autocast_dtypes = self.precision.dtypes
        self._scaler = th.amp.GradScaler(self.device.type) if self.precision.needs_scaler else None
        if self.verbose >= 1:
            print(self._precision_text())
        if tokenizer is not None:
            check_embedding_rows(tokenizer, self.policy.model, self.policy.model_name, verified)
        config = json.loads(self.policy.model.config.to_json_string(use_diff=False))  # plain JSON: string keys
        # the architecture (so load() rebuilds it offline) and the frozen parameters (so they stay frozen)
        self.policy_kwargs = {
            **self.policy_kwargs,
            "model_config": config,
            "frozen_parameters": self.policy.frozen_parameters,
            **({"lora": self.policy.lora} if self.policy.lora is not None else {}),  # the adapter, defaults filled in
        }
        auto_guard = self.collapse_guard == "auto" and self.max_staleness == 0  # not with max_staleness (yet)
        if auto_guard and self._guard is None and guards_by_default(self.policy, self.env):
            self._guard = CollapseGuard(GuardSettings())
            if self.verbose >= 1:
                print("collapse guard on (collapse_guard='auto': a pretrained model); collapse_guard=False: off")
        if self._needs_reference():
            self.ref_model = frozen_copy(self.policy)
        self._parallel.prepare(self.policy, self.ref_model, self.precision)  # FSDP2: shards them
        rows, sampling = self._local_groups * self.group_size, self.precision.stages["sampling"]
        self._engine.open(self.policy, self._seeds.seed % 2**31, rows, sampling, self._dist.world_size)
        if self.verbose >= 1 and self._engine.external:
            print(self._engine.spec.describe)

    def _needs_reference(self) -> bool:
        """Whether a frozen copy of the policy is kept (for a KL term, or to sample from)."""
        return False

    def _refresh_reference(self) -> None:
        """Give the frozen reference (when there is a copy) the policy's current weights, shard by shard."""
        if self.ref_model is not None:
            copy_weights(self.policy.model, self.ref_model)

    @property
    def _local_groups(self) -> int:
        """The groups this process trains: K / world size."""
        return self.n_groups // self._dist.world_size

    # ------------------------------------------------------------------ the rollout engine
    def push_weights(self) -> float | None:
        """Give the rollout engine the policy's current weights (the learn loop does after every update, the cold
        start and a restore; :meth:`set_parameters` too); the seconds it took (``time/weight_sync_seconds``), None
        without an engine (``rollout_engine="builtin"``)."""
        return self._engine.push(getattr(self, "_logger", None))

    def close_engine(self) -> None:
        """Close the rollout engine (a colocated vLLM shuts down, a served one's client lets go of its server); the
        policy samples with its own sampler afterwards. Also on leaving ``with model:`` and at the process's exit."""
        self._engine.close()

    def __enter__(self: SelfLMBaseAlgorithm) -> SelfLMBaseAlgorithm:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close_engine()

    # ------------------------------------------------------------------ the public face (checkpoints, the CLI)
    @property
    def iteration(self) -> int:
        """The iterations (rollout + update) finished so far; checkpoints are named by it."""
        return self._iteration

    @property
    def distributed(self) -> Distributed:
        """The job's processes (``is_main``, ``rank``, ``world_size``, ``sum``...): one process when not under
        ``torchrun``."""
        return self._dist

    @property
    def is_sharded(self) -> bool:
        """Whether the weights are split over the processes (``sharding="fsdp"`` on several): saving, predicting
        and evaluating are then collectives every rank enters, and a checkpoint is :meth:`save_sharded`'s."""
        return self._parallel.sharded

    # ------------------------------------------------------------------ run state, save and load
    #: attributes that, besides the constructor's arguments, a run needs to continue exactly; subclasses add theirs
    state_attributes: ClassVar[tuple[str, ...]] = (
        "num_timesteps",
        "_n_updates",
        "_iteration",
        "_skipped_steps",
        "_cold_start_done",
        "_episode_num",
        "_current_progress_remaining",
        "_token_info",
    )

    #: the run-state entries every file holds besides :attr:`state_attributes` (what :meth:`get_run_state` adds;
    #: subclasses add theirs): a file of the current format that lacks one is refused (the env's states, the
    #: curriculum's, the collapse guard's and the weight versions are written when the run has them)
    run_state_keys: ClassVar[tuple[str, ...]] = (
        "_sampling_seed",
        "problem_rng",
        "ep_info_buffer",
        "ep_success_buffer",
        "numpy_rng",
        "python_rng",
    )

    #: the state attributes the update changes (with ``max_staleness`` a save during a rollout takes them after it)
    learner_attributes: ClassVar[tuple[str, ...]] = ("_n_updates", "_skipped_steps")

    def get_run_state(self) -> tuple[dict[str, Any], dict[str, th.Tensor]]:
        """The run state now (see :mod:`algorithms.common.saving.run_file`): a JSON-able dict and the torch RNG
        states (tensors)."""
        problems, generator = self._seeds.get_state()
        state = {name: getattr(self, name) for name in self.state_attributes}
        state.update(
            _sampling_seed=self._seeds.seed,
            problem_rng=problems,
            ep_info_buffer=[dict(info) for info in self.ep_info_buffer or []],
            ep_success_buffer=[bool(success) for success in self.ep_success_buffer or []],
            **run_file.global_rng_state(),
        )
        if self.env is not None and self.env.has_attr("get_state"):
            state["env_states"] = self.env.env_method("get_state")
        if self._curriculum is not None:
            state["curriculum"] = self._curriculum.get_state()
        tensors = {**run_file.torch_rng_state(), "generator": generator}
        if self._guard is not None:
            state["collapse_guard"], guard_tensors = self._guard.get_state()
            tensors.update({f"{GUARD_PREFIX}{key}": value for key, value in guard_tensors.items()})
        if self._weight_versions is not None:  # the weights the next rollouts sample with
            state["weight_versions"], version_tensors = self._weight_versions.get_state()
            tensors.update(version_tensors)
        return encode(state), tensors

    def set_run_state(self, state: dict[str, Any], rng: dict[str, th.Tensor]) -> None:
        """Put back what :meth:`get_run_state` gave; the env states are applied when training starts (after SB3's
        ``_setup_learn`` resets the envs)."""
        for name in self.state_attributes:
            if name in state:
                setattr(self, name, state[name])
        self.ep_info_buffer = deque(state.get("ep_info_buffer", []), maxlen=self._stats_window_size)
        self.ep_success_buffer = deque(state.get("ep_success_buffer", []), maxlen=self._stats_window_size)
        self._seeds.seed = int(state.get("_sampling_seed", self._seeds.seed))
        self._seeds.set_state(state["problem_rng"], rng["generator"])
        run_file.set_global_rng_state(state)
        run_file.set_torch_rng_state(rng)
        self._pending_env_states = state.get("env_states")
        if "curriculum" in state:
            self._curriculum = CurriculumCallback.from_state(state["curriculum"])
        if "collapse_guard" in state and (self._guard is not None or self.collapse_guard == "auto"):
            tensors = {key[len(GUARD_PREFIX) :]: value for key, value in rng.items() if key.startswith(GUARD_PREFIX)}
            self._guard = CollapseGuard.from_state(state["collapse_guard"], tensors)
        if "weight_versions" in state and self._weight_versions is not None:
            versions = {key: value for key, value in rng.items() if key.startswith(VERSIONS_PREFIX)}
            self._weight_versions.set_state(state["weight_versions"], versions, self.device)

    def _constructor_arguments(self) -> dict[str, Any]:
        """The constructor's arguments a file records, read back from the attributes they were stored in."""
        saved = {name: argument for name, argument in type(self).arguments.items() if argument.saved}
        arguments = {
            name: {key: getattr(self, attribute) for key, attribute in argument.attributes.items()}
            if argument.attributes is not None
            else getattr(self, ATTRIBUTE_OF.get(name, name))
            for name, argument in saved.items()
        }
        return {**arguments, "policy_kwargs": run_file.plain_policy_kwargs(arguments.get("policy_kwargs"))}

    def save(self, path: str | os.PathLike, exclude: None = None, include: None = None) -> None:
        """Write the model to ``path`` (``.zip`` added when missing), atomically, as plain JSON and weights:
        the constructor's arguments, the weights and optimizer state, and the run state at the last iteration
        boundary (see :mod:`algorithms.common.saving.run_file`). With several processes only rank 0 writes (with
        ``sharding="fsdp"`` every rank calls it: the shards are gathered to rank 0).

        ``exclude`` and ``include`` (SB3's) are not supported: the file holds arguments and state by name."""
        if exclude or include:
            raise ValueError(
                "save() writes the constructor's arguments and the run state; exclude/include are not supported"
            )
        sharded = self._parallel.sharded  # the whole tensors gathered to rank 0: a collective
        self.check_finite_state(f"refusing to write {os.fspath(path)!r}", agreed=sharded)
        parameters = self.get_parameters() if self._dist.is_main or sharded else {}
        if self._dist.is_main:
            self._write_model_file(path, parameters)

    def save_sharded(self, directory: str | os.PathLike, write_extra: Callable[[Path], None] | None = None) -> Path:
        """Write a checkpoint folder: each rank its shards of the policy, its optimizer and the reference
        (``torch.distributed.checkpoint``), rank 0 ``model.zip`` (the arguments and run state, its weights left to
        the shards) and ``write_extra(folder)``'s files; atomically (a kill leaves the previous folder). ``load`` of
        its ``model.zip`` reads it on any number of processes. A collective: every rank calls it."""

        self.check_finite_state(f"refusing to write {os.fspath(directory)!r}", agreed=True)

        def extra(folder: Path) -> None:
            self._write_model_file(folder / MODEL, {}, sharded_weights=True)
            if write_extra is not None:
                write_extra(folder)

        return self._parallel.save_checkpoint(directory, self.policy, self.ref_model, extra)

    def check_finite_state(self, what: str, agreed: bool = False) -> None:
        """Raise :class:`~algorithms.common.model.finite_state.NonFiniteStateError` starting with ``what`` when a
        weight or an optimizer moment holds a NaN or an infinity. ``agreed``: every rank checks its own and all raise
        together (a collective; for the training loop and sharded saves)."""
        found = find_nonfinite(self.policy, self.policy.optimizer)
        if agreed and self._dist.enabled:
            found = next((item for item in self._dist.gather_objects(found) if item), None)
        if found is not None:
            raise NonFiniteStateError(
                f"{what}: {found}. A model in this state samples garbage and cannot recover; nothing was saved from "
                "it (the checkpoints and the --save-path file written before are as they were). Lower "
                "learning_rate (or cold_start_kwargs['learning_rate'], max_grad_norm), or resume from the last "
                "checkpoint"
            )

    def _write_model_file(self, path: str | os.PathLike, parameters: dict[str, Any], sharded_weights=False) -> None:
        if not sharded_weights:
            parameters["policy"] = self.policy.file_state_dict(parameters["policy"])  # LoRA: adapters only, maybe
        names = (type(self).__name__, self.policy_class.__name__)
        spaces = (self.observation_space, self.action_space)
        state = self._boundary or self.get_run_state()
        run_file.write_run(path, names, spaces, self._constructor_arguments(), state, self.env, parameters,
                           reference=self.ref_model is not None)  # fmt: skip

    @classmethod
    def load(  # type: ignore[override]
        cls: type[SelfLMBaseAlgorithm],
        path: str | os.PathLike | io.BufferedIOBase,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        allow_pickle: bool = False,
        env_objects: dict[str, Any] | None = None,
        rebuild_env: bool = True,
        read_optimizer: bool = True,
        **kwargs: Any,
    ) -> SelfLMBaseAlgorithm:
        """Load a model written by :meth:`save`, safely: its ``data`` is JSON and its tensors are read with
        ``weights_only=True``; an entry that would need unpickling (a user's own schedule function) is refused
        with an error naming it, unless ``custom_objects`` supplies it or ``allow_pickle=True`` (only for a file
        you trust). ``kwargs`` override saved constructor arguments (e.g. ``tensorboard_log``); a name the
        constructor does not take is refused, naming the closest one (SB3 would set it as an attribute).

        A file of this version's format that lacks a saved argument, a run-state entry or the frozen reference's
        weights was edited or damaged: refused, naming each (missing arguments may be given here, as the run's
        values); in a file of an earlier version, what was added since takes its default, with a warning naming it.

        Without ``env``, the env the file records (its id and constructor arguments, see
        :meth:`~grpo_gym.R1ZeroEnv.describe`) is rebuilt, with ``env_objects`` supplying what a file cannot hold
        (``{"reward_funcs": {...}}``, ``{"task_kwargs": {"data": dataset}}``); when something is missing the model
        loads without an env (a warning names it), predicts and exports but does not train; ``rebuild_env=False``
        skips the rebuild (the policy alone, e.g. to serve it). ``read_optimizer=False`` leaves the saved optimizer
        state unread and unchecked (to evaluate or serve: training from such a model starts a fresh optimizer; a
        sharded checkpoint's is always read). ``force_reset`` is
        accepted for SB3's signature: the envs are always reset when training starts, then given their saved
        states back."""
        cls.arguments.refuse_moved(kwargs, f"{cls.__name__}.load()")  # a settings dict's key given flat
        for key in kwargs:  # a typo (learning_rte) would be stored as an attribute nothing reads
            if key not in cls.arguments:
                accepted = set(cls.arguments) | set(inspect.signature(cls.load).parameters) - {"kwargs"}
                raise ArgumentError(hint(f"{cls.__name__}.load", key, accepted, TRL_NAMES))
        if print_system_info:
            get_system_info()
        saved = run_file.read_saved_run(path, custom_objects, allow_pickle)
        name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else "the model file"
        if saved.algorithm != cls.__name__:
            raise ValueError(f"{name} holds a {saved.algorithm} model: load it with {saved.algorithm}.load")
        checks.check_saved_arguments(saved, cls, name, kwargs)
        checks.check_recorded_vocabulary(saved, name)
        wrap = functools.partial(cls._wrap_env, verbose=int(saved.arguments.get("verbose", 0)))
        rebuilt = env is None  # no env given: the recorded one is rebuilt (when it can be)
        env, env_missing = run_file.env_to_load(saved, env, env_objects, rebuild_env, name, wrap)
        arguments = {**saved.arguments, **kwargs}
        model = cls(policy=saved.policy_class, env=env, device=device, _init_setup_model=False, **arguments)
        if env is None:
            model.observation_space, model.action_space = saved.observation_space, saved.action_space
        model._env_missing = env_missing
        model._token_info = saved.state.get("_token_info", {})  # the env's EOS and pad ids, needed to build the policy
        model._setup_model()
        if saved.sharded_weights:  # a checkpoint of save_sharded: the weights are the shards beside the file
            held = load_policy(path, model.policy, model.ref_model)
        else:
            held = "ref_model" in saved.state_dicts
            checks.check_weights_fit(model.policy.completed_state_dict(saved.state_dicts["policy"]),
                                       model.policy.state_dict(), name)  # fmt: skip
            if model.ref_model is not None and "ref_model" in saved.state_dicts:  # checked as the policy's are
                checks.check_weights_fit(saved.state_dicts["ref_model"], model.ref_model.state_dict(), name,
                                         "ref_model.pth")  # fmt: skip
            state_dicts = dict(saved.state_dicts)
            if read_optimizer:
                checks.check_optimizer_state(state_dicts["policy.optimizer"], model.policy.optimizer, name)
            else:
                state_dicts.pop("policy.optimizer", None)
            model.set_parameters(state_dicts, exact_match=read_optimizer, device=device)
        if model.ref_model is not None and not held:  # saved without one (beta was 0): a copy of the loaded policy
            checks.check_reference_kept(saved.reference, name)
            if saved.sharded_weights:  # (set_parameters made a whole file's)
                model._refresh_reference()
        check_finite_weights(model.policy, f"the model {name!r}")  # whole or sharded: each rank checks what it holds
        if model.ref_model is not None:  # a NaN there would make every step's KL NaN, and every step skipped
            where = "its checkpoint's shards" if saved.sharded_weights else "ref_model.pth"
            check_finite_weights(model.ref_model, f"the frozen reference of {name!r} ({where})", checks.DAMAGED_FIX)
        model.set_run_state(saved.state, saved.rng)
        model._loaded_from = name
        if rebuilt and model.env is not None:  # the env the file records: its states must fit it, said now
            checks.check_env_states(model._pending_env_states, model.env, name)
        return model

    def _precision_text(self) -> str:
        """Each stage's precision, why, and the sampler correction when it is on (printed and in TensorBoard)."""
        text = self.precision.describe()
        if self._sampler_correction is not None:
            text += f"\nsampler correction: {self._sampler_correction} (see algorithms.common.sampler_correction)"
        return text

    def get_env(self) -> VecEnv | MissingEnv | None:  # type: ignore[override]
        """SB3's ``get_env``: the training env, or ``None`` without one; for a model :meth:`load` could not rebuild the
        recorded env for, a :class:`~algorithms.common.env_util.MissingEnv` (false like ``None``) whose every use
        says what to pass."""
        if self.env is None and self._env_missing:
            return MissingEnv(self._env_missing)
        return self.env

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts = ["policy", "policy.optimizer"] + (["ref_model"] if self.ref_model is not None else [])
        return state_dicts, []

    def set_parameters(self, load_path_or_dict: str | dict[str, Any], exact_match: bool = True, device="auto") -> None:
        """SB3's ``set_parameters``, tolerant of a changed ``beta``: a saved reference is dropped when ``beta``
        is now 0, and a missing one is rebuilt from the loaded policy when ``beta`` is now > 0. A model file is read
        safely (:func:`~algorithms.common.saving.model_file.read_model_file`); one that holds LoRA adapters only gets
        the base weights this policy read from the base model's folder. A file that lacks a weight entry (the
        reference's too, when it records that its run kept one) is refused, naming it."""
        if not isinstance(load_path_or_dict, dict):
            path = load_path_or_dict
            data, load_path_or_dict, _ = read_model_file(path)
            name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else "the model file"
            if data.get("weights") == run_file.SHARDED_WEIGHTS:
                raise ValueError(
                    f"{name}: its weights are the shards of its checkpoint folder, which set_parameters does not read; "
                    f"load it with {type(self).__name__}.load(path)"
                )
            kept = data.get("format") == FORMAT and data.get("reference") is True  # its run kept a frozen reference
            checks.check_weight_entries(load_path_or_dict, name, reference=kept)
        params = dict(load_path_or_dict)
        if "policy" in params:  # a file of adapters only: the base weights are those read from the base's folder
            params["policy"] = self.policy.completed_state_dict(params["policy"])
        saved_reference = params.pop("ref_model", None)
        reference, self.ref_model = self.ref_model, None  # load the policy and optimizer alone, then the reference
        if self._parallel.sharded:  # every rank reads the whole tensors and keeps its shards
            load_full_state(self.policy, params["policy"], self.policy.optimizer, params.get("policy.optimizer"))
        else:
            super().set_parameters(params, exact_match, device)
        self.ref_model = reference
        if reference is not None and saved_reference is not None:
            load_full_state(reference, saved_reference)
        else:
            self._refresh_reference()
        self.push_weights()  # the engine samples with the loaded weights

    def get_parameters(self) -> dict[str, dict[str, Any]]:
        """SB3's state dicts by name; with ``sharding="fsdp"`` whole tensors gathered to rank 0 on the CPU (a
        collective: every rank calls it, the others get empty dicts)."""
        if self._parallel.sharded:
            return self._parallel.whole_parameters(self.policy, self.ref_model)
        return super().get_parameters()

    def save_pretrained(self, directory: str, merge: bool = False) -> None:
        """Export the policy as a standard Hugging Face folder (model + the env's tokenizer); with LoRA a peft
        adapter folder, or the merged model with ``merge=True`` (see :meth:`TransformerPolicy.save_pretrained`)."""
        tokenizer = self.env.get_attr("tokenizer", indices=[0])[0] if self.env is not None else None
        state = None
        if self._parallel.sharded:  # gathered to rank 0, which writes (a collective)
            state = self._parallel.whole_state_dict(self.policy.model)
            if not self._dist.is_main:
                return
        self.policy.save_pretrained(directory, tokenizer=tokenizer, merge=merge, state_dict=state)

    def save_gguf(self, path: str, type: str = "f16", force: bool = False) -> Path:
        """Export the policy as a GGUF file that llama.cpp, Ollama and LM Studio run, with an Ollama ``Modelfile``
        beside it (:func:`~algorithms.common.saving.gguf_export.save_gguf`): LoRA adapters merged, the env's
        tokenizer and training prompt, the policy's sampling settings; a model trained from a GGUF file writes back
        that file's metadata. Returns the file written.

        :param path: the ``.gguf`` file (an existing one only with ``force``)
        :param type: ``f32``, ``f16``, ``bf16``, ``q8_0``, ...
            (:func:`~algorithms.common.saving.gguf_export.export_types`)
        :param force: replace ``path`` and the ``Modelfile`` beside it when they exist
        """
        from algorithms.common.saving.gguf_export import export_info, save_gguf

        if self.env is None:
            raise ValueError("save_gguf needs the model's env (its tokenizer): load the model with env=...")
        state = self._parallel.whole_state_dict(self.policy.model) if self._parallel.sharded else None
        if not self._dist.is_main:  # gathered to rank 0, which writes (a collective)
            return Path(path)
        if self.policy.lora is not None:  # the adapters merged into a copy; the policy keeps them
            model = self.policy._plain_copy(state).merge_and_unload()
        else:
            model = self.policy.model if state is None else self.policy._plain_copy(state)
        tokenizer = self.env.get_attr("tokenizer", [0])[0]
        return save_gguf(model, tokenizer, path, type, export_info(self), force)

    # ------------------------------------------------------------------ steps every update shares
    def _start_gradient_sync(self) -> None:
        """Several processes, once after the cold start: DDP copies rank 0's weights everywhere and makes its
        reducer."""
        self._parallel.start(self.policy, self.ref_model)

    def _optimizer_step(self, loss: th.Tensor | None) -> th.Tensor:
        """Backward (unless ``loss`` is None: the gradients are there already), unscale (fp16), clip and step;
        a step with non-finite gradients is skipped and counted, and the first one warned of (:meth:`_warn_skipped`)."""
        optimizer = self.policy.optimizer
        if loss is not None:
            optimizer.zero_grad(set_to_none=True)
            (loss if self._scaler is None else self._scaler.scale(loss)).backward()
        self._parallel.reduce()  # several processes: the sum of every rank's (share-weighted) gradient
        if self._scaler is not None:
            self._scaler.unscale_(optimizer)
        grad_norm = clip_grad_norm(self.policy.parameters(), self.max_grad_norm)
        finite = bool(th.isfinite(grad_norm))
        if self._scaler is not None:
            self._scaler.step(optimizer)  # skips the step itself when the unscaled gradients hold inf or NaN
            self._scaler.update()
        elif finite:
            optimizer.step()
        if finite:
            self._n_updates += 1
        else:
            self._skipped_steps += 1
            optimizer.zero_grad(set_to_none=True)
            self._warn_skipped()
        return grad_norm

    def _warn_skipped(self) -> None:
        """Warn, once per model, that an optimizer step was skipped for non-finite gradients, with the likely causes
        and their fixes (before, only ``train/skipped_steps`` said so, and every step of a run could be skipped). Not
        with fp16's loss scaler: it skips a step whose scaled gradients overflow and lowers its scale, as it should."""
        if self._warned_skipped or self._scaler is not None:
            return
        self._warned_skipped = True
        warnings.warn(
            f"iteration {self._iteration}: an optimizer step was skipped, its gradients were not finite (inf or NaN); "
            "each such step is skipped (train/skipped_steps counts them), so the policy may not learn at all. Likely "
            "causes: rewards too large for unscaled advantages (GRPO's advantage_scale='none', RLOO) or for a value "
            "baseline (LMPPO's value loss): scale the rewards down (to about -1..1), or with GRPO use "
            "advantage_scale='group'; or a learning rate too high: lower learning_rate. (Warned once.)",
            UserWarning,
            stacklevel=user_stacklevel(),
        )

    def _reference_log_probs(self, batch: RolloutBatch) -> th.Tensor:
        """``(N, C)`` log-probs of the batch's completions under the frozen reference."""
        with th.no_grad(), reference_network(self.policy, self.ref_model) as reference:
            args = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
            return self.policy.log_probs(*args, model=reference)[0]

    # ------------------------------------------------------------------ rollouts
    def gathered_policy(self) -> contextlib.AbstractContextManager:
        """The policy's whole weights on every rank for the block, so that one rank may sample alone (e.g. rank 0
        evaluating); with ``sharding="fsdp"`` they are gathered, a collective every rank enters."""
        return self._parallel.gathered(self.policy.model)

    def predict(
        self, observation: Any, state: Any = None, episode_start: Any = None, deterministic: bool = False
    ) -> tuple[Any, Any]:
        """SB3's ``predict``; with ``sharding="fsdp"`` on several processes a collective (every rank calls it)."""
        with self.gathered_policy():
            return super().predict(observation, state, episode_start, deterministic)

    # ------------------------------------------------------------------ the loop, and what an algorithm adds to it
    def learn(
        self: SelfLMBaseAlgorithm,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str | None = None,
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfLMBaseAlgorithm:
        """Train for at least ``total_timesteps`` completions (rounded up to whole iterations of K x G), as SB3's
        ``OnPolicyAlgorithm.learn``. Each iteration: collect a rollout and build its batch (:meth:`collect_rollouts`,
        the algorithm's :meth:`_build_batch`: returns and advantages), count it (:meth:`_next_iteration`: a restore
        of the collapse guard skips the update), update (the algorithm's :meth:`train`), then
        :meth:`_end_iteration` (the finite-state check, the engine's weights, the logs). With ``max_staleness >= 1``
        the same steps run with sampling overlapping the update
        (:class:`~algorithms.common.overlapped_learning.OverlappedLoop`)."""
        total_timesteps, callback = self._start_learning(
            total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar
        )
        if self.overlapped is not None:
            self.overlapped.run(total_timesteps, callback, log_interval)
        else:
            while self.num_timesteps < total_timesteps:
                if not self.collect_rollouts(self.env, callback):  # a callback stopped training
                    break
                if not self._next_iteration(total_timesteps, callback):  # the collapse guard restored a snapshot
                    continue
                with deterministic_on_cpu(self.device):
                    self.train()
                self._end_iteration(log_interval)
        callback.on_training_end()
        return self

    def _build_batch(self, rows: Rows, generation_seconds: float) -> RolloutBatch:
        """The rollout's rows (this process's groups) as the batch the update trains on: the algorithm's returns and
        advantages, ``(N,)`` per row or ``(N, C)`` per token (:meth:`_episode_returns` and :meth:`_rows_batch` do the
        common part and the rollout's logs)."""
        raise NotImplementedError

    def _episode_returns(self, rows: Rows, generation_seconds: float) -> th.Tensor:
        """``(E, U)`` each turn's discounted return to the end of its episode, for this process's ``E`` episodes
        (column 0: the episodes' returns, ``[rows.episodes, rows.turns]`` each row's); the rollout's ``rollout/*``
        logs, on every process's returns."""
        to_go = turn_returns(rows, self._local_groups * self.group_size, self.gamma)  # (E, U)
        everyone = self._dist.gather(to_go[:, 0]).view(-1, self.group_size)  # (K, G) of every process
        log_rollout(self.logger, self._dist, everyone, rows.masks, rows.infos, generation_seconds)
        return to_go

    def _rows_batch(self, rows: Rows, advantages: th.Tensor, returns: th.Tensor) -> RolloutBatch:
        """Every row of the rollout as a batch, with ``advantages`` and ``returns`` per episode ``(E,)``: each turn
        gets its episode's; the groups numbered across processes."""
        n_episodes = self._local_groups * self.group_size
        groups = self._dist.rank * self._local_groups + th.arange(n_episodes) // self.group_size  # (E,)
        keep = list(range(len(rows.episodes)))
        return rows_to_batch(rows, keep, advantages, returns, groups, self.policy.pad_token_id, self.device)

    def train(self) -> None:
        """Update the policy on the last rollout: the algorithm's loss."""
        raise NotImplementedError

    def _update_policy(
        self,
        loss: LossFunction,
        n_epochs: int = 1,
        batch_size: int | None = None,
        aggregation: str = "token",
        with_entropy: bool = False,
        with_values: bool = False,
        stop: Callable[[dict[str, Any]], bool] | None = None,
        sequential: bool = False,
        prune: bool = False,
    ) -> dict[str, list[float]]:
        """The update step every algorithm shares; it gives its loss. ``n_epochs`` passes over the last rollout (and
        what :meth:`_extend_batch` adds) in minibatches of ``batch_size`` rows (``None``: the whole rollout;
        ``sequential``: one group after the other; this process's rows, each minibatch weighted by its share of every
        process's loss), an optimizer step on ``loss`` each (:meth:`_step`); the sampler correction first (when on,
        the batch has no weights yet and the loss does not take it from its own pass, :meth:`_corrects_in_pass`);
        the ``train/*`` logs (each stat's mean, the sampler KL measured before the first step, the steps skipped and
        taken). Returns each stat's values per step.

        :param loss: the algorithm's loss (:data:`~algorithms.common.losses.LossFunction`)
        :param aggregation: how the loss reduces its tokens (``"token"``: the minibatches weighted by tokens, else rows)
        :param with_entropy: the outputs carry the entropies (an entropy bonus)
        :param with_values: the outputs carry the value head's estimates
        :param stop: called with a minibatch's stats before its step; True ends the update there (SB3's
            ``target_kl``)
        :param sequential: one minibatch per group, in order (GRPO's ``update_mode="sequential"``)
        :param prune: rows whose advantage is zero add nothing to the loss (no KL, entropy or value term): leave them
            out of the forward and backward passes (:func:`~algorithms.common.rollout.batch.rows_with_gradient`)
        """
        assert self._rollout is not None, "collect_rollouts() must run before train()"
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        self._start_gradient_sync()
        batch, measured = self._rollout, None
        if self._sampler_correction is not None and batch.sampler_weights is None and not self._corrects_in_pass():
            batch, measured = self._correct_rollout(batch)
        batch = self._extend_batch(batch)
        history: dict[str, list[float]] = {}
        spec = UpdateLoss(loss, aggregation, with_entropy, with_values, stop)
        for _ in range(n_epochs):
            parts = minibatches(batch, batch_size, sequential, aggregation, self._minibatch_generator, self._dist,
                                self._placeholder)  # fmt: skip
            for minibatch, share in parts:
                ran = rows_with_gradient(minibatch) if prune else minibatch
                step = self._step(minibatch, ran, share, spec)
                if measured is None:  # before any step: the update's weights are the sampler's
                    measured = sampler_kl_of_fresh(ran, step.log_probs.detach())
                if step.stats is None:  # stopped before its step
                    return self._log_update(history, measured)
                record_step(history, step.loss, step.stats)
        return self._log_update(history, measured)

    def _step(self, minibatch: RolloutBatch, ran: RolloutBatch, share: float, spec: UpdateLoss) -> Step:
        """One optimizer step on ``minibatch``: the policy's forward pass on ``ran`` (its rows that can carry a
        gradient, or all), the loss on them weighted by their share of the minibatch's, the guarded step on it times
        this process's ``share`` (:meth:`_optimizer_step`), its stats completed by :func:`step_stats`; ``stats`` is
        ``None`` when the loss's ``stop`` ended the update before the step."""
        args = (ran.prompt_ids, ran.prompt_mask, ran.completion_ids, ran.completion_mask)
        outputs = PolicyOutputs(*self.policy.log_probs(*args, with_entropy=spec.with_entropy,
                                                       with_values=spec.with_values))  # fmt: skip
        value, stats = spec.function(ran, outputs)
        if ran is not minibatch:  # the minibatch's loss: the rows left out add exactly zero to it
            part = loss_share(ran, minibatch, spec.aggregation)
            value = value * part
            stats = {key: stat * part if key == "policy_loss" else stat for key, stat in stats.items()}
        if spec.stop is not None and spec.stop(stats):
            return Step(value, None, outputs.log_probs)
        return Step(value, step_stats(minibatch, stats, self._optimizer_step(value * share)), outputs.log_probs)

    def _corrects_in_pass(self) -> bool:
        """Whether the algorithm's loss takes the sampler correction from the update's own forward pass (GRPO's, when
        the update is one step on the whole fresh rollout), so :meth:`_update_policy` makes no pass of its own."""
        return False

    def _correct_rollout(self, batch: RolloutBatch) -> tuple[RolloutBatch, th.Tensor]:
        """The sampler correction of the fresh rollout against the update's weights (one forward pass, no gradient):
        the corrected batch and the sampler KL; logs the share of tokens the correction truncated (``"tis"``) or
        rows it left out (``"mask"``)."""
        cap, mode = self.sampler_correction_cap, self._sampler_correction
        corrected, measured = correction.correct_fresh_rollout(self.policy, batch, cap, mode)
        if mode == "mask":
            self.logger.record("train/sampler_masked_fraction", correction.masked_fraction(corrected))
        else:
            clipped = correction.truncated_fraction(
                corrected.old_log_probs, batch.old_log_probs, corrected.completion_mask, cap
            )
            self.logger.record("train/sampler_clipped_fraction", float(clipped))
        return corrected, measured

    def _extend_batch(self, batch: RolloutBatch) -> RolloutBatch:
        """What the update trains on besides the fresh (corrected) rollout ``batch``: the batch itself here; GRPO adds
        its replayed rows."""
        return batch

    def _log_update(self, history: dict[str, list[float]], measured: th.Tensor | None) -> dict[str, list[float]]:
        """The ``train/*`` logs every update writes: each stat's mean over its steps, the sampler KL measured before
        the first step, the steps skipped (non-finite) and taken, the update count."""
        for key, values in history.items():
            self.logger.record(f"train/{key}", float(np.mean(values)))
        if measured is not None:
            self.logger.record("train/sampler_kl", float(measured))
        self.logger.record("train/skipped_steps", self._skipped_steps)
        self.logger.record("train/optimizer_steps", len(history.get("loss", [])))
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        return history

    # ------------------------------------------------------------------ one rollout
    def collect_rollouts(self, env: VecEnv, callback: BaseCallback) -> bool:
        """SB3's ``collect_rollouts``: one rollout, collected by :attr:`rollouts` (with ``sharding="fsdp"`` the
        sampler's whole weights gathered meanwhile), its batch built (:meth:`end_rollout`); False when a callback
        stopped training."""
        from_reference = self._sampling.from_reference(self._iteration, self.logger)
        with self._parallel.gathered(self.policy.model, self.ref_model if from_reference else None):
            return self.end_rollout(self.rollouts.collect(env, callback), callback)

    def end_rollout(self, collected: Collected | None, callback: BaseCallback) -> bool:
        """The batch of a rollout :attr:`rollouts` played (the algorithm's :meth:`_build_batch`), then the
        callbacks' ``on_rollout_end``; False when a callback stopped training during the rollout (``None``)."""
        if collected is None:
            return False
        self._rollout = self._build_batch(collected.rows, collected.generation_seconds)
        self._boundary = None
        if self._overlap is not None:  # the producer samples the next rollout while the update shuffles
            self._overlap.update_generator.set_state(collected.generator_state)
        callback.update_locals({"rows": collected.rows, "collected": collected})
        callback.on_rollout_end()
        return True

    @property
    def _minibatch_generator(self) -> th.Generator:
        """What shuffles the update's minibatches: the rollouts' generator as the rollout left it, or with
        ``max_staleness`` its copy taken then (the producer draws the next rollout's noise meanwhile)."""
        return self._seeds.generator if self._overlap is None else self._overlap.update_generator

    # ------------------------------------------------------------------ the steps around an algorithm's update
    def _start_learning(
        self, total_timesteps: int, callback: MaybeCallback, reset_num_timesteps: bool, tb_log_name: str | None,
        progress_bar: bool,
    ) -> tuple[int, BaseCallback]:  # fmt: skip
        """What ``learn`` does before its first iteration: SB3's ``_setup_learn`` (the envs reset, the logger on the
        run ``tb_log_name``, default the class's name), the curriculum's callback, the cold start when it is due, the
        callbacks' ``on_training_start``, the engine given the weights (synchronous learning); the total and the
        callback, as ``_setup_learn`` returns them."""
        self._check_has_env()
        tb_log_name = tb_log_name or type(self).__name__
        total_timesteps, callback = self._setup_learn(
            total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar
        )
        if self.curriculum:  # one curriculum per model: its level carries over from one learn() to the next
            self._curriculum = self._curriculum or CurriculumCallback()
            callback = CallbackList([callback, self._curriculum])
            callback.init_callback(self)
        self.logger.record("precision/choice", self._precision_text(), exclude=TEXT_ONLY)  # with the next dump
        if self.needs_cold_start():
            self.run_cold_start(progress_bar)
        callback.on_training_start(locals(), globals())
        if self.overlapped is None:  # (max_staleness >= 1 samples with the built-in sampler: no engine to push to)
            self.push_weights()  # whatever changed the weights since the engine last got them
        return total_timesteps, callback

    def _next_iteration(self, total_timesteps: int, callback: BaseCallback) -> bool:
        """Count the iteration whose rollout was just collected; False when the collapse guard (when on) judged the
        policy fallen and put its best snapshot back: the update is then skipped (the restore is logged)."""
        self._engine.sleep()  # a GPU vLLM engine frees its memory until the next push
        self._iteration += 1
        self._update_current_progress_remaining(self.num_timesteps, total_timesteps)
        if self._guard is None or not self._guard_restored(callback):
            return True
        self.push_weights()  # the restored weights
        self.dump_logs()  # the restore's figures; no update on the rollout the fallen policy sampled
        return False

    def _end_iteration(self, log_interval: int | None) -> None:
        """After an update: a NaN or inf in a weight or optimizer moment stops the run here, naming the iteration,
        before any checkpoint or save is written; the engine gets the new weights; the logs every ``log_interval``
        iterations."""
        self.check_finite_state(f"training stopped at iteration {self._iteration}", agreed=True)
        self.push_weights()
        if log_interval is not None and self._iteration % log_interval == 0:
            self.dump_logs()

    # ------------------------------------------------------------------ collapse guard
    def _guard_restored(self, callback: BaseCallback) -> bool:
        """Let the collapse guard judge this iteration; True when it put the best snapshot back (logged)."""
        guard = self._guard
        assert guard is not None
        figure = self._guard_figure(callback)
        restored = guard.check(figure, self._iteration, self.policy, self.policy.optimizer)
        self.logger.record("guard/restores", guard.restores)
        self.logger.record("guard/lr_scale", guard.lr_scale)
        if guard.best is not None:
            self.logger.record("guard/best_success", guard.best)
        if guard.recent:
            self.logger.record("guard/success", float(np.mean(guard.recent)))
        if restored and self.verbose >= 1:
            print(guard.describe_last_event(self.lr_schedule(self._current_progress_remaining) * guard.lr_scale))
        return restored

    def _guard_figure(self, callback: BaseCallback) -> float | None:
        """This iteration's figure for the collapse guard (:meth:`CollapseGuard.figure`)."""
        assert self._guard is not None
        return self._guard.figure(self._iteration, self.env, self.policy, self._rollout_successes, callback, self._dist)

    def _update_learning_rate(self, optimizers: list[th.optim.Optimizer] | th.optim.Optimizer) -> None:
        """SB3's, with the collapse guard's scale: the schedule's rate times ``lr_scale`` (1 without a restore)."""
        scale = self._guard.lr_scale if self._guard is not None else 1.0
        rate = self.lr_schedule(self._current_progress_remaining) * scale
        self.logger.record("train/learning_rate", rate)
        for optimizer in optimizers if isinstance(optimizers, list) else [optimizers]:
            update_learning_rate(optimizer, rate)

    def _check_has_env(self) -> None:
        """A clear error when there is no env to train on (e.g. a loaded model whose recorded env was not rebuilt)."""
        if self.env is None:
            why = self._env_missing or "it was made or loaded without one"
            raise ValueError(
                f"{type(self).__name__}.learn needs an env: {why}. Pass one with model.set_env(env), or load with "
                f"{type(self).__name__}.load(path, env=...) or load(path, env_objects={{...}})"
            )

    def _setup_learn(
        self, total_timesteps, callback=None, reset_num_timesteps=True, tb_log_name="run", progress_bar=False
    ):
        """SB3's ``_setup_learn`` (which resets the envs), then the env states of a loaded run put back."""
        result = super()._setup_learn(total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar)
        if self._pending_env_states is not None and self.env is not None:
            checks.check_env_states(self._pending_env_states, self.env, self._loaded_from)  # applies each state
            self._pending_env_states = None
        return result

    def start_run(self, tb_log_name: str | None = None) -> None:
        """Set up what :meth:`learn` sets up first (SB3's ``_setup_learn``: the counters and episode statistics, the
        envs reset, the logger on a new TensorBoard run ``<tensorboard_log>/<tb_log_name>_<n>``) for a stage run
        before it: the cold start called alone (:meth:`run_cold_start`), as ``grpo-gym train`` and ``sft`` do. A
        later ``learn(..., reset_num_timesteps=False)`` continues that run and logs to the same folder."""
        self._setup_learn(0, None, True, tb_log_name or type(self).__name__, False)

    def needs_cold_start(self) -> bool:
        """Whether the next :meth:`learn` runs the cold-start SFT stage first (``cold_start``, ``sft_steps``, and
        for ``"auto"`` whether the policy is a freshly initialised built-in model; warns when a pretrained model
        looks untrained)."""
        if self._cold_start_done or self.sft_steps <= 0:
            return False
        if self.cold_start == "auto" and not self.policy.is_builtin and self.env is not None and self._dist.is_main:
            check_pretrained(self.policy, self.env, self.sft_steps, self.verbose)  # warns if it looks untrained
        return bool(self.policy.is_builtin) if self.cold_start == "auto" else bool(self.cold_start)

    def run_cold_start(self, progress_bar: bool = False) -> dict[str, float]:
        """The cold-start SFT stage; rebuilds the reference from its result. Logged under ``sft/``;
        ``progress_bar`` shows its steps (a bar on a terminal, a line per tenth otherwise)."""
        assert self.env is not None
        if getattr(self, "_logger", None) is None:  # called before learn(): log to stdout (verbose) only
            self._logger = configure_logger(self.verbose, None, type(self).__name__, True)
        if self._last_obs is None:  # called before learn(): a reset applies the env's seed before problems are drawn
            self._last_obs = self.env.reset()
        with deterministic_on_cpu(self.device):
            stats = supervised_finetune(
                self.policy,
                self.env,
                steps=self.sft_steps,
                batch_size=self.sft_batch_size,
                learning_rate=self.sft_learning_rate,
                data=self.sft_data,
                generator=self._seeds.generator,
                logger=self.logger,
                verbose=self.verbose,
                progress_bar=progress_bar,
                loss_weight=self._parallel.sft_loss_weight,
            )
        self.check_finite_state("the cold start stopped", agreed=True)
        self._cold_start_done = True
        self._refresh_reference()
        self.push_weights()
        return stats

    def dump_logs(self) -> None:
        """Write the recorded values (SB3's ``rollout/``, ``time/`` keys plus the algorithm's) at ``num_timesteps``."""
        elapsed = max((time.time_ns() - self.start_time) / 1e9, 1e-9)
        self.logger.record("time/iterations", self._iteration, exclude="tensorboard")
        if self.ep_info_buffer:
            self.logger.record("rollout/ep_rew_mean", safe_mean([info["r"] for info in self.ep_info_buffer]))
            self.logger.record("rollout/ep_len_mean", safe_mean([info["l"] for info in self.ep_info_buffer]))
        if self.ep_success_buffer:
            self.logger.record("rollout/success_rate", safe_mean(self.ep_success_buffer))
        self.logger.record("time/fps", int((self.num_timesteps - self._num_timesteps_at_start) / elapsed))
        self.logger.record("time/time_elapsed", int(elapsed), exclude="tensorboard")
        self.logger.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")
        self.logger.dump(step=self.num_timesteps)
