"""GRPO trained on the real vLLM CPU engine, colocated (``vllm.LLM`` in the process): a few iterations with the weights
pushed after every update and the sampler's log-probs the update's; LoRA adapters pushed during training; multi-turn
tool episodes (``tools=["calculator"]``, ``max_turns=2``) through the engine with their exact tokens; two processes
under torchrun (each rank its own engine) training the weights of one and resuming. Skipped, with the reason in the
report, where vLLM cannot be imported."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import grpo_gym
from algorithms import GRPO
from algorithms.common.generation.engines.base import SamplingSettings
from algorithms.common.rollout.batch import left_pad
from algorithms.common.rollout.rows import contexts_from_obs
from grpo_gym.gold import answer_text, tool_call_text
from tests.engine_models import ENGINE_KWARGS, VLLM_MISSING, max_gap
from tests.test_grpo import make_env
from tests.two_ranks import run_on_two_ranks

pytestmark = pytest.mark.skipif(bool(VLLM_MISSING), reason=VLLM_MISSING)

ENGINE_MODEL = {"model": "tiny", "model_kwargs": ENGINE_KWARGS}  # head size 32: vLLM's CPU attention runs it
VLLM = {"rollout_engine": "vllm", "rollout_engine_kwargs": {"kv_cache_memory_bytes": 32 << 20}}
TOOL_ENV = {"template": "compact", "max_new_tokens": 112, "context_length": 512, "difficulty": 0.5,
            "tools": ["calculator"], "max_turns": 2}  # fmt: skip
JOB = Path(__file__).with_name("vllm_distributed_job.py")


def scalars(folder: Path, tag: str) -> list[float]:
    run = next(p for p in sorted(folder.iterdir()) if p.is_dir())
    return [e.value for e in EventAccumulator(str(run), size_guidance={"scalars": 0}).Reload().Scalars(tag)]


def vllm_model(env: Any = None, **kwargs: Any) -> GRPO:
    settings = {"n_groups": 2, "group_size": 4, "cold_start_kwargs": {"steps": 0}, "cold_start": False, "seed": 0,
                "policy_kwargs": ENGINE_MODEL, **VLLM}  # fmt: skip
    return GRPO("TransformerPolicy", env if env is not None else make_env(), **{**settings, **kwargs})


def test_colocated_grpo_trains_with_the_engines_log_probs(tmp_path: Path) -> None:
    """Three iterations on vllm.LLM in this process: a push after every update, timed; the rollouts' log-probs are
    the update's (float32: the sampler KL is rounding, so the TIS weights are 1); after training the engine samples
    from the trained weights."""
    with vllm_model(tensorboard_log=str(tmp_path), learning_rate=1e-3) as model:
        engine = model.policy.rollout_engine
        assert type(engine).__name__ == "VLLMColocateEngine" and model._sampler_correction == "tis"
        before = [p.detach().clone() for p in model.policy.parameters()]
        model.learn(24)
        assert any(not th.equal(a, b) for a, b in zip(before, model.policy.parameters(), strict=True))
        syncs, kl = scalars(tmp_path, "time/weight_sync_seconds"), scalars(tmp_path, "train/sampler_kl")
        assert len(syncs) == 3 and all(s > 0 for s in syncs)
        assert len(kl) == 3 and all(abs(v) < 1e-6 for v in kl), kl
        ids, mask = left_pad([th.tensor([5, 6, 7, 8]), th.tensor([9, 10, 11])], 0)
        out = model.policy.generate(ids, mask, generator=th.Generator().manual_seed(0))  # on the engine
        assert max_gap(model.policy.model, ids, mask, out, SamplingSettings.of_policy(model.policy)) < 1e-5
    assert model.policy.rollout_engine is None  # closed on leaving the block


def test_a_model_vllm_cannot_run_is_refused_at_setup_naming_the_fix() -> None:
    from algorithms.common.generation.engines.base import EngineError
    from tests.sizes import TINY  # 2 heads of 16: vLLM's CPU attention does not run it

    with pytest.raises(EngineError, match=r"head sizes .* use rollout_engine='builtin' or 'hf'"):
        vllm_model(policy_kwargs=TINY)


def test_lora_adapters_are_pushed_during_training(tmp_path: Path) -> None:
    """vllm_lora_sync="adapters": the base weights go in once, each update's adapters as a new LoRA request."""
    pytest.importorskip("peft")
    lora = {**ENGINE_MODEL, "lora": {"r": 4, "alpha": 8}}
    with vllm_model(policy_kwargs=lora, rollout_engine_kwargs={"lora_sync": "adapters"}, learning_rate=1e-2,
                    tensorboard_log=str(tmp_path)) as model:  # fmt: skip
        engine = model.policy.rollout_engine
        assert engine.adapters
        first = engine._lora_request.lora_int_id
        model.learn(16)
        assert engine._lora_request.lora_int_id >= first + 2  # a new adapter after each update
        assert all(abs(v) < 1e-5 for v in scalars(tmp_path, "train/sampler_kl"))
        ids, mask = left_pad([th.tensor([5, 6, 7, 8]), th.tensor([40, 41])], 0)
        out = model.policy.generate(ids, mask, generator=th.Generator().manual_seed(1))
        assert max_gap(model.policy.model, ids, mask, out, SamplingSettings.of_policy(model.policy)) < 1e-5


# ---------------------------------------------------------------------------------------------- tool episodes
def gold_turns(env: grpo_gym.R1ZeroEnv, policy: Any, seed: int) -> list[tuple[th.Tensor, th.Tensor, int]]:
    """The two turns of ``env``'s gold tool episode at ``seed``: ``(context ids, action, completion length)``."""
    obs, _ = env.reset(seed=seed)
    calls, reasoning, answer = env.task.tool_solution(env.problem, env.tools.names)
    turns = []
    for text in (tool_call_text(calls), answer_text(reasoning, answer)):
        context = contexts_from_obs({k: v[None] for k, v in obs.items()}, policy.context_limit)[0]
        action = env.encode_action(text)
        turns.append((context, th.as_tensor(action), len(env.codec.encode(text)) + 1))
        obs, *_ = env.step(action)
    return turns


def memorise(policy: Any, turns: list[tuple[th.Tensor, th.Tensor, int]], steps: int = 400) -> None:
    """Overfit the policy on the two turns (until greedy decoding gives them back), so the engine plays them."""
    ids, prompt_mask = left_pad([context for context, _, _ in turns], policy.pad_token_id)
    tokens = th.stack([action for _, action, _ in turns])
    mask = th.zeros_like(tokens, dtype=th.bool)
    for i, (_, _, n) in enumerate(turns):
        mask[i, :n] = True
    optimizer = th.optim.Adam(policy.model.parameters(), lr=1e-2)
    for step in range(steps):
        log_probs = policy.log_probs(ids, prompt_mask, tokens, mask)[0]
        loss = -log_probs[mask].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 49 and float(log_probs[mask].detach().min()) > -0.02:
            return
    raise AssertionError(f"the tiny model did not learn the episode in {steps} steps (loss {float(loss):.3f})")


class KeepInfos(BaseCallback):
    def __init__(self) -> None:
        super().__init__()
        self.infos: list[dict[str, Any]] = []

    def _on_step(self) -> bool:
        self.infos.extend(self.locals["infos"])
        return True


def test_multi_turn_tool_episodes_go_through_the_engine_with_their_exact_tokens(tmp_path: Path) -> None:
    """A tool episode played on the vLLM engine: the tool call it samples is run, the tool result's tokens are in
    the next turn's context as the env wrote them, and every turn's log-probs are the update's on those ids (so the
    engine conditioned on exactly them); the greedy tokens are our sampler's. Then GRPO rollouts on the engine play
    such episodes (tool turns and later turns), with the sampler KL at float rounding."""
    env = grpo_gym.R1ZeroEnv(**TOOL_ENV)
    vec = DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**TOOL_ENV))] * 2)
    with vllm_model(vec, learning_rate=1e-6, tensorboard_log=str(tmp_path)) as model:
        policy = model.policy
        memorise(policy, gold_turns(env, policy, seed=3))
        model.push_weights()
        obs, _ = env.reset(seed=3)
        settings = SamplingSettings.of_policy(policy)
        for turn in range(2):
            ids, mask = left_pad(contexts_from_obs({k: v[None] for k, v in obs.items()}, policy.context_limit), 0)
            out = policy.generate(ids, mask, greedy=True)  # on the engine
            assert max_gap(policy.model, ids, mask, out, settings) < 1e-5
            engine, policy.rollout_engine = policy.rollout_engine, None
            assert th.equal(policy.generate(ids, mask, greedy=True).tokens, out.tokens)  # our sampler's tokens
            policy.rollout_engine = engine
            obs, _, done, _, info = env.step(out.tokens[0].numpy())
            if turn == 0:
                assert info["tool_calls"] and not done  # a tool turn: the calculator ran
                result = env.codec.encode(f"\nTool: {env.problem.answer}")
                window = obs["input_ids"][obs["attention_mask"] == 1].tolist()
                assert any(window[i : i + len(result)] == list(result) for i in range(len(window)))
        assert done and info["is_success"]
        infos = KeepInfos()
        model.learn(8, callback=infos)
        assert any(info.get("tool_calls") for info in infos.infos)  # tool turns in the rollout
        assert len(model._rollout.completion_ids) > 8  # later turns: more rows than the K x G episodes
        assert all(abs(v) < 1e-6 for v in scalars(tmp_path, "train/sampler_kl"))


# ---------------------------------------------------------------------------------------------- two processes
def torchrun(out: Path, mode: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_on_two_ranks(JOB, out, mode, timeout=timeout)


def test_two_processes_with_colocated_vllm_train_and_resume(tmp_path: Path) -> None:
    """torchrun, 2 gloo ranks, each with its own vllm.LLM (vLLM's external_launcher): 2 iterations, saved, then
    resumed for a third; the resumed weights are one uninterrupted process's 3 iterations."""
    from tests.vllm_distributed_job import run

    done = torchrun(tmp_path, "train")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    done = torchrun(tmp_path, "resume")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (tmp_path / "one").mkdir()
    single = run(tmp_path / "one", iterations=3)
    for rank in (0, 1):
        weights = th.load(tmp_path / f"resumed_{rank}.pt")
        for name, value in single.items():
            th.testing.assert_close(weights[name], value, atol=2e-5, rtol=1e-4, msg=name)
