"""TransformerPolicy: predict on raw and batched observations, prompts, log-probs, HF export, value head, errors,
and a user's local Hugging Face checkpoint as the policy (including an offline ``GRPO.load``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.vec_env import DummyVecEnv

import grpo_gym
from algorithms import GRPO, TransformerPolicy
from tests.sizes import ENV_KWARGS, TINY, TINY_KWARGS

MAX_NEW = ENV_KWARGS["max_new_tokens"]
EOS, PAD = 1, 0  # the built-in tokenizer's ids


def make_raw_env(**kwargs) -> grpo_gym.R1ZeroEnv:
    return grpo_gym.R1ZeroEnv(**{**ENV_KWARGS, **kwargs})


def make_policy(env: grpo_gym.R1ZeroEnv | None = None, **kwargs) -> TransformerPolicy:
    env = env or make_raw_env()
    defaults = {
        "model": "tiny",
        "model_kwargs": TINY_KWARGS,
        "seed": 0,
        "eos_token_id": env.codec.eos_id,
        "pad_token_id": env.codec.pad_id,
    }
    return TransformerPolicy(env.observation_space, env.action_space, lambda _: 1e-3, **{**defaults, **kwargs})


def stack(observations: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {key: np.stack([obs[key] for obs in observations]) for key in observations[0]}


def as_tensors(obs: dict[str, np.ndarray]) -> dict[str, th.Tensor]:
    return {key: th.as_tensor(value) for key, value in obs.items()}


def observations(env: grpo_gym.R1ZeroEnv, seeds: list[int]) -> list[dict[str, np.ndarray]]:
    return [env.reset(seed=s)[0] for s in seeds]


def save_tiny_hf_model(folder: Path, kind: str, vocab_size: int = 384) -> Path:
    """A tiny Qwen2 or Llama causal LM saved like a user's checkpoint (vocabulary larger than the env's 359)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_class, model_class = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[
        kind
    ]
    config = config_class(vocab_size=vocab_size, **TINY_KWARGS, max_position_embeddings=512)
    th.manual_seed(0)
    model_class(config).save_pretrained(folder)
    return folder


# ---------------------------------------------------------------------------------------------- predict
def test_predict_raw_observation_and_batch() -> None:
    env = make_raw_env()
    model = GRPO("TransformerPolicy", DummyVecEnv([make_raw_env]), cold_start=False, seed=0, policy_kwargs=TINY)
    obs, _ = env.reset(seed=0)
    action, state = model.predict(obs)
    assert state is None
    assert action.shape == (MAX_NEW,) and np.issubdtype(action.dtype, np.integer)
    assert env.action_space.contains(action.astype(np.int64))
    env.step(action)  # the env accepts it as a completion

    batch = stack(observations(env, [0, 1, 2]))
    actions, _ = model.predict(batch)
    assert actions.shape == (3, MAX_NEW)
    assert all(env.action_space.contains(a.astype(np.int64)) for a in actions)


def test_deterministic_predict_is_repeatable_and_greedy() -> None:
    env = make_raw_env()
    policy = make_policy(env)
    batch = stack(observations(env, [0, 1, 2]))
    first, _ = policy.predict(batch, deterministic=True)
    th.manual_seed(123)  # the global RNG must not matter for greedy decoding
    second, _ = policy.predict(batch, deterministic=True)
    np.testing.assert_array_equal(first, second)
    ids, mask = policy.prompt_from_obs(as_tensors(batch))
    greedy = policy.generate(ids, mask, greedy=True).tokens.numpy()
    np.testing.assert_array_equal(first, greedy)


def test_tokens_after_eos_are_padding() -> None:
    env = make_raw_env()
    policy = make_policy(env)
    obs, _ = env.reset(seed=0)
    th.manual_seed(0)  # predict samples from the global RNG
    actions, _ = policy.predict(stack([obs] * 32))
    rows_with_eos = 0
    for row in actions:
        ends = np.flatnonzero(row == EOS)
        if len(ends) and ends[0] < MAX_NEW - 1:
            rows_with_eos += 1
            assert (row[ends[0] + 1 :] == PAD).all(), row
    assert rows_with_eos >= 2  # a random model over the vocabulary ends ~20% of 24-token completions early


def test_token_mode_predicts_one_token() -> None:
    env = make_raw_env(action_mode="token")
    policy = make_policy(env)
    obs, _ = env.reset(seed=0)
    action, _ = policy.predict(obs, deterministic=True)
    assert action.shape == () and env.action_space.contains(int(action))
    assert policy.max_new_tokens == 1


# ---------------------------------------------------------------------------------------------- prompts
def test_prompt_from_obs_drops_padding_columns() -> None:
    policy = make_policy()
    ids = th.zeros((2, 256), dtype=th.long)
    mask = th.zeros((2, 256), dtype=th.long)
    ids[0, -10:], mask[0, -10:] = th.arange(10, 20), 1
    ids[1, -20:], mask[1, -20:] = th.arange(30, 50), 1
    prompt_ids, prompt_mask = policy.prompt_from_obs({"input_ids": ids, "attention_mask": mask})
    assert prompt_ids.shape == prompt_mask.shape == (2, 20)  # the longest row's 20 tokens, nothing more
    assert prompt_mask[0].tolist() == [0] * 10 + [1] * 10
    assert prompt_ids[0, -10:].tolist() == list(range(10, 20))
    assert prompt_ids[1].tolist() == list(range(30, 50))
    # an all-padding batch keeps one column
    empty_ids, empty_mask = policy.prompt_from_obs({"input_ids": ids * 0, "attention_mask": mask * 0})
    assert empty_ids.shape == empty_mask.shape == (2, 1)


def test_prompt_from_obs_keeps_at_most_memory_minus_completion() -> None:
    env = make_raw_env()
    policy = make_policy(env, memory_length=MAX_NEW + 6)  # room for 6 prompt tokens
    obs, _ = env.reset(seed=0)
    n_tokens = int(obs["attention_mask"].sum())
    assert n_tokens > 6
    prompt_ids, prompt_mask = policy.prompt_from_obs(as_tensors(stack([obs])))
    assert prompt_ids.shape == (1, 6)
    assert prompt_mask.tolist() == [[1] * 6]
    assert prompt_ids[0].tolist() == obs["input_ids"][-6:].tolist()  # the newest 6 tokens
    # predict attends to those 6 tokens only: same greedy completion as generating from them directly
    action, _ = policy.predict(obs, deterministic=True)
    expected = policy.generate(prompt_ids, prompt_mask, greedy=True).tokens[0].numpy()
    np.testing.assert_array_equal(action, expected)


# ---------------------------------------------------------------------------------------------- log-probs
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_equal_the_sampling_log_probs(temperature: float) -> None:
    env = make_raw_env(difficulty=0.6)
    policy = make_policy(env, temperature=temperature, top_p=0.9)
    batch = as_tensors(stack(observations(env, [0, 1, 2, 3])))
    ids, mask = policy.prompt_from_obs(batch)
    assert (mask == 0).any()  # prompts of different lengths: left padding is exercised
    generator = th.Generator().manual_seed(0)
    completions = policy.generate(ids, mask, generator=generator)
    with th.no_grad():
        log_probs, entropy = policy.log_probs(ids, mask, completions.tokens, completions.mask, with_entropy=True)
    assert log_probs.shape == entropy.shape == (4, MAX_NEW)
    th.testing.assert_close(log_probs, completions.log_probs, atol=1e-5, rtol=0)
    assert (log_probs[~completions.mask] == 0).all() and (log_probs[completions.mask] < 0).all()
    # a near-uniform random model over the vocabulary: entropy at most its log
    real = entropy[completions.mask]
    assert (real <= np.log(env.codec.vocab_size) + 1e-4).all() and (real > 0).all()


# ---------------------------------------------------------------------------------------------- HF export
def test_save_pretrained_loads_with_auto_classes(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    env = make_raw_env()
    policy = make_policy(env)
    policy.save_pretrained(tmp_path, env.tokenizer)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    text = "<think>4+9=13</think><answer>13</answer>"
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == env.codec.encode(text).tolist()
    assert len(tokenizer) == env.codec.vocab_size and tokenizer.eos_token_id == EOS and tokenizer.pad_token_id == PAD
    ids = th.as_tensor(env.codec.encode("What is 4+9?"))[None]
    with th.no_grad():
        th.testing.assert_close(model(input_ids=ids).logits, policy.model(input_ids=ids).logits, atol=1e-6, rtol=0)


def test_grpo_save_pretrained_writes_the_env_tokenizer(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = GRPO("TransformerPolicy", DummyVecEnv([make_raw_env]), cold_start=False, seed=0, policy_kwargs=TINY)
    model.save_pretrained(str(tmp_path))
    assert len(AutoTokenizer.from_pretrained(tmp_path)) == model.env.get_attr("codec")[0].vocab_size
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    for (name, a), (_, b) in zip(model.policy.model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert th.equal(a, b), name


# ---------------------------------------------------------------------------------------------- value head
@pytest.mark.parametrize("dtype", [th.float32, th.bfloat16])
def test_value_head(dtype: th.dtype) -> None:
    from algorithms.common.model.loading import load_model

    env = make_raw_env()
    model = load_model("tiny", seed=0, dtype=dtype, **TINY_KWARGS)
    policy = make_policy(env, model=model, value_head=True)
    ids, mask = policy.prompt_from_obs(as_tensors(stack(observations(env, [0, 1, 2]))))
    values = policy.predict_values(ids, mask)
    assert values.shape == (3,) and values.dtype == th.float32
    in_optimizer = {id(p) for group in policy.optimizer.param_groups for p in group["params"]}
    assert policy.value_net is not None
    assert {id(p) for p in policy.value_net.parameters()} <= in_optimizer
    assert policy.value_net.weight.dtype == th.float32
    # extra left padding changes nothing (positions come from the mask)
    padded_ids = th.cat([th.zeros((3, 5), dtype=th.long), ids], dim=1)
    padded_mask = th.cat([th.zeros((3, 5), dtype=th.long), mask], dim=1)
    th.testing.assert_close(policy.predict_values(padded_ids, padded_mask), values, atol=1e-2, rtol=0)
    # the head trains: one optimizer step on (V - 10)^2 changes the head and moves the values towards 10
    weight = policy.value_net.weight.detach().clone()
    loss = (values - 10.0).pow(2).mean()
    policy.optimizer.zero_grad()
    loss.backward()
    policy.optimizer.step()
    assert not th.equal(policy.value_net.weight, weight)
    with th.no_grad():
        assert (policy.predict_values(ids, mask) - 10.0).pow(2).mean() < loss


def test_value_head_survives_save_and_load(tmp_path: Path) -> None:
    env = DummyVecEnv([make_raw_env])
    model = GRPO("TransformerPolicy", env, cold_start=False, seed=0, policy_kwargs={**TINY, "value_head": True})
    model.save(tmp_path / "m.zip")
    loaded = GRPO.load(tmp_path / "m.zip")
    assert loaded.policy.value_net is not None
    assert th.equal(loaded.policy.value_net.weight, model.policy.value_net.weight)


def test_predict_values_without_head_raises() -> None:
    policy = make_policy()
    assert policy.value_net is None
    with pytest.raises(ValueError, match="value_head"):
        policy.predict_values(th.ones((1, 4), dtype=th.long), th.ones((1, 4), dtype=th.long))


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"memory_length": MAX_NEW}, "memory_length"),
        ({"memory_length": 8}, "memory_length"),
    ],
)
def test_bad_sampling_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_policy(**kwargs)


def test_bad_arguments_through_grpo() -> None:
    with pytest.raises(ValueError, match="top_p"):
        GRPO("TransformerPolicy", DummyVecEnv([make_raw_env]), policy_kwargs={**TINY, "top_p": 0.0})


# ---------------------------------------------------------------------------------------------- local checkpoints
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_local_checkpoint_folder_as_policy_and_offline_load(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = save_tiny_hf_model(tmp_path / kind, kind)
    env = DummyVecEnv([make_raw_env])
    model = GRPO("TransformerPolicy", env, n_groups=2, group_size=4, seed=0, policy_kwargs={"model": str(folder)})
    assert type(model.policy.model).__name__.lower().startswith(kind)
    assert not model.policy.is_builtin and not model.needs_cold_start()  # a checkpoint skips the cold start
    obs = env.reset()
    actions, _ = model.predict(obs)  # ids 359..383 of the model's table are never sampled
    assert env.action_space.contains(actions[0].astype(np.int64))
    model.learn(8)
    greedy, _ = model.predict(obs, deterministic=True)
    model.save(tmp_path / "model.zip")

    shutil.rmtree(folder)  # the checkpoint is gone: load() must rebuild from the stored config
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    loaded = GRPO.load(tmp_path / "model.zip", env=env)
    assert type(loaded.policy.model) is type(model.policy.model)
    assert loaded.policy.model.get_input_embeddings().num_embeddings == 384
    for (name, a), (_, b) in zip(model.policy.state_dict().items(), loaded.policy.state_dict().items(), strict=True):
        assert th.equal(a, b), name
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], greedy)
    loaded.learn(8)
    assert loaded.num_timesteps == 8


def test_memory_longer_than_the_model_positions_is_caught(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=384, n_embd=32, n_layer=1, n_head=2, n_positions=40, bos_token_id=1, eos_token_id=1)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    env = make_raw_env()
    obs, _ = env.reset(seed=0)
    assert obs["attention_mask"].sum() + MAX_NEW > 40  # prompt + completion do not fit 40 positions
    try:
        policy = make_policy(env, model=str(tmp_path / "gpt2"))
    except ValueError as error:  # acceptable: refused up front, naming the positions
        assert "position" in str(error)
        return
    action, _ = policy.predict(obs)  # or: the memory is clamped to the model's 40 positions
    assert env.action_space.contains(action.astype(np.int64))


def test_log_probs_with_values_read_one_forward_per_token() -> None:
    env = make_raw_env()
    policy = make_policy(env, value_head=True)
    obs = as_tensors(stack(observations(env, [0, 1, 2])))
    prompt_ids, prompt_mask = policy.prompt_from_obs(obs)
    out = policy.generate(prompt_ids, prompt_mask, generator=th.Generator().manual_seed(0))
    args = (prompt_ids, prompt_mask, out.tokens, out.mask)
    log_probs, entropy, values = policy.log_probs(*args, with_entropy=True, with_values=True)
    expected, expected_entropy = policy.log_probs(*args, with_entropy=True)
    th.testing.assert_close(log_probs, expected)
    th.testing.assert_close(entropy, expected_entropy)
    assert values.shape == out.mask.shape and values.dtype == th.float32
    assert bool((values[~out.mask] == 0).all()) and th.isfinite(values).all()
    values.sum().backward()
    assert policy.value_net.weight.grad is not None and policy.value_net.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="value_head"):
        make_policy(env).log_probs(*args, with_values=True)
