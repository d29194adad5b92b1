"""``TransformerPolicy``: a Stable-Baselines3 policy around a Hugging Face causal language model."""

from __future__ import annotations

import copy
import os
from typing import Any

import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import PyTorchObs, Schedule
from torch import nn

from algorithms.common.generation.completion_pass import completion_log_probs
from algorithms.common.generation.continuation import TurnCache
from algorithms.common.generation.engines.base import RolloutEngine
from algorithms.common.generation.sampler import MIN_TEMPERATURE, Completions, sample
from algorithms.common.model.gradient_checkpointing import DEFAULT_EVERY, checkpoint_every
from algorithms.common.model.loading import is_builtin_model, load_model
from algorithms.common.model.lora import DEFAULTS as LORA_DEFAULTS
from algorithms.common.model.lora import apply_lora, base_network, frozen_base_names, is_peft_model, lora_record
from algorithms.common.runtime.precision import autocast, float32_region
from algorithms.common.saving.atomic import atomic_directory
from grpo_gym.validation import ArgumentError, check_bool, check_float, check_int, check_mapping


class TransformerPolicy(BasePolicy):
    """A causal LM as an SB3 policy: observations are left-padded token windows, actions are completions.

    Log-probs everywhere (sampling, update, reference) are taken under the full softmax of the
    temperature-scaled logits, not the top-p truncated one, so a fresh rollout's importance ratio is exactly 1.
    Dropout is never used: the model stays in eval mode for sampling and for the update, as RL fine-tuning of
    LMs does (TRL's ``disable_dropout``), which keeps that ratio exact for models that have dropout layers.

    :param observation_space: the env's ``Dict(input_ids, attention_mask)`` space
    :param action_space: ``MultiDiscrete([vocab] * max_new_tokens)`` (sequence mode) or ``Discrete(vocab)``
    :param lr_schedule: the learning-rate schedule (the optimizer starts at ``lr_schedule(1)``)
    :param model: a built-in name (``"tiny"``, ``"small"``, ``"medium"``, ``"base"``), a local folder or hub
        name of any ``AutoModelForCausalLM``, or a model object (a ``transformers`` model, or a ``peft.PeftModel``
        with one trainable LoRA adapter)
    :param model_kwargs: config overrides for built-ins (e.g. ``{"num_hidden_layers": 2}``)
    :param model_config: a config dict to build the architecture from without loading weights (what
        ``GRPO.load`` uses, so a saved model loads offline; the weights come from the saved state dict)
    :param lora: train LoRA adapters instead of the whole model (needs ``grpo-gym[peft]``): a dict with keys ``r``
        (16), ``alpha`` (32), ``target_modules`` (``"all-linear"``; None: peft's default), ``dropout`` (0.0: no
        dropout runs), ``adapter_name`` and some of ``peft.LoraConfig``'s own fields (see
        :data:`~algorithms.common.model.lora.LORA_KEYS`). The reference is then the base model (the adapters
        disabled, no copy), and a model from a folder or hub name saves its adapters only: see
        :mod:`algorithms.common.model.lora`. Recorded by the algorithm for a ready ``PeftModel``.
    :param eos_token_id: the env tokenizer's EOS id (a completion ends there)
    :param pad_token_id: the env tokenizer's pad id
    :param temperature: sampling temperature, at least 1e-5 (log-probs use the same scaling)
    :param top_p: nucleus sampling mass (the original design's 0.92)
    :param top_k: top-k filter, 0 for none
    :param memory_length: the most tokens the policy attends to, prompt and completion together (the original
        design's 2048; capped at the model's position limit); older context tokens are cut
    :param value_head: add an FP32 value head on the last prompt token (the value-network baseline)
    :param gradient_checkpointing: checkpoint the decoder's layers in chunks: ``True`` for every 4 layers (the
        original design's), an int N for every N layers, ``False`` for none
        (:mod:`~algorithms.common.model.gradient_checkpointing`)
    :param frozen_parameters: names of the model's parameters that do not train (``requires_grad=False``); the
        algorithm records a given model object's frozen ones here, so they stay frozen after ``load``
    :param seed: seeds a built-in model's initial weights
    :param optimizer_class: the optimizer (AdamW), given the trainable parameters only
    :param optimizer_kwargs: its keyword arguments
    """

    def __init__(
        self,
        observation_space: spaces.Dict,
        action_space: spaces.MultiDiscrete | spaces.Discrete,
        lr_schedule: Schedule,
        model: str | os.PathLike | nn.Module = "tiny",
        model_kwargs: dict[str, Any] | None = None,
        model_config: dict[str, Any] | None = None,
        lora: dict[str, Any] | None = None,
        eos_token_id: int = 1,
        pad_token_id: int = 0,
        temperature: float = 1.0,
        top_p: float = 0.92,
        top_k: int = 0,
        memory_length: int = 2048,
        value_head: bool = False,
        gradient_checkpointing: bool | int = False,
        frozen_parameters: list[str] | None = None,
        seed: int | None = None,
        optimizer_class: type[th.optim.Optimizer] = th.optim.AdamW,
        optimizer_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if optimizer_kwargs is not None and not isinstance(optimizer_kwargs, dict):
            raise ArgumentError(f"optimizer_kwargs must be a dict, got {type(optimizer_kwargs).__name__}")
        if optimizer_kwargs and "lr" in optimizer_kwargs:  # the optimizer's rate is the algorithm's learning_rate
            raise ArgumentError(
                "optimizer_kwargs: 'lr' is set by the algorithm's learning_rate (a number or a schedule); pass "
                "learning_rate=... instead and leave 'lr' out"
            )
        super().__init__(
            observation_space, action_space, optimizer_class=optimizer_class, optimizer_kwargs=optimizer_kwargs or {}
        )
        self.vocab_size = int(observation_space["input_ids"].high.max()) + 1
        self.max_new_tokens = int(action_space.shape[0]) if isinstance(action_space, spaces.MultiDiscrete) else 1
        self.eos_token_id = check_int("eos_token_id", eos_token_id, low=0, high=self.vocab_size - 1)
        self.pad_token_id = check_int("pad_token_id", pad_token_id, low=0, high=self.vocab_size - 1)
        self.temperature = check_float("temperature", temperature, low=MIN_TEMPERATURE, hint="smaller ones overflow")
        self.top_p = check_float("top_p", top_p, low=0.0, high=1.0, low_open=True)
        self.top_k = check_int("top_k", top_k, low=0)
        memory_length = check_int("memory_length", memory_length, low=2)
        check_bool("value_head", value_head)
        if not isinstance(gradient_checkpointing, bool):
            check_int("gradient_checkpointing", gradient_checkpointing, low=1, hint="or True / False")
        seed = check_int("seed", seed, low=0, allow_none=True)
        if model_kwargs is not None:  # config overrides of a built-in model: LlamaConfig's fields
            from transformers import LlamaConfig

            check_mapping("model_kwargs", model_kwargs, LlamaConfig().to_dict())
        self.model_name = model if isinstance(model, (str, os.PathLike)) else None
        self.model_kwargs = dict(model_kwargs or {})
        self.seed = seed
        self.model = self._build_model(model, model_config, lora)
        positions = getattr(self.model.config, "max_position_embeddings", None) or getattr(
            self.model.config, "n_positions", None
        )
        self.memory_length = min(int(memory_length), int(positions)) if positions else int(memory_length)
        if self.memory_length <= self.max_new_tokens:
            raise ValueError(
                f"memory_length ({self.memory_length}, at most the model's {positions} positions) must exceed "
                f"max_new_tokens ({self.max_new_tokens})"
            )
        model_vocab = self.model.get_input_embeddings().num_embeddings
        if model_vocab < self.vocab_size:
            raise ValueError(
                f"the model's vocabulary ({model_vocab} tokens) is smaller than the env tokenizer's "
                f"({self.vocab_size}): make the env use the model's tokenizer, e.g. "
                "gym.make('R1Zero-v0', tokenizer='<model folder>'), or use a built-in model, which adapts to the env"
            )
        self.value_net = nn.Linear(self.model.config.hidden_size, 1, dtype=th.float32) if value_head else None
        self.gradient_checkpointing = gradient_checkpointing
        if gradient_checkpointing:
            checkpoint_every(
                self.model, DEFAULT_EVERY if gradient_checkpointing is True else int(gradient_checkpointing)
            )
        #: the autocast dtype of the model's forward passes per stage ("sampling", "update", "sft"; None or
        #: missing: float32); the algorithm sets it from its mixed_precision (algorithms.common.runtime.precision)
        self.autocast_dtypes: dict[str, th.dtype | None] = {}
        #: the engine the policy's rollouts sample on (:mod:`~algorithms.common.generation.engines`); None: the
        #: built-in sampler directly. Set by the algorithm, which pushes new weights to it after each update.
        self.rollout_engine: RolloutEngine | None = None
        self.model.eval()
        self._freeze(frozen_parameters or [])
        self.make_optimizer(lr_schedule(1))

    def make_optimizer(self, learning_rate: float) -> None:
        """Make the optimizer over the trainable parameters (again after sharding replaced them: see
        :mod:`algorithms.common.runtime.parallel`)."""
        trainable = [p for p in self.parameters() if p.requires_grad]
        self.optimizer = self.optimizer_class(trainable, lr=learning_rate, **self.optimizer_kwargs)

    def _freeze(self, names: list[str]) -> None:
        parameters = dict(self.model.named_parameters())
        unknown = [name for name in names if name not in parameters]
        if unknown:
            raise ValueError(f"frozen_parameters: the model has no parameters {unknown[:3]} (of {len(unknown)})")
        for name in names:
            parameters[name].requires_grad_(False)

    @property
    def frozen_parameters(self) -> list[str]:
        """The names of the model's parameters that do not train."""
        return [name for name, p in self.model.named_parameters() if not p.requires_grad]

    def _build_model(self, model: Any, model_config: dict[str, Any] | None, lora: dict[str, Any] | None) -> nn.Module:
        """The network: the base model (built-in, folder, object, or rebuilt from ``model_config``), with LoRA
        adapters when ``lora`` is given (a ready PeftModel is kept as it is, its adapter recorded in ``lora``)."""
        #: the LoRA adapter's description (``policy_kwargs["lora"]``), None without adapters
        self.lora: dict[str, Any] | None = None
        self._base_names: set[str] = set()  # the frozen base weights a file of adapters only leaves out
        if is_peft_model(model):
            record = lora_record(model)
            if lora is not None and dict(lora) != record:
                raise ValueError(
                    "policy_kwargs: 'model' is a PeftModel already (adapter "
                    f"{record}); leave 'lora' out, or pass the base model with 'lora'"
                )
            self.lora = record
            return model
        # adapters only in the file: the base is read from its folder or hub name again (not rebuilt empty)
        from_folder = lora is not None and self.model_name is not None and not is_builtin_model(self.model_name)
        if model_config is not None and not from_folder:
            from transformers import AutoConfig, AutoModelForCausalLM

            from grpo_gym.hub import check_model_config, refuse_remote_code

            if not isinstance(model_config, dict):
                raise ValueError(f"model_config must be a dict of config fields, got {type(model_config).__name__}")
            refuse_remote_code(model_config, "the saved model_config")  # a saved record never runs code
            check_model_config(model_config, "the saved model_config")  # sizes checked before allocating
            config = AutoConfig.for_model(**model_config)
            base = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
        elif isinstance(model, str) and is_builtin_model(model):
            base = load_model(model, vocab_size=self.vocab_size, seed=self.seed, **self.model_kwargs)
        else:
            base = load_model(model)
        if lora is None:
            return base
        network = apply_lora(base, lora, self.seed)
        self.lora = {**LORA_DEFAULTS, **lora}  # recorded with the defaults, so a file keeps its meaning
        self._base_names = frozen_base_names(network) if from_folder else set()
        return network

    @property
    def saves_adapters_only(self) -> bool:
        """Whether the model file leaves the base weights out: LoRA on a base from a folder or hub name, which
        ``load`` reads again (a built-in's random initialisation or a model object is saved whole)."""
        return bool(self._base_names)

    def file_state_dict(self, state: dict[str, th.Tensor]) -> dict[str, th.Tensor]:
        """``state`` (this policy's ``state_dict()``) as the model file stores it: without the frozen base weights
        when :attr:`saves_adapters_only`."""
        return {key: value for key, value in state.items() if key.removeprefix("model.") not in self._base_names}

    def completed_state_dict(self, state: dict[str, th.Tensor]) -> dict[str, th.Tensor]:
        """A state dict read from a model file, with the base weights it left out (:meth:`file_state_dict`) taken
        from this policy, which read them from the base model's folder; any other missing key stays missing."""
        if not self._base_names:
            return state
        own = self.state_dict()
        base = {key: own[key] for key in own if key.removeprefix("model.") in self._base_names and key not in state}
        return {**state, **base}

    @property
    def is_builtin(self) -> bool:
        """Whether the weights started from a built-in random initialisation (the cold start applies)."""
        return isinstance(self.model_name, str) and is_builtin_model(self.model_name)

    def set_training_mode(self, mode: bool) -> None:
        """SB3 hook; the LM itself always stays in eval mode (no dropout, see the class docstring)."""
        super().set_training_mode(mode)
        self.model.eval()

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(
            model=self.model_name,
            model_kwargs=self.model_kwargs,
            model_config=self.model.config.to_dict(),
            lora=self.lora,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            memory_length=self.memory_length,
            value_head=self.value_net is not None,
            gradient_checkpointing=self.gradient_checkpointing,
            frozen_parameters=self.frozen_parameters,
            seed=self.seed,
            optimizer_class=self.optimizer_class,
            optimizer_kwargs=self.optimizer_kwargs,
        )
        return data

    # ------------------------------------------------------------------ prompts, sampling, log-probs
    @property
    def context_limit(self) -> int:
        """The most prompt tokens kept (the newest ones): ``memory_length - max_new_tokens``."""
        return self.memory_length - self.max_new_tokens

    def prompt_from_obs(self, obs: PyTorchObs) -> tuple[th.Tensor, th.Tensor]:
        """The prompt tensors of a batch of observations: ``(input_ids, attention_mask)``, both ``(B, T)``.

        Columns that are padding in every row are dropped, and at most ``memory_length - max_new_tokens``
        newest tokens are kept (the policy's attention span, with room for the completion).
        """
        input_ids, mask = obs["input_ids"].long(), obs["attention_mask"].long()  # (B, L)
        used = int(mask.sum(dim=1).max().item()) if mask.numel() else 0
        keep = max(1, min(used, self.context_limit))
        return input_ids[:, -keep:], mask[:, -keep:]

    def generate(
        self,
        input_ids: th.Tensor,
        attention_mask: th.Tensor,
        generator: th.Generator | None = None,
        greedy: bool = False,
        max_new_tokens: int | None = None,
        model: nn.Module | None = None,
        noise_offset: int = 0,
        noise_rows: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        keep_cache: bool = False,
        cache: TurnCache | None = None,
        cache_rows: th.Tensor | list[int] | None = None,
    ) -> Completions:
        """Sample completions for left-padded prompts ``(B, T)``; returns tokens and their log-probs.

        ``model`` samples instead of the policy's own (e.g. a frozen copy), with the policy's settings;
        ``noise_offset`` and ``noise_rows``: see :func:`~algorithms.common.generation.sampler.sample`; ``temperature``
        and ``top_p`` replace the policy's for this call (the server's per-request settings). With a
        :attr:`rollout_engine` set, the policy's own sampling (no ``model``, ``temperature`` or ``top_p`` given) runs
        on that engine. ``keep_cache``, ``cache`` and ``cache_rows``: the KV cache kept across the turns of
        multi-turn episodes (:mod:`~algorithms.common.generation.continuation`), by the builtin sampler; an engine
        keeps none (it prefills every turn; vLLM's own prefix cache reuses what it can) and returns no cache."""
        with th.no_grad(), self.autocast("sampling"):
            engine = self.rollout_engine
            if engine is not None and model is None and temperature is None and top_p is None:
                return engine.generate(
                    input_ids,
                    attention_mask,
                    max_new_tokens=max_new_tokens or self.max_new_tokens,
                    generator=generator,
                    greedy=greedy,
                    noise_offset=noise_offset,
                    noise_rows=noise_rows,
                )
            return sample(
                model if model is not None else self.model,
                input_ids,
                attention_mask,
                max_new_tokens=max_new_tokens or self.max_new_tokens,
                eos_token_id=self.eos_token_id,
                pad_token_id=self.pad_token_id,
                temperature=self.temperature if temperature is None else temperature,
                top_p=self.top_p if top_p is None else top_p,
                top_k=self.top_k,
                vocab_size=self.vocab_size,
                generator=generator,
                greedy=greedy,
                noise_offset=noise_offset,
                noise_rows=noise_rows,
                keep_cache=keep_cache,
                cache=cache,
                cache_rows=cache_rows,
            )

    def log_probs(
        self,
        prompt_ids: th.Tensor,
        prompt_mask: th.Tensor,
        completion_ids: th.Tensor,
        completion_mask: th.Tensor,
        with_entropy: bool = False,
        model: nn.Module | None = None,
        stage: str = "update",
        with_values: bool = False,
    ) -> tuple[th.Tensor, ...]:
        """Per-token log-probs ``(B, C)`` and entropies (None unless ``with_entropy``) of given completions under the
        current weights, or under ``model`` (e.g. the frozen reference) with the policy's settings, in ``stage``'s
        precision (the cold start passes ``"sft"``;
        :func:`~algorithms.common.generation.completion_pass.completion_log_probs`).

        ``with_values``: a third item from the same forward pass, the value head's per-token estimates ``(B, C)``: the
        value of each state ``prompt + completion[:t]``, read (in float32) from the last hidden state at the position
        that predicts token ``t``; 0 where the mask is False (needs ``value_head=True``)."""
        if with_values and self.value_net is None:
            raise ValueError("this policy has no value head; pass policy_kwargs={'value_head': True}")
        with self.autocast(stage):
            out = completion_log_probs(
                model if model is not None else self.model,
                prompt_ids,
                prompt_mask,
                completion_ids,
                completion_mask,
                temperature=self.temperature,
                vocab_size=self.vocab_size,
                with_entropy=with_entropy,
                pad_id=self.pad_token_id,
                with_hidden=with_values,
            )
        if not with_values:
            return out
        log_probs, entropy, hidden = out
        with float32_region(self.device):
            values = self.value_net(hidden.float()).squeeze(-1)  # (B, C)
        return log_probs, entropy, th.where(completion_mask.bool(), values, 0.0)

    def autocast(self, stage: str = "update"):
        """The autocast region of the model's forward passes in ``stage`` (``"sampling"``, ``"update"`` or
        ``"sft"``): nothing when :attr:`autocast_dtypes` gives it no dtype."""
        return autocast(self.autocast_dtypes.get(stage), self.device)

    def predict_values(self, prompt_ids: th.Tensor, prompt_mask: th.Tensor) -> th.Tensor:
        """FP32 value estimates ``(B,)`` from the last prompt token's hidden state (needs ``value_head=True``)."""
        if self.value_net is None:
            raise ValueError("this policy has no value head; pass policy_kwargs={'value_head': True}")
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        with self.autocast():
            out = self.model(
                input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions, output_hidden_states=True
            )
        with float32_region(self.device):
            return self.value_net(out.hidden_states[-1][:, -1].float()).squeeze(-1)

    def forward(self, obs: PyTorchObs, deterministic: bool = False) -> th.Tensor:
        """Actions for a batch of observations (see :meth:`_predict`)."""
        return self._predict(obs, deterministic)

    def _predict(self, observation: PyTorchObs, deterministic: bool = False) -> th.Tensor:
        """Completions padded to ``max_new_tokens`` (sequence mode) or next tokens (token mode); greedy when
        ``deterministic``."""
        prompt_ids, prompt_mask = self.prompt_from_obs(observation)
        tokens = self.generate(prompt_ids, prompt_mask, greedy=deterministic).tokens  # (B, max_new_tokens)
        return tokens if isinstance(self.action_space, spaces.MultiDiscrete) else tokens[:, 0]

    def save_pretrained(
        self,
        directory: str | os.PathLike,
        tokenizer: Any = None,
        merge: bool = False,
        state_dict: dict[str, th.Tensor] | None = None,
    ) -> None:
        """Write a standard Hugging Face folder (model, and the tokenizer when given) that
        ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` load; atomically: a kill at any
        instant leaves the old complete folder or the new one
        (:func:`~algorithms.common.saving.atomic.atomic_directory`).

        With LoRA: a peft adapter folder (``adapter_config.json`` and the adapter weights, which
        ``peft.PeftModel.from_pretrained(base, directory)`` loads), or with ``merge=True`` a standard model folder
        with the adapters merged into the weights of a copy (the policy keeps its adapters; the copy needs the
        model's memory once more while it is written). Without LoRA ``merge`` changes nothing.

        :param directory: the folder to write (replaced when it exists)
        :param tokenizer: a Hugging Face tokenizer to write beside the model (e.g. the env's)
        :param merge: write the merged model instead of the adapters (LoRA only)
        :param state_dict: the network's whole state dict to write instead of its live weights (those of a sharded
            network, gathered: :meth:`~algorithms.common.base_class.LMBaseAlgorithm.save_pretrained`)
        """
        check_bool("merge", merge)
        with atomic_directory(directory) as folder:
            if self.lora is not None and merge:
                self._plain_copy(state_dict).merge_and_unload().save_pretrained(folder)
            else:
                self.model.save_pretrained(folder, state_dict=state_dict)
            if tokenizer is not None:
                tokenizer.save_pretrained(folder)

    def _plain_copy(self, state_dict: dict[str, th.Tensor] | None) -> nn.Module:
        """A copy of the network with ``state_dict``'s weights (built again from its config and adapter: a sharded
        network cannot be copied), or a copy of the live one."""
        if state_dict is None:
            return copy.deepcopy(self.model)
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_config(base_network(self.model).config)
        network = apply_lora(base, self.lora, self.seed)
        network.load_state_dict(state_dict)
        return network
