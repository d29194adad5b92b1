"""``LMAlgorithm``: what every on-policy algorithm for language models on R1Zero-style envs shares.

The role SB3's ``OnPolicyAlgorithm`` plays for PPO and A2C: the SB3 surface (``learn``, ``save``/``load``,
callbacks, logging) and the steps of the data flow that do not depend on how an algorithm turns rewards into
a loss. One iteration::

    learn ─► collect_rollouts: K problems, G completions each, sampled in one batch (policy.generate),
             stepped through the env(s) ─► Rows ─► _build_batch (the subclass: advantages, kept rows)
          ─► train (the subclass: minibatches, loss, _optimizer_step) ─► dump_logs

Rollout collection lives in :mod:`~algorithms.common.collection` (a mixin of this class).
Subclasses implement ``_build_batch(rows, generation_seconds)`` and ``train()``, and may override
``_before_rollout(env)`` and ``_samples_from_reference()``. The cold start, the frozen reference, mixed precision,
several processes (S17), the guarded optimizer step and the reference's log-probs live here.

The frozen reference is a copy of the policy's network (``ref_model``), or with LoRA adapters the policy's own
network with its adapters disabled, i.e. the base model, with no copy (``ref_model`` stays None; see
:mod:`algorithms.common.adapters`); :meth:`LMAlgorithm._reference` gives whichever it is.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import json
import os
import time
from typing import Any, ClassVar, TypeVar

import gymnasium as gym
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import CallbackList
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from stable_baselines3.common.utils import configure_logger, get_system_info, safe_mean
from stable_baselines3.common.vec_env import VecEnv

import grpo_gym  # noqa: F401  (registers R1Zero-v0, so Algorithm("TransformerPolicy", "R1Zero-v0") works)
from algorithms.common import state
from algorithms.common.arguments import LM_ALGORITHM_RULES, check_arguments
from algorithms.common.batch import RolloutBatch
from algorithms.common.callbacks import CurriculumCallback
from algorithms.common.cold_start import supervised_finetune
from algorithms.common.collection import RolloutCollection
from algorithms.common.determinism import deterministic_on_cpu
from algorithms.common.distributed import Distributed, GradientSync
from algorithms.common.policies import TransformerPolicy
from algorithms.common.precision import ProbeShape, choose_precision
from algorithms.common.rollout import TEXT_ONLY
from algorithms.common.serialization import read_model_file
from algorithms.common.vocabulary import check_embedding_rows, check_model_tokenizer, model_tokenizer
from grpo_gym.validation import check_mapping

SelfLMAlgorithm = TypeVar("SelfLMAlgorithm", bound="LMAlgorithm")
#: the arguments SB3's BaseAlgorithm stores itself
BASE_ALGORITHM_ARGUMENTS = {"learning_rate", "stats_window_size", "tensorboard_log", "verbose", "seed"}
#: the keys policy_kwargs may hold: TransformerPolicy's arguments but those the algorithm passes itself
POLICY_KEYS = tuple(
    name
    for name in inspect.signature(TransformerPolicy.__init__).parameters
    if name not in ("self", "observation_space", "action_space", "lr_schedule")
)


def _tokenizer_of(model: Any) -> dict[str, Any]:
    """``{"tokenizer": folder}`` when the model comes from a folder or hub name that ships a tokenizer: an env
    made from an id then speaks the model's vocabulary (the tokenizer guard's fix, applied for the caller)."""
    return {"tokenizer": os.fspath(model)} if model_tokenizer(model) is not None else {}


class LMAlgorithm(RolloutCollection, BaseAlgorithm):
    """Base class of the language-model algorithms (GRPO, the PPO baseline): see the module docstring.

    The constructor arguments are documented on the subclasses, which pass them through.
    """

    policy_aliases: ClassVar[dict[str, type[TransformerPolicy]]] = {"TransformerPolicy": TransformerPolicy}
    policy: TransformerPolicy

    def __init__(
        self,
        policy: str | type[TransformerPolicy],
        env: GymEnv | str | None,
        learning_rate: float | Schedule,
        n_groups: int,
        group_size: int,
        max_grad_norm: float,
        gamma: float,
        gradient_compression: str | None,
        dist_timeout: float,
        mixed_precision: str,
        cold_start: bool | str,
        sft_steps: int,
        sft_batch_size: int,
        sft_learning_rate: float,
        sft_data: str | None,
        curriculum: bool,
        stats_window_size: int,
        tensorboard_log: str | None,
        policy_kwargs: dict[str, Any] | None,
        verbose: int,
        seed: int | None,
        device: th.device | str,
    ) -> None:
        given = dict(locals())
        checked = check_arguments({name: given[name] for name in LM_ALGORITHM_RULES}, LM_ALGORITHM_RULES)
        if checked["sft_data"] is not None and not os.path.isfile(checked["sft_data"]):
            raise ValueError(f"sft_data {sft_data!r} is not a file; pass a JSONL file of prompt/response rows")
        if isinstance(env, str):  # SB3 would ask for render_mode="rgb_array", which a text env does not have
            env = gym.make(env, **_tokenizer_of((policy_kwargs or {}).get("model")))
        self._dist = Distributed(timeout=checked["dist_timeout"])
        device = self._dist.device(device)
        if not self._dist.is_main:  # S17: only rank 0 logs and prints
            checked["tensorboard_log"], checked["verbose"] = None, 0
        super().__init__(
            policy,
            env,
            learning_rate=checked["learning_rate"],
            policy_kwargs=check_mapping("policy_kwargs", policy_kwargs, POLICY_KEYS),
            stats_window_size=checked["stats_window_size"],
            tensorboard_log=checked["tensorboard_log"],
            verbose=checked["verbose"],
            device=device,
            support_multi_env=True,
            seed=checked["seed"],
        )
        for name in LM_ALGORITHM_RULES.keys() - BASE_ALGORITHM_ARGUMENTS:
            setattr(self, name, checked[name])
        self._sync: GradientSync | None = None
        self._placeholder = False  # this rank's groups were all left out: one weightless row keeps ranks in step
        self._skipped_steps = 0
        self.ref_model: th.nn.Module | None = None
        self._n_updates = 0
        self._iteration = 0
        self._cold_start_done = False
        self._token_info: dict[str, int] = {}
        self._rollout: RolloutBatch | None = None
        self._in_rollout = False  # a rollout is being collected: a save records the state at its start
        self._boundary: tuple[dict[str, Any], dict[str, th.Tensor]] | None = None
        self._pending_env_states: list[dict[str, Any]] | None = None  # from load(), applied when training starts

    # ------------------------------------------------------------------ setup
    def _setup_model(self) -> None:
        """Seeds, the sampler's generator, the problem seeds, the policy, mixed precision, the reference."""
        self._setup_lr_schedule()
        self.set_random_seed(self.seed)
        # one seed for the whole job (every rank draws the same numbers): the problems and the sampling noise of
        # group k at iteration t do not depend on the number of processes (see collect_rollouts)
        seed = self.seed if self.seed is not None else int(self._dist.gather_objects(int(th.randint(2**62, (1,))))[0])
        self._sampling_seed = seed
        self._generator = th.Generator(device=self.device)
        self._generator.manual_seed(seed)
        self._problem_rng = np.random.default_rng(seed)
        if self.env is not None:
            self._check_env(self.env)
        tokenizer = self.env.get_attr("tokenizer", indices=[0])[0] if self.env is not None else None
        verified = tokenizer is not None and check_model_tokenizer(tokenizer, self.policy_kwargs.get("model"))
        kwargs = {"seed": self.seed, **self._token_info, **self.policy_kwargs}
        self.policy = self.policy_class(self.observation_space, self.action_space, self.lr_schedule, **kwargs)
        self.policy = self.policy.to(self.device)
        rows = self._local_groups * self.group_size  # what the probe of mixed_precision="auto" times (CPU only)
        shape = ProbeShape.of(self.policy, rows, prompts=self._local_groups, sft_rows=self.sft_batch_size)
        choice = choose_precision(self.mixed_precision, self.device, self.policy, shape) if self._dist.is_main else None
        self.precision = self._dist.gather_objects(choice)[0]  # rank 0 probes (when auto needs it); all run its choice
        self.policy.autocast_dtypes = self.precision.dtypes
        self._scaler = th.amp.GradScaler(self.device.type) if self.precision.needs_scaler else None
        if self.verbose >= 1:
            print(self.precision.describe())
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
        if self._needs_reference():
            self.ref_model = self._frozen_copy()

    def _needs_reference(self) -> bool:
        """Whether a frozen copy of the policy is kept (for a KL term, or to sample from)."""
        return False

    def _check_env(self, env: VecEnv) -> None:
        """Read the token ids the policy needs from the env, and reject what the algorithm cannot train on."""
        if not isinstance(env.action_space, spaces.MultiDiscrete):
            name = type(self).__name__
            raise ValueError(f"{name} trains on whole completions: make the env with action_mode='sequence'")
        if self.n_groups % self._dist.world_size:
            raise ValueError(
                f"n_groups ({self.n_groups}) must be a multiple of the number of processes ({self._dist.world_size}): "
                "each process trains whole groups"
            )
        if (self._local_groups * self.group_size) % env.num_envs:
            raise ValueError(
                f"n_groups / processes * group_size ({self._local_groups * self.group_size}) must be a multiple of the "
                f"number of envs ({env.num_envs})"
            )
        codec = env.get_attr("codec", indices=[0])[0]
        self._token_info = {"eos_token_id": codec.eos_id, "pad_token_id": codec.pad_id}

    def _frozen_copy(self) -> th.nn.Module | None:
        """A frozen copy of the policy's network; None with LoRA, whose reference is the base model (see
        :meth:`_reference`)."""
        if self.policy.lora is not None:
            return None
        reference = copy.deepcopy(self.policy.model).eval()
        reference.requires_grad_(False)
        return reference

    @contextlib.contextmanager
    def _reference(self):
        """The frozen reference network for the duration of the block: ``ref_model``, or with LoRA the policy's own
        network with its adapters disabled (the base model, no copy)."""
        if self.policy.lora is None or self.ref_model is not None:
            yield self.ref_model
            return
        with self.policy.model.disable_adapter():
            yield self.policy.model

    @property
    def _local_groups(self) -> int:
        """The groups this process trains: K / world size."""
        return self.n_groups // self._dist.world_size

    # ------------------------------------------------------------------ save and load
    #: attributes that, besides the constructor's arguments, a run needs to continue exactly (see
    #: :mod:`algorithms.common.state`); subclasses add their own
    state_attributes: ClassVar[tuple[str, ...]] = (
        "num_timesteps",
        "_n_updates",
        "_iteration",
        "_skipped_steps",
        "_cold_start_done",
        "_episode_num",
        "_sampling_seed",
        "_current_progress_remaining",
        "_token_info",
    )

    def save(self, path: str | os.PathLike, exclude: None = None, include: None = None) -> None:
        """Write the model to ``path`` (``.zip`` added when missing), atomically, as plain JSON and weights:
        the constructor's arguments, the weights and optimizer state, and the run state at the last iteration
        boundary (see :mod:`algorithms.common.state`). With several processes only rank 0 writes.

        ``exclude`` and ``include`` (SB3's) are not supported: the file holds arguments and state by name."""
        if exclude or include:
            raise ValueError(
                "save() writes the constructor's arguments and the run state; exclude/include are not supported"
            )
        if self._dist.is_main:
            state.save(self, path)

    @classmethod
    def load(  # type: ignore[override]
        cls: type[SelfLMAlgorithm],
        path: str | os.PathLike | io.BufferedIOBase,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        allow_pickle: bool = False,
        env_objects: dict[str, Any] | None = None,
        rebuild_env: bool = True,
        **kwargs: Any,
    ) -> SelfLMAlgorithm:
        """Load a model written by :meth:`save`, safely: its ``data`` is JSON and its tensors are read with
        ``weights_only=True``; an entry that would need unpickling (a user's own schedule function) is refused
        with an error naming it, unless ``custom_objects`` supplies it or ``allow_pickle=True`` (only for a file
        you trust). ``kwargs`` override saved constructor arguments (e.g. ``tensorboard_log``) or set attributes.

        Without ``env``, the env the file records (its id and constructor arguments, see
        :meth:`~grpo_gym.R1ZeroEnv.describe`) is rebuilt, with ``env_objects`` supplying what a file cannot hold
        (``{"reward_funcs": {...}}``, ``{"task_kwargs": {"data": dataset}}``); when something is missing the model
        loads without an env (a warning names it), predicts and exports but does not train; ``rebuild_env=False``
        skips the rebuild (the policy alone, e.g. to serve it). ``force_reset`` is
        accepted for SB3's signature: the envs are always reset when training starts, then given their saved
        states back."""
        if print_system_info:
            get_system_info()
        return state.load(  # type: ignore[return-value]
            cls, path, env, device, custom_objects, allow_pickle, env_objects, rebuild_env, **kwargs
        )

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts = ["policy", "policy.optimizer"] + (["ref_model"] if self.ref_model is not None else [])
        return state_dicts, []

    def set_parameters(self, load_path_or_dict: str | dict[str, Any], exact_match: bool = True, device="auto") -> None:
        """SB3's ``set_parameters``, tolerant of a changed ``beta``: a saved reference is dropped when ``beta``
        is now 0, and a missing one is rebuilt from the loaded policy when ``beta`` is now > 0. A model file is read
        safely (:func:`~algorithms.common.serialization.read_model_file`); one that holds LoRA adapters only gets
        the base weights this policy read from the base model's folder."""
        if not isinstance(load_path_or_dict, dict):
            load_path_or_dict = read_model_file(load_path_or_dict)[1]
        params = dict(load_path_or_dict)
        if "policy" in params:  # a file of adapters only: the base weights are those read from the base's folder
            params["policy"] = self.policy.completed_state_dict(params["policy"])
        saved_reference = params.pop("ref_model", None)
        wants_reference = self.ref_model is not None
        self.ref_model = None  # load the policy and optimizer alone, then deal with the reference
        super().set_parameters(params, exact_match, device)
        if wants_reference:
            self.ref_model = self._frozen_copy()
            if saved_reference is not None:
                self.ref_model.load_state_dict(saved_reference)

    def save_pretrained(self, directory: str, merge: bool = False) -> None:
        """Export the policy as a standard Hugging Face folder (model + the env's tokenizer); with LoRA a peft
        adapter folder, or the merged model with ``merge=True`` (see :meth:`TransformerPolicy.save_pretrained`)."""
        tokenizer = self.env.get_attr("tokenizer", indices=[0])[0] if self.env is not None else None
        self.policy.save_pretrained(directory, tokenizer=tokenizer, merge=merge)

    # ------------------------------------------------------------------ learning loop
    def learn(
        self: SelfLMAlgorithm,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str | None = None,
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfLMAlgorithm:
        """Train for at least ``total_timesteps`` completions (rounded up to whole iterations of K x G)."""
        tb_log_name = tb_log_name or type(self).__name__
        total_timesteps, callback = self._setup_learn(
            total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar
        )
        if self.curriculum:  # one curriculum per model: its level carries over from one learn() to the next
            self._curriculum = getattr(self, "_curriculum", None) or CurriculumCallback()
            callback = CallbackList([callback, self._curriculum])
            callback.init_callback(self)
        self.logger.record("precision/choice", self.precision.describe(), exclude=TEXT_ONLY)  # with the next dump
        if self._needs_cold_start():
            self.run_cold_start()
        callback.on_training_start(locals(), globals())
        assert self.env is not None
        while self.num_timesteps < total_timesteps:
            if not self.collect_rollouts(self.env, callback):
                break
            self._iteration += 1
            self._update_current_progress_remaining(self.num_timesteps, total_timesteps)
            with deterministic_on_cpu(self.device):
                self.train()
            if log_interval is not None and self._iteration % log_interval == 0:
                self.dump_logs()
        callback.on_training_end()
        return self

    def _setup_learn(
        self, total_timesteps, callback=None, reset_num_timesteps=True, tb_log_name="run", progress_bar=False
    ):
        """SB3's ``_setup_learn`` (which resets the envs), then the env states of a loaded run put back."""
        result = super()._setup_learn(total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar)
        if self._pending_env_states is not None and self.env is not None:
            for index, env_state in enumerate(self._pending_env_states):
                self.env.env_method("set_state", env_state, indices=[index])
            self._pending_env_states = None
        return result

    def train(self) -> None:
        """Update the policy on the last rollout (the subclass's loss)."""
        raise NotImplementedError

    def _needs_cold_start(self) -> bool:
        if self._cold_start_done or self.sft_steps <= 0:
            return False
        return bool(self.policy.is_builtin) if self.cold_start == "auto" else bool(self.cold_start)

    def run_cold_start(self) -> dict[str, float]:
        """The cold-start SFT stage (S20.1); rebuilds the reference from its result. Logged under ``sft/``."""
        assert self.env is not None
        if getattr(self, "_logger", None) is None:  # called before learn(): log to stdout (verbose) only
            self._logger = configure_logger(self.verbose, None, type(self).__name__, True)
        with deterministic_on_cpu(self.device):
            stats = self._supervised_finetune()
        self._cold_start_done = True
        if self.ref_model is not None:
            self.ref_model = self._frozen_copy()
        return stats

    def _supervised_finetune(self) -> dict[str, float]:
        return supervised_finetune(
            self.policy,
            self.env,
            steps=self.sft_steps,
            batch_size=self.sft_batch_size,
            learning_rate=self.sft_learning_rate,
            data=self.sft_data,
            generator=self._generator,
            logger=self.logger,
            verbose=self.verbose,
        )

    # ------------------------------------------------------------------ update helpers
    def _start_gradient_sync(self) -> None:
        """S17, once after the cold start: rank 0's weights everywhere, and the reducer that sums gradients."""
        if not self._dist.enabled or self._sync is not None:
            return
        self._dist.broadcast_module(self.policy)
        if self.ref_model is not None:
            self._dist.broadcast_module(self.ref_model)
        trainable = [p for p in self.policy.parameters() if p.requires_grad]
        self._sync = GradientSync(trainable, self._dist.world_size, self.gradient_compression)

    def _optimizer_step(self, loss: th.Tensor | None) -> th.Tensor:
        """Backward (unless ``loss`` is None: the gradients are there already), unscale (fp16), clip and step;
        a step with non-finite gradients is skipped and counted."""
        optimizer = self.policy.optimizer
        if loss is not None:
            optimizer.zero_grad(set_to_none=True)
            (loss if self._scaler is None else self._scaler.scale(loss)).backward()
        if self._sync is not None:  # S17: the sum of every rank's (share-weighted) gradient
            self._sync.sync()
        if self._scaler is not None:
            self._scaler.unscale_(optimizer)
        grad_norm = th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
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
        return grad_norm

    def _reference_log_probs(self, batch: RolloutBatch) -> th.Tensor:
        """``(N, C)`` log-probs of the batch's completions under the frozen reference."""
        with th.no_grad(), self._reference() as reference:
            args = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
            return self.policy.log_probs(*args, model=reference)[0]

    # ------------------------------------------------------------------ logging
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
