"""Coming from TRL: the docs' porting recipe (docs/guides/from-trl.md) run as written, GRPO.from_trl with a
GRPOConfig or a dict, its errors, LoRA from a peft_config, and Weights & Biases through wandb's SB3 callback
(offline)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from datasets import Dataset

from algorithms import GRPO
from tests.docs_blocks import ROOT, python_blocks
from tests.sizes import TINY, TINY_KWARGS

trl = pytest.importorskip("trl")
FROM_TRL = ROOT / "docs" / "guides" / "from-trl.md"
SMALL = {"policy_kwargs": {"model_kwargs": TINY_KWARGS}}  # the test-size built-in model, over from_trl's "tiny"
BUILTINS_OFF = {"syntax": 0.0, "consistency": 0.0, "task": 0.0, "length": 0.0}


def test_the_porting_recipe_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (recipe,) = [block for block in python_blocks(FROM_TRL) if "GRPO.from_trl(" in block]  # tests/test_docs.py skips it
    assert "GRPO.from_trl(" in recipe and "model.learn(" in recipe
    namespace: dict = {"__name__": "readme_recipe"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(recipe, "docs/guides/from-trl.md: the porting recipe", "exec"), namespace)
    # the rows' `solution` holds answers, not reasoning: the stand-in warning says how to name a reasoning column
    stand_in = [str(w.message) for w in caught if "had no gold reasoning" in str(w.message)]
    assert len(stand_in) == 1 and "task_kwargs={'solution': '<column>'}" in stand_in[0]
    model = namespace["model"]
    env = model.get_env()
    reward = env.get_attr("reward_fn")[0]
    assert (model.n_groups, model.group_size, model.batch_size, model.learning_rate) == (2, 4, 8, 5e-5)
    assert env.get_attr("max_new_tokens")[0] == 32 and env.get_attr("task")[0].conversational
    assert reward.weights == {**BUILTINS_OFF, "accuracy": 1.0, "think_format": 1.0} and reward.clip is None
    assert model.num_timesteps == 32 and (tmp_path / "from_trl.zip").is_file()
    functions = [namespace["accuracy"], namespace["think_format"]]
    objects = {"reward_funcs": functions, "task_kwargs": {"data": namespace["dataset"]}}  # what a file cannot hold
    again = GRPO.load(tmp_path / "from_trl.zip", env_objects=objects)
    assert again.get_env() is not None and again.num_timesteps == 32


def accuracy(completions, answer, **kwargs):
    return [float(c.endswith(f"<answer>{a}</answer>")) for c, a in zip(completions, answer, strict=True)]


def brevity(completions, **kwargs):
    return [-len(c) / 100 for c in completions]


ROWS = [{"prompt": f"What is {a} + 1?", "answer": str(a + 1)} for a in range(12)]


def test_a_grpo_config_ports_the_fields_you_changed(tmp_path: Path) -> None:
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"), use_cpu=True, num_generations=4, per_device_train_batch_size=8,
        gradient_accumulation_steps=2, max_completion_length=24, epsilon=0.1, epsilon_high=0.3, num_iterations=2,
        loss_type="dr_grpo", scale_rewards="batch", temperature=0.7,
        mask_truncated_completions=True, reward_weights=[1.0, 0.5], lr_scheduler_type="cosine", seed=3,
    )  # fmt: skip
    with pytest.warns(UserWarning, match=r"not ported; do it by hand: lr_scheduler_type \(learning_rate=\.\.\."):
        model = GRPO.from_trl("tiny", [accuracy, brevity], args=args, train_dataset=Dataset.from_list(ROWS), **SMALL)
    assert (model.group_size, model.n_groups, model.batch_size, model.n_epochs) == (4, 4, 16, 2)
    assert (model.clip_range(1), model.clip_range_high(1), model.beta, model.max_grad_norm) == (0.1, 0.3, 0.0, 1.0)
    assert (model.loss_aggregation, model.advantage_scale, model.mask_truncated, model.seed) == (
        "constant",
        "batch",
        True,
        3,
    )
    assert (model.policy.temperature, model.policy.top_p) == (0.7, 1.0)
    assert model.learning_rate == 1e-6 and model.ent_coef(1) == 0.0  # TRL's defaults come with a GRPOConfig
    assert model.policy.gradient_checkpointing is True and model.policy.optimizer.defaults["weight_decay"] == 0.0
    assert model.device.type == "cpu" and model.mixed_precision == "auto"  # bf16: GRPOConfig fills it in itself
    env = model.get_env()
    assert env.get_attr("max_new_tokens")[0] == 24
    assert env.get_attr("reward_fn")[0].weights == {**BUILTINS_OFF, "accuracy": 1.0, "brevity": 0.5}
    _, info = env.envs[0].reset(seed=0)
    assert info["prompt"] == info["problem"].prompt  # a string prompt is used as it is, as TRL does


def test_trls_vllm_fields_map_onto_the_rollout_engine() -> None:
    """use_vllm, vllm_mode, the server's address and timeout, vllm_max_model_length, and the importance-sampling fields
    as TRL means them: a mode applies only with use_vllm and the correction on ("sequence_mask": ours "mask")."""
    from algorithms.common.generation.engines.base import EngineError
    from algorithms.grpo.trl_port import config_values, translate

    args = trl.GRPOConfig(output_dir="unused", use_cpu=True, use_vllm=True, vllm_mode="server",
                          vllm_server_base_url="http://10.0.0.2:8001", vllm_server_timeout=30.0,
                          vllm_max_model_length=512)  # fmt: skip
    ours = translate(*config_values(args), ["accuracy"])[0]
    engine = ours["rollout_engine_kwargs"]  # every TRL vllm_* field a config holds, ours by its key
    assert (ours["rollout_engine"], engine["mode"], engine["server_base_url"]) == (
        "vllm", "server", "http://10.0.0.2:8001")  # fmt: skip
    assert (engine["server_timeout"], ours["policy_kwargs"]["memory_length"]) == (30.0, 512)
    assert (ours["sampler_correction"], ours["sampler_correction_cap"]) == ("mask", 3.0)  # TRL's defaults
    plain = translate(*config_values(trl.GRPOConfig(output_dir="unused", use_cpu=True)), ["accuracy"])[0]
    assert (plain["rollout_engine"], plain["sampler_correction"]) == ("builtin", "auto")  # no vLLM: the mode unused
    cases = [
        ({"use_vllm": True, "vllm_importance_sampling_mode": "token_truncate"}, "tis"),
        ({"use_vllm": True, "vllm_importance_sampling_mode": "sequence_mask"}, "mask"),
        ({"vllm_importance_sampling_mode": "sequence_mask", "use_vllm": True, "vllm_importance_sampling_correction":
          False}, None),
        ({"vllm_importance_sampling_mode": "sequence_mask"}, "unset"),
    ]  # fmt: skip
    for given, expected in cases:
        assert translate(given, set(given), ["accuracy"])[0].get("sampler_correction", "unset") == expected, given
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode='token_mask' has no equivalent here"):
        translate({"use_vllm": True, "vllm_importance_sampling_mode": "token_mask"}, set(), ["accuracy"])
    server = {"use_vllm": True, "vllm_mode": "server", "vllm_server_port": 9, "vllm_server_host": "127.0.0.1",
              "vllm_server_timeout": 1.0}  # fmt: skip
    with pytest.raises(EngineError, match=r"no vLLM server answers at http://127\.0\.0\.1:9 .*grpo-gym vllm-serve"):
        GRPO.from_trl("tiny", accuracy, server, Dataset.from_list(ROWS), **SMALL)  # the client needs no vLLM here


def test_a_grpo_configs_generation_batch_ports_as_trl_fills_it_in(tmp_path: Path) -> None:
    """TRL generates generation_batch_size (or per_device_train_batch_size x steps_per_generation) completions per
    rollout; a GRPOConfig holding either gives that many groups here, and a batch of partial groups is refused."""
    data = Dataset.from_list(ROWS)
    for given in ({"steps_per_generation": 4}, {"generation_batch_size": 32}):
        args = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, num_generations=4, per_device_train_batch_size=8,
                              **given)  # fmt: skip
        prompts = args.generation_batch_size // args.num_generations  # TRL's prompts per generation: 8
        model = GRPO.from_trl("tiny", accuracy, args, data, **SMALL)
        assert (model.n_groups, model.group_size, model.batch_size) == (prompts, 4, 8), given
    with pytest.raises(ValueError, match=r"generation batch \(8: .*divisible by num_generations \(3\), as in TRL"):
        GRPO.from_trl("tiny", accuracy, {"num_generations": 3, "per_device_train_batch_size": 8}, data, **SMALL)


def test_a_dict_ports_its_keys_and_bad_input_is_named() -> None:
    data = Dataset.from_list([{"prompt": r["prompt"], "target": r["answer"]} for r in ROWS])
    model = GRPO.from_trl("tiny", accuracy, {"num_generations": 2, "bf16": False, "use_cpu": False}, data, **SMALL)
    assert model.group_size == 2 and model.n_groups == 4 and model.batch_size is None  # no batch field given
    assert model.get_env().get_attr("task")[0].columns.answer == "target"  # found among answer/solution/...
    with pytest.raises(TypeError, match="num_generation are not fields of TRL's GRPOConfig"):
        GRPO.from_trl("tiny", accuracy, {"num_generation": 2}, data)
    with pytest.raises(ValueError, match="loss_type='cispo' has no equivalent here"):
        GRPO.from_trl("tiny", accuracy, {"loss_type": "cispo"}, data)
    with pytest.raises(ValueError, match="pass answer='<column>'; the dataset's columns: prompt, label"):
        GRPO.from_trl("tiny", accuracy, {}, [{"prompt": "x", "label": "1"}])
    with pytest.raises(ValueError, match="train_dataset has no rows"):
        GRPO.from_trl("tiny", accuracy, {}, Dataset.from_list([]))
    with pytest.warns(
        UserWarning, match=r"do it by hand: vllm_tensor_parallel_size \(rollout_engine_kwargs=\{\"llm_kwargs\": "
    ):
        GRPO.from_trl("tiny", accuracy, {"vllm_tensor_parallel_size": 2}, data, **SMALL)
    for trl_value, ours in ((False, None), (True, "auto")):  # a mapped None (correction off) is ported, not dropped
        args = {"vllm_importance_sampling_correction": trl_value, "vllm_importance_sampling_clip_max": 3.0}
        model = GRPO.from_trl("tiny", accuracy, args, data, **SMALL)
        assert (model.sampler_correction, model.sampler_correction_cap) == (ours, 3.0)
    with pytest.raises(ValueError, match="a reward model named by a string"):
        GRPO.from_trl("tiny", "org/reward-model", {}, data)
    with pytest.raises(ValueError, match="reward_weights has 2 weights for 1 reward functions"):
        GRPO.from_trl("tiny", [accuracy], {"reward_weights": [1.0, 2.0]}, data)


def test_a_trl_gspo_config_clips_the_sequence_ratio_by_its_epsilon() -> None:
    """TRL's GSPO recipe (``importance_sampling_level="sequence"`` with a small ``epsilon`` and ``epsilon_high``):
    one clip range for either ratio, as TRL's, so the update clips the sequence ratio by them."""
    data = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in ROWS])
    args = {"num_generations": 2, "importance_sampling_level": "sequence", "epsilon": 5e-4, "epsilon_high": 6e-4}
    model = GRPO.from_trl("tiny", accuracy, {**args, "bf16": False, "use_cpu": False}, data, **SMALL)
    settings = model._loss_settings()
    assert (settings.importance_level, settings.clip_low, settings.clip_high) == ("sequence", 5e-4, 6e-4)


def test_a_peft_config_trains_lora_adapters() -> None:
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05, target_modules=["v_proj", "q_proj"], use_rslora=True)
    with pytest.warns(UserWarning, match="lora_dropout=0.05 is not used: the policy never runs dropout"):
        model = GRPO.from_trl("tiny", [accuracy], {}, Dataset.from_list(ROWS), peft_config=config, cold_start=False)
    lora = model.policy.lora
    assert (lora["r"], lora["alpha"], lora["dropout"], lora["use_rslora"]) == (4, 8, 0.0, True)
    assert sorted(lora["target_modules"]) == ["q_proj", "v_proj"]


def test_a_peft_config_without_target_modules_adapts_what_peft_picks(tmp_path: Path) -> None:
    """A LoraConfig without target_modules lets peft pick per model type (q_proj, v_proj for Llama), in TRL and here;
    the choice survives save and load."""
    peft = pytest.importorskip("peft")
    from algorithms.common.model.loading import load_model

    def adapted(network) -> set[str]:
        return {name.split(".")[-1] for name, module in network.named_modules() if hasattr(module, "lora_A")}

    peft_picks = adapted(peft.get_peft_model(load_model("tiny", **TINY_KWARGS), peft.LoraConfig(r=4, lora_alpha=8)))
    config = peft.LoraConfig(r=4, lora_alpha=8)  # no target_modules (get_peft_model fills in the one it is given)
    model = GRPO.from_trl(
        "tiny", [accuracy], {}, Dataset.from_list(ROWS), peft_config=config, cold_start=False, **SMALL
    )
    assert adapted(model.policy.model) == peft_picks == {"q_proj", "v_proj"}
    model.save(tmp_path / "lora.zip")
    again = GRPO.load(tmp_path / "lora.zip", env=model.get_env())
    assert adapted(again.policy.model) == peft_picks


def test_wandb_syncs_the_tensorboard_run_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The docs' W&B recipe (tests/test_docs.py runs it as written too): wandb's SB3 WandbCallback with
    sync_tensorboard, offline. wandb gets the run and GRPO's arguments, and the TensorBoard run in the folder it
    watches holds the tags (read back with tensorboard's reader). wandb's own record file is written by its service
    process, asynchronously (on CI it held only its header when finish() returned), so the test reads neither the
    tags nor the run id from its contents."""
    wandb = pytest.importorskip("wandb")
    import gymnasium as gym
    from wandb.integration.sb3 import WandbCallback

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="grpo-gym", sync_tensorboard=True, mode="offline", dir=str(tmp_path))
    try:
        env = gym.make("R1Zero-v0", template="compact", max_new_tokens=24, context_length=256, difficulty=0.1)
        model = GRPO(
            "TransformerPolicy",
            env,
            n_groups=2,
            group_size=4,
            cold_start_kwargs={"steps": 2},
            seed=0,
            policy_kwargs=TINY,
            tensorboard_log=f"runs/{run.id}",
        )
        model.learn(total_timesteps=16, callback=WandbCallback())
        assert run.config["algo"] == "GRPO" and run.config["n_groups"] == 2  # the callback records the arguments
        model.logger.close()  # the TensorBoard files complete before wandb's last scan of them (at finish)
    finally:
        run.finish()
    assert len(list((tmp_path / "wandb").glob(f"offline-run-*-{run.id}/run-{run.id}.wandb"))) == 1  # to sync later
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (folder,) = (tmp_path / "runs" / run.id).iterdir()
    tags = EventAccumulator(str(folder)).Reload().Tags()["scalars"]
    for tag in ("rollout/ep_rew_mean", "rollout/reward/task", "train/loss", "sft/loss"):
        assert tag in tags, tag


def test_a_port_names_each_value_that_differs_from_trls_default() -> None:
    """A dict of the fields you set leaves the others at ours: each that differs from TRL's default is named once,
    with TRL's value; a field given in args or as a GRPO argument is yours and is not named."""
    data = Dataset.from_list(ROWS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        GRPO.from_trl("tiny", accuracy, {"num_generations": 2, "learning_rate": 1e-6}, data, **SMALL)
    said = [str(w.message) for w in caught if "differ from TRL's defaults" in str(w.message)]
    assert len(said) == 1
    named = ("max_completion_length=64 (TRL 512)", "top_p=0.92 (TRL 1.0)", "beta=0.04 (TRL 0.0)",
             "loss_type='sequence' (TRL 'dapo')", "max_grad_norm=0.5 (TRL 1.0)",
             "entropy_coef=UpdateDecay(")  # fmt: skip
    assert all(name in said[0] for name in named), said[0]
    assert "learning_rate" not in said[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        GRPO.from_trl("tiny", accuracy, {"num_generations": 2}, data, beta=0.0, ent_coef=0.0, **SMALL)
    said = [str(w.message) for w in caught if "differ from TRL's defaults" in str(w.message)]
    assert "beta" not in said[0] and "entropy_coef" not in said[0] and "learning_rate=1e-05 (TRL 1e-06)" in said[0]
