"""TRL's names and ours: one table, read by the constructors' hints, by ``GRPO.from_trl`` and by the docs.

Every field of TRL 1.16's ``GRPOConfig`` (and the ``GRPOTrainer`` arguments a script passes, and the fields of
TRL 1.18's ``AsyncGRPOConfig`` that have a meaning here) has an entry (:data:`TRL_NAMES`): our equivalent and where
it goes, or ``None`` with what to do instead. ``GRPO(...)`` and ``LMPPO(...)`` given a TRL name raise a
``TypeError`` that names ours (:func:`with_trl_hints`, a decorator: the constructors keep their SB3-style
signatures). The names whose equivalent is the env's, and the hint itself, are
the env's own (:mod:`grpo_gym.trl_names`: ``gym.make("R1Zero-v0", max_completion_length=...)`` names ours too).
:func:`readme_section` writes the table of docs/guides/from-trl.md; a test checks that the page holds it and that
it covers every ``GRPOConfig`` field.
"""

from __future__ import annotations

import functools
from typing import Any

from grpo_gym.trl_names import ENV_NAMES, TrlName, spelled
from grpo_gym.trl_names import with_trl_hints as env_hints

__all__ = [
    "ASYNC_GRPO_CONFIG",
    "GRPO_CONFIG",
    "TRL_CONFIG",
    "TRL_NAMES",
    "readme_section",
    "readme_table",
    "with_trl_hints",
]


def _arg(ours: str, note: str = "", **kwargs: Any) -> TrlName:
    return TrlName(ours, "arg", note, **kwargs)


def _policy(ours: str, note: str = "", **kwargs: Any) -> TrlName:
    return TrlName(ours, "policy", note, **kwargs)


def _call(ours: str, note: str = "") -> TrlName:
    return TrlName(ours, "call", note, ported=False)


def _always(ours: str, note: str = "") -> TrlName:
    return TrlName(ours, "always", note, ported=False)


def _none(names: str, note: str) -> dict[str, TrlName]:
    """Entries without an equivalent, for the space-separated ``names``."""
    return {name: TrlName(None, "none", note, ported=False) for name in names.split()}


LOSS_TYPES = {"grpo": "sequence", "dapo": "token", "bnpo": "token", "dr_grpo": "constant"}
USE_VLLM = {True: "vllm", False: "builtin"}
IMPORTANCE_SAMPLING_MODES = {"token_truncate": "tis", "sequence_mask": "mask"}
SCALE_REWARDS = {True: "group", False: "none", "group": "group", "batch": "batch", "none": "none"}

#: ``GRPOTrainer``'s own arguments (not fields of ``GRPOConfig``)
TRAINER_ARGUMENTS: dict[str, TrlName] = {
    "model": _policy("model", "a built-in size, a local folder or hub name, or a model object"),
    "reward_funcs": ENV_NAMES["reward_funcs"],
    "train_dataset": ENV_NAMES["train_dataset"],
    "eval_dataset": ENV_NAMES["eval_dataset"],
    "processing_class": ENV_NAMES["processing_class"],
    "peft_config": _policy("lora", '`{"r": 16, "alpha": 32, ...}`: peft\'s LoraConfig fields (from_trl converts it)'),
    "args": _call("GRPO.from_trl(model, reward_funcs, args, train_dataset)", "takes a GRPOConfig or a dict"),
    "callbacks": _call("learn(callback=...)", "SB3 callbacks: EvalCallback, CheckpointCallback, your own"),
    "optimizers": _policy("optimizer_class", "and optimizer_kwargs; schedules through learning_rate", ported=False),
    "tools": ENV_NAMES["tools"],
    **_none("reward_processing_classes rollout_func environment_factory", note="GRPOTrainer arguments we do not take"),
}
#: names TRL has removed that scripts still carry
REMOVED: dict[str, TrlName] = {"max_prompt_length": ENV_NAMES["max_prompt_length"]}

_INFRA = "Hugging Face Trainer machinery; SB3's callbacks, learn(), model.save and torchrun take its place"
_VLLM_SYNC = "weights go to vLLM by its in-place reload (colocated) or a file and its RPC (served), no NCCL group"
_LOSS = "a loss variant we do not have"

#: every field of TRL 1.16's ``GRPOConfig``, in its order
GRPO_CONFIG: dict[str, TrlName] = {
    "output_dir": _call("model.save(path)", "or --save-path / --checkpoint-dir on the command line"),
    "per_device_train_batch_size": _arg(
        "batch_size",
        "completions per optimizer step (TRL's x gradient_accumulation_steps x processes); None: the whole rollout",
        ported=False,
    ),
    "num_train_epochs": _call("learn(total_timesteps=...)", "timesteps count completions"),
    "max_steps": _call("learn(total_timesteps=...)", "timesteps count completions, not optimizer steps"),
    "learning_rate": _arg("learning_rate", "TRL 1e-6, ours 1e-5"),
    "lr_scheduler_type": _arg(
        "learning_rate", "a schedule function of the remaining progress, as in SB3", ported=False
    ),
    "lr_scheduler_kwargs": _arg("learning_rate", "write them into the schedule function", ported=False),
    "warmup_steps": _arg("learning_rate", "write the warm-up into the schedule function", ported=False),
    "optim": _policy("optimizer_class", "a torch optimizer class (AdamW by default)", ported=False),
    **_none("optim_args optim_target_modules", note=_INFRA),
    "weight_decay": _policy("optimizer_kwargs.weight_decay", "AdamW's (0.01 in torch, 0 in TRL)"),
    "adam_beta1": _policy("optimizer_kwargs.betas", "betas=(beta1, beta2)", ported=False),
    "adam_beta2": _policy("optimizer_kwargs.betas", "betas=(beta1, beta2)", ported=False),
    "adam_epsilon": _policy("optimizer_kwargs.eps"),
    "gradient_accumulation_steps": _arg("batch_size", "one optimizer step per minibatch of batch_size", ported=False),
    "average_tokens_across_devices": _arg(
        "loss_aggregation", "'token' averages over every process's tokens", ported=False
    ),
    "max_grad_norm": _arg("max_grad_norm", "TRL 1.0, ours 0.5"),
    **_none("label_smoothing_factor", note=_INFRA),
    "bf16": _arg("mixed_precision", "'bf16'; ours 'auto' picks per device", values={True: "bf16"}),
    "fp16": _arg("mixed_precision", "'fp16', with a gradient scaler", values={True: "fp16"}),
    **_none("bf16_full_eval fp16_full_eval tf32", note=_INFRA),
    "activation_checkpointing": _policy("gradient_checkpointing", "True (every 4 layers) or every N layers"),
    **_none("activation_checkpointing_kwargs", note=_INFRA),
    "gradient_checkpointing": _policy("gradient_checkpointing", "TRL True, ours False"),
    **_none(
        "gradient_checkpointing_kwargs torch_compile torch_compile_backend torch_compile_mode "
        "use_liger_kernel liger_kernel_config",
        note=_INFRA,
    ),
    "use_cache": _always("the sampler's own KV cache"),
    **_none("neftune_noise_alpha torch_empty_cache_steps auto_find_batch_size logging_strategy", note=_INFRA),
    "logging_steps": _call("learn(log_interval=...)", "in iterations"),
    **_none("logging_first_step", note=_INFRA),
    "log_on_each_node": _always("rank 0 logs"),
    **_none("logging_nan_inf_filter", note=_INFRA),
    "include_num_input_tokens_seen": _always("time/tokens_per_second"),
    "log_level": _arg("verbose", "0 or 1", ported=False),
    **_none("log_level_replica", note=_INFRA),
    "disable_tqdm": _call("learn(progress_bar=...)", "off by default in Python, on in grpo-gym train"),
    "report_to": _arg("tensorboard_log", "a folder; W&B through wandb's WandbCallback(sync_tensorboard)", ported=False),
    "run_name": _call("learn(tb_log_name=...)"),
    **_none("project trackio_space_id trackio_bucket_id trackio_static_space_id", note=_INFRA),
    "eval_strategy": _call("EvalCallback(eval_env, eval_freq=...)", "or evaluate_policy"),
    "eval_steps": _call("EvalCallback(eval_env, eval_freq=...)"),
    **_none(
        "eval_delay per_device_eval_batch_size prediction_loss_only eval_on_start eval_do_concat_batches "
        "eval_use_gather_object eval_accumulation_steps include_for_metrics batch_eval_metrics "
        "save_only_model save_strategy",
        note=_INFRA,
    ),
    "save_steps": _call("CheckpointCallback(save_freq=...)", "or --checkpoint-every on the command line"),
    **_none("save_on_each_node", note=_INFRA),
    "save_total_limit": _always("grpo-gym train keeps the newest 2 checkpoints"),
    **_none(
        "enable_jit_checkpoint push_to_hub hub_token hub_private_repo hub_model_id hub_strategy "
        "hub_always_push hub_revision",
        note=_INFRA,
    ),
    "load_best_model_at_end": _call("EvalCallback(best_model_save_path=...)"),
    **_none(
        "metric_for_best_model greater_is_better ignore_data_skip restore_callback_states_from_checkpoint", note=_INFRA
    ),
    "full_determinism": _always("same seed, same run on the same machine"),
    "seed": _arg("seed"),
    "data_seed": _arg("seed", "one seed draws the rows too", ported=False),
    "use_cpu": _arg("device", "device='cpu'", values={True: "cpu"}),
    **_none(
        "accelerator_config parallelism_config dataloader_drop_last dataloader_num_workers "
        "dataloader_pin_memory dataloader_persistent_workers dataloader_prefetch_factor "
        "dataloader_multiprocessing_context dataloader_in_order",
        note=_INFRA,
    ),
    "remove_unused_columns": _always("every dataset column reaches the reward functions"),
    **_none(
        "label_names train_sampling_strategy length_column_name ddp_find_unused_parameters ddp_bucket_cap_mb "
        "ddp_broadcast_buffers ddp_static_graph",
        note=_INFRA,
    ),
    "ddp_backend": _always("nccl on GPUs, gloo on CPUs"),
    "ddp_timeout": _arg("distributed_kwargs.timeout", "seconds"),
    **_none("fsdp fsdp_config deepspeed debug skip_memory_metrics", note=_INFRA),
    **_none("do_train do_eval do_predict", note=_INFRA),
    "resume_from_checkpoint": _call("GRPO.load(path) + learn(reset_num_timesteps=False)", "or --resume"),
    "local_rank": _always("torchrun's environment"),
    **_none("model_init_kwargs trust_remote_code router_aux_loss_coef", note="load the model yourself"),
    "disable_dropout": _always("the policy never runs dropout"),
    **_none("cast_lm_head_to_fp32", note=_INFRA),
    "num_generations": _arg("group_size", "G, completions per prompt (8 in both)"),
    "num_generations_eval": _call("evaluate_policy / EvalCallback", "one completion per problem"),
    "max_completion_length": ENV_NAMES["max_completion_length"],
    **_none("ds3_gather_for_generation", note=_INFRA),
    "shuffle_dataset": _always("rows are drawn at random, by the seed"),
    **_none("pad_to_multiple_of", note=_INFRA),
    "generation_batch_size": _arg(
        "n_groups", "prompts per rollout: generation_batch_size / num_generations", ported=False
    ),
    "steps_per_generation": _arg("batch_size", "rollout / batch_size optimizer steps per epoch", ported=False),
    "temperature": _policy("temperature"),
    "top_p": _policy("top_p", "TRL 1.0, ours 0.92"),
    "top_k": _policy("top_k", "0: off"),
    **_none("min_p generation_kwargs", note="sampling options we do not have"),
    "chat_template_kwargs": ENV_NAMES["chat_template_kwargs"],
    **_none("repetition_penalty cache_implementation", note="sampling options we do not have"),
    "use_vllm": _arg("rollout_engine", 'True: "vllm" (ours also has "builtin" and "hf")', values=USE_VLLM),
    "vllm_mode": _arg(
        "rollout_engine_kwargs.mode", '"colocate" or "server" (grpo-gym vllm-serve, or your own vLLM server)'
    ),
    "vllm_model_impl": _arg("rollout_engine_kwargs.llm_kwargs", '{"llm_kwargs": {"model_impl": ...}}', ported=False),
    "vllm_enable_sleep_mode": _arg("rollout_engine_kwargs.enable_sleep_mode", "a GPU's colocated vLLM"),
    **_none("vllm_structured_outputs_regex", note="sampling options we do not have"),
    "vllm_server_base_url": _arg("rollout_engine_kwargs.server_base_url"),
    "vllm_server_host": _arg("rollout_engine_kwargs.server_host", "TRL 0.0.0.0, ours 127.0.0.1"),
    "vllm_server_port": _arg("rollout_engine_kwargs.server_port"),
    "vllm_server_timeout": _arg("rollout_engine_kwargs.server_timeout", "seconds to wait for the server at setup"),
    **_none("vllm_group_port", note=_VLLM_SYNC),
    "vllm_gpu_memory_utilization": _arg("rollout_engine_kwargs.gpu_memory_utilization", "a colocated vLLM's share"),
    "vllm_max_model_length": _policy("memory_length", "prompt and completion tokens; vLLM's max_model_len from it"),
    "vllm_tensor_parallel_size": _arg(
        "rollout_engine_kwargs.llm_kwargs", '{"llm_kwargs": {"tensor_parallel_size": n}}', ported=False
    ),
    "beta": _arg("beta", "TRL 0, ours 0.04 (k3 KL; no reference model at 0)", lmppo="kl_coef"),
    "num_iterations": _arg("n_epochs", "passes over each rollout"),
    "epsilon": _arg("clip_range"),
    **_none("delta", note=_LOSS),
    "epsilon_high": _arg("clip_range_high", "DAPO's clip-higher"),
    **_none(
        "sapo_temperature_neg sapo_temperature_pos vespo_k_pos vespo_lambda_pos vespo_k_neg vespo_lambda_neg",
        note=_LOSS,
    ),
    "importance_sampling_level": _arg("importance_level", "'token' or 'sequence' (GSPO)"),
    "reward_weights": ENV_NAMES["reward_weights"],
    "multi_objective_aggregation": _always("'sum_then_normalize': weighted sum, then group advantages"),
    "scale_rewards": _arg("advantage_scale", "'group', 'batch' or 'none'", values=SCALE_REWARDS),
    "loss_type": _arg(
        "loss_aggregation", "grpo: 'sequence'; dapo, bnpo: 'token'; dr_grpo: 'constant'", values=LOSS_TYPES
    ),
    "mask_truncated_completions": _arg("mask_truncated"),
    **_none("sync_ref_model ref_model_mixup_alpha ref_model_sync_steps", note="the reference stays frozen"),
    **_none("top_entropy_quantile", note=_LOSS),
    "entropy_coef": _arg("ent_coef", "TRL 0, ours 0.01 decaying to 0.001"),
    "use_adaptive_entropy": _arg("ent_coef", "a schedule or UpdateDecay instead", ported=False),
    **_none(
        "entropy_coef_min entropy_coef_max entropy_coef_delta entropy_target",
        note="adaptive entropy: use an ent_coef schedule or UpdateDecay",
    ),
    "max_tool_calling_iterations": ENV_NAMES["max_tool_calling_iterations"],
    "vllm_importance_sampling_correction": _arg(
        "sampler_correction",
        '"auto" (TIS on an external engine or mixed precisions; from_trl: the mode\'s with use_vllm) or None',
        values={True: "auto", False: None},
    ),
    "vllm_importance_sampling_clip_max": _arg("sampler_correction_cap", "TRL 3.0, ours 2.0 (TRL's and verl's TIS cap)"),
    "vllm_importance_sampling_mode": _arg(
        "sampler_correction",
        '"token_truncate": "tis", "sequence_mask": "mask" (TRL\'s default)',
        values=IMPORTANCE_SAMPLING_MODES,
    ),
    **_none("vllm_importance_sampling_clip_min", note="TIS truncates from above only (the mask too)"),
    **_none("off_policy_mask_threshold use_bias_correction_kl", note=_LOSS),
    "log_completions": _always("a sample completion as TensorBoard text (samples/completion)"),
    **_none("log_multimodal num_completions_to_print log_unique_prompts log_completions_hub_repo", note=_INFRA),
    **_none(
        "use_transformers_continuous_batching transformers_continuous_batching_config use_transformers_paged",
        note="our sampler batches the whole rollout",
    ),
    "vllm_importance_sampling_cap": _arg("sampler_correction_cap", "TRL's older name of clip_max"),
}

#: the fields of TRL's ``AsyncGRPOConfig`` (1.18, after the 1.16 this table follows) that have a meaning here
ASYNC_GRPO_CONFIG: dict[str, TrlName] = {
    "max_staleness": _arg(
        "max_staleness",
        "TRL 4 (older samples dropped), ours 0 (synchronous); with k >= 1 every rollout is used, sampled by weights "
        "at most k updates old, and TIS-corrected",
    ),
    **_none("weight_sync_steps", note="the producer gets the new weights after every update"),
}
#: the config fields ``from_trl`` reads: ``GRPOConfig``'s and ``AsyncGRPOConfig``'s own
TRL_CONFIG: dict[str, TrlName] = {**GRPO_CONFIG, **ASYNC_GRPO_CONFIG}

TRL_NAMES: dict[str, TrlName] = {**TRAINER_ARGUMENTS, **TRL_CONFIG, **REMOVED}
"""Every TRL name we know: ``GRPOTrainer``'s arguments, ``GRPOConfig``'s and ``AsyncGRPOConfig``'s fields, names TRL
removed."""


#: ``@with_trl_hints`` on GRPO's and LMPPO's constructors: a TRL name among every one we know raises a
#: ``TypeError`` naming ours (:func:`grpo_gym.trl_names.with_trl_hints` with this table)
with_trl_hints = functools.partial(env_hints, names=TRL_NAMES)


# ---------------------------------------------------------------------------------------------- the docs' table
def _ours_cell(entry: TrlName) -> str:
    text = spelled("", entry)
    return f"`{text}`" if entry.where in ("arg", "env", "policy", "call") else text


def readme_table() -> str:
    """The "From TRL's GRPOConfig" table (docs/guides/from-trl.md): every name with an equivalent, then those
    without, by reason."""
    lines = ["| TRL | grpo-gym | note |", "|---|---|---|"]
    for name, entry in TRL_NAMES.items():
        if entry.where != "none":
            lines.append(f"| `{name}` | {_ours_cell(entry)} | {entry.note} |")
    reasons: dict[str, list[str]] = {}
    for name, entry in TRL_NAMES.items():
        if entry.where == "none":
            reasons.setdefault(entry.note, []).append(f"`{name}`")
    lines += ["", "No equivalent:", ""]
    lines += [f"- {reason}: {', '.join(names)}." for reason, names in reasons.items()]
    return "\n".join(lines)


TABLE_START = (
    "<!-- trl-table: algorithms.common.trl_names.readme_section() writes it; tests/test_trl_names.py checks it -->"
)
TABLE_END = "<!-- trl-table end -->"


def readme_section() -> str:
    """The table between its markers, as docs/guides/from-trl.md holds it."""
    return f"{TABLE_START}\n{readme_table()}\n{TABLE_END}"
