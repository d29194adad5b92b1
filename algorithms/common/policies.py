"""``TransformerPolicy``: a Stable-Baselines3 policy around a Hugging Face causal language model."""

from __future__ import annotations

import os
from typing import Any

import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import PyTorchObs, Schedule
from torch import nn

from algorithms.common.checkpointing import DEFAULT_EVERY, checkpoint_every
from algorithms.common.generation import Completions, completion_log_probs, sample
from algorithms.common.models import is_builtin_model, load_model
from algorithms.common.precision import autocast, float32_region


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
        name of any ``AutoModelForCausalLM``, or a model object
    :param model_kwargs: config overrides for built-ins (e.g. ``{"num_hidden_layers": 2}``)
    :param model_config: a config dict to build the architecture from without loading weights (what
        ``GRPO.load`` uses, so a saved model loads offline; the weights come from the saved state dict)
    :param eos_token_id: the env tokenizer's EOS id (a completion ends there)
    :param pad_token_id: the env tokenizer's pad id
    :param temperature: sampling temperature (log-probs use the same scaling)
    :param top_p: nucleus sampling mass (S6: 0.92)
    :param top_k: top-k filter, 0 for none
    :param memory_length: the most tokens the policy attends to, prompt and completion together (S4: 2048;
        capped at the model's position limit); older context tokens are cut
    :param value_head: add an FP32 value head on the last prompt token (S9's value-network baseline)
    :param gradient_checkpointing: checkpoint the decoder's layers in chunks (S16): ``True`` for every 4 layers,
        an int N for every N layers, ``False`` for none (:mod:`~algorithms.common.checkpointing`)
    :param seed: seeds a built-in model's initial weights
    :param optimizer_class: the optimizer (AdamW)
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
        eos_token_id: int = 1,
        pad_token_id: int = 0,
        temperature: float = 1.0,
        top_p: float = 0.92,
        top_k: int = 0,
        memory_length: int = 2048,
        value_head: bool = False,
        gradient_checkpointing: bool | int = False,
        seed: int | None = None,
        optimizer_class: type[th.optim.Optimizer] = th.optim.AdamW,
        optimizer_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            observation_space, action_space, optimizer_class=optimizer_class, optimizer_kwargs=optimizer_kwargs or {}
        )
        if temperature <= 0 or not 0 < top_p <= 1:
            raise ValueError(f"need temperature > 0 and 0 < top_p <= 1, got {temperature} and {top_p}")
        self.vocab_size = int(observation_space["input_ids"].high.max()) + 1
        self.max_new_tokens = int(action_space.shape[0]) if isinstance(action_space, spaces.MultiDiscrete) else 1
        self.eos_token_id, self.pad_token_id = int(eos_token_id), int(pad_token_id)
        self.temperature, self.top_p, self.top_k = float(temperature), float(top_p), int(top_k)
        self.model_name = model if isinstance(model, (str, os.PathLike)) else None
        self.model_kwargs = dict(model_kwargs or {})
        self.seed = seed
        self.model = self._build_model(model, model_config)
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
        #: the autocast dtype of the model's forward passes (None: float32); the algorithm sets it (S15)
        self.autocast_dtype: th.dtype | None = None
        self.model.eval()
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)

    def _build_model(self, model: Any, model_config: dict[str, Any] | None) -> nn.Module:
        if model_config is not None:
            from transformers import AutoConfig, AutoModelForCausalLM

            config = AutoConfig.for_model(**model_config)
            return AutoModelForCausalLM.from_config(config)
        if isinstance(model, str) and is_builtin_model(model):
            return load_model(model, vocab_size=self.vocab_size, seed=self.seed, **self.model_kwargs)
        return load_model(model)

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
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            memory_length=self.memory_length,
            value_head=self.value_net is not None,
            gradient_checkpointing=self.gradient_checkpointing,
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
        newest tokens are kept (S4's attention span, with room for the completion).
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
    ) -> Completions:
        """Sample completions for left-padded prompts ``(B, T)``; returns tokens and their log-probs.

        ``model`` samples instead of the policy's own (e.g. a frozen copy), with the policy's settings;
        ``noise_offset`` and ``noise_rows``: see :func:`~algorithms.common.generation.sample`; ``temperature`` and
        ``top_p`` replace the policy's for this call (the server's per-request settings)."""
        with th.no_grad(), self.autocast():
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
            )

    def log_probs(
        self,
        prompt_ids: th.Tensor,
        prompt_mask: th.Tensor,
        completion_ids: th.Tensor,
        completion_mask: th.Tensor,
        with_entropy: bool = False,
        model: nn.Module | None = None,
    ) -> tuple[th.Tensor, th.Tensor | None]:
        """Per-token log-probs ``(B, C)`` (and entropies) of given completions under the current weights, or under
        ``model`` (e.g. the frozen reference) with the policy's settings."""
        with self.autocast():
            return completion_log_probs(
                model if model is not None else self.model,
                prompt_ids,
                prompt_mask,
                completion_ids,
                completion_mask,
                temperature=self.temperature,
                vocab_size=self.vocab_size,
                with_entropy=with_entropy,
                pad_id=self.pad_token_id,
            )

    def autocast(self):
        """The autocast region of the model's forward passes (nothing when :attr:`autocast_dtype` is None)."""
        return autocast(self.autocast_dtype, self.device)

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

    def save_pretrained(self, directory: str | os.PathLike, tokenizer: Any = None) -> None:
        """Write a standard Hugging Face folder (model, and the tokenizer when given) that
        ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` load."""
        self.model.save_pretrained(directory)
        if tokenizer is not None:
            tokenizer.save_pretrained(directory)
