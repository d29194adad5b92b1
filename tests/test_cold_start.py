"""The cold-start SFT stage: it fits the gold solutions or a JSONL file of rows, its file errors, its logging."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import grpo_gym
from algorithms import GRPO, TransformerPolicy
from algorithms.common.cold_start import load_sft_rows, supervised_finetune
from algorithms.common.rollout.batch import left_pad, right_pad
from grpo_gym.tokenizer import BUILTIN_VOCAB_SIZE
from tests.sizes import ENV_KWARGS, TINY, TINY_KWARGS

ROWS = [  # characters the arithmetic gold solutions never use, so fitting them is visible
    {"prompt": "Repeat the letter z.", "response": "<think>zzzz zzzz</think><answer>zzz</answer>"},
    {"prompt": "Say q.", "response": "<think>qq</think><answer>q</answer>"},
]


class RecordingLogger:
    """The part of SB3's logger that ``supervised_finetune`` uses."""

    def __init__(self) -> None:
        self.values: list[tuple[str, float]] = []
        self.dumps: list[int] = []

    def record(self, key: str, value: float, exclude=None) -> None:
        self.values.append((key, value))

    def dump(self, step: int = 0) -> None:
        self.dumps.append(step)

    def series(self, key: str) -> list[float]:
        return [v for k, v in self.values if k == key]


def make_vec_env(seed: int = 0) -> DummyVecEnv:
    env = grpo_gym.R1ZeroEnv(**ENV_KWARGS)
    env.reset(seed=seed)  # seeds the problems gold_examples draws
    return DummyVecEnv([lambda: env])


def make_policy(env: DummyVecEnv) -> TransformerPolicy:
    return TransformerPolicy(
        env.observation_space,
        env.action_space,
        lambda _: 1e-3,
        model="tiny",
        model_kwargs=TINY_KWARGS,
        seed=0,
        eos_token_id=1,
        pad_token_id=0,
    )


def nll(policy: TransformerPolicy, examples: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """Mean negative log-likelihood per completion token (EOS included) of ``(prompt, completion)`` ids."""
    prompt_ids, prompt_mask = left_pad([th.as_tensor(p) for p, _ in examples], policy.pad_token_id)
    completion_ids, completion_mask = right_pad([th.as_tensor(c) for _, c in examples], policy.pad_token_id)
    with th.no_grad():
        log_probs, _ = policy.log_probs(prompt_ids, prompt_mask, completion_ids, completion_mask)
    return float(-log_probs.sum() / completion_mask.sum())


def fixed_gold_batch(n: int = 16) -> list[tuple[np.ndarray, np.ndarray]]:
    env = grpo_gym.R1ZeroEnv(**ENV_KWARGS)
    env.reset(seed=12345)  # other problems than the training ones
    return env.gold_examples(n)


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_sft_lowers_the_loss_on_gold_solutions() -> None:
    env = make_vec_env()
    policy = make_policy(env)
    held_out = fixed_gold_batch()
    before = nll(policy, held_out)
    assert before == pytest.approx(math.log(BUILTIN_VOCAB_SIZE), abs=0.3)  # a fresh model is close to uniform
    logger = RecordingLogger()
    stats = supervised_finetune(
        policy,
        env,
        steps=30,
        batch_size=8,
        learning_rate=3e-3,
        generator=th.Generator().manual_seed(0),
        logger=logger,
        log_interval=10,
    )
    after = nll(policy, held_out)
    assert after < before - 0.5, (before, after)
    losses = logger.series("sft/loss")
    assert len(losses) == 3 and losses[-1] < losses[0] - 0.3
    assert logger.series("sft/step") == [10, 20, 30] and logger.dumps == [10, 20, 30]
    assert stats["loss"] == losses[-1]
    # the mean token probability is an arithmetic mean, the loss a mean log: AM >= GM
    assert 0 < stats["mean_token_prob"] <= 1
    assert stats["mean_token_prob"] >= math.exp(-stats["loss"]) - 1e-6


def test_sft_data_trains_on_the_file_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = make_vec_env()
    policy = make_policy(env)
    data = write_rows(tmp_path / "rows.jsonl", ROWS)
    core = env.envs[0]
    rows = [core.encode_example(row["prompt"], row["response"]) for row in ROWS]
    gold = fixed_gold_batch()
    rows_before, gold_before = nll(policy, rows), nll(policy, gold)
    supervised_finetune(
        policy,
        env,
        steps=30,
        batch_size=8,
        learning_rate=3e-3,
        data=str(data),
        generator=th.Generator().manual_seed(0),
        verbose=1,
        log_interval=15,
    )
    rows_drop, gold_drop = rows_before - nll(policy, rows), gold_before - nll(policy, gold)
    assert rows_drop > 1.0, rows_drop  # it learnt the file's responses ...
    assert rows_drop > gold_drop + 0.5, (rows_drop, gold_drop)  # ... not the task's gold solutions
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed] == ["sft step 15/30", "sft step 30/30"]


def test_load_sft_rows_reads_prompt_response_pairs(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n   \n" + json.dumps({**ROWS[1], "extra": 1}) + "\n", encoding="utf-8")
    assert load_sft_rows(path) == [(r["prompt"], r["response"]) for r in ROWS]  # blank lines skipped


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (None, "cannot read"),
        ("", "holds no rows"),
        ("\n  \n", "holds no rows"),
        ('{"prompt": "a", "response": "b"}\n{"prompt": "a", "response": \n', r"rows\.jsonl:2: .*JSON object"),
        ('{"prompt": "a", "response": "b"}\n{"prompt": "a"}\n', r"rows\.jsonl:2: .*'response'"),
        ('{"question": "a", "response": "b"}\n', r"rows\.jsonl:1: .*'prompt'"),
        ('["a", "b"]\n', r"rows\.jsonl:1: .*JSON object"),
    ],
    ids=["missing", "empty", "blank", "bad-json", "no-response", "no-prompt", "not-an-object"],
)
def test_load_sft_rows_errors(tmp_path: Path, content: str | None, match: str) -> None:
    path = tmp_path / "rows.jsonl"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        load_sft_rows(path)


def test_load_sft_rows_refuses_non_utf8_and_over_long_lines(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"prompt": "a", "response": "b"}\n{"prompt": "\xff", "response": "b"}\n')
    with pytest.raises(ValueError, match=r"rows\.jsonl:2: not UTF-8 text \(byte 0xff"):
        load_sft_rows(path)
    path.write_text(json.dumps({"prompt": "x" * 100, "response": "b"}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"rows\.jsonl:1: line longer than 64 bytes"):
        load_sft_rows(path, max_line_bytes=64)
    assert load_sft_rows(path, max_line_bytes=200) == [("x" * 100, "b")]


def test_bad_sft_data_fails_at_construction(tmp_path: Path) -> None:
    env = DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**ENV_KWARGS))])
    with pytest.raises(ValueError, match="sft_data"):
        GRPO(
            "TransformerPolicy",
            env,
            n_groups=1,
            group_size=2,
            cold_start_kwargs={"steps": 2, "data": str(tmp_path / "nope.jsonl")},
            policy_kwargs=TINY,
        )


def test_grpo_cold_start_logs_sft_loss_to_tensorboard(tmp_path: Path) -> None:
    env = DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**ENV_KWARGS))])
    model = GRPO(
        "TransformerPolicy",
        env,
        n_groups=2,
        group_size=4,
        cold_start_kwargs={"steps": 3, "batch_size": 4},
        seed=0,
        tensorboard_log=str(tmp_path),
        policy_kwargs=TINY,
    )
    assert model.needs_cold_start()
    model.learn(8)
    assert model._cold_start_done
    runs = [p.name for p in tmp_path.iterdir()]
    assert runs == ["GRPO_1"]
    events = EventAccumulator(str(tmp_path / "GRPO_1")).Reload()
    assert {"sft/loss", "sft/mean_token_prob"} <= set(events.Tags()["scalars"])
    sft_loss = events.Scalars("sft/loss")
    assert [e.step for e in sft_loss] == [3]  # logged once, at the last SFT step (log_interval 50 > 3 steps)
    assert 0 < sft_loss[0].value < math.log(BUILTIN_VOCAB_SIZE) + 0.5  # a per-token NLL over the vocabulary
    assert [e.step for e in events.Scalars("train/loss")] == [8]


def test_run_cold_start_before_learn_needs_no_setup():
    """A user (or a benchmark) may run the SFT stage alone, right after construction."""
    from tests.test_grpo import make_model

    model = make_model(cold_start_kwargs={"steps": 2})
    stats = model.run_cold_start()
    assert model._cold_start_done and stats


def test_rows_without_a_solution_get_well_formed_targets_and_a_warning(tmp_path: Path) -> None:
    rows = [{"prompt": "Capital of France?", "answer": "Paris"}, {"prompt": "2+2?", "answer": "4", "solution": "2+2=4"}]
    path = write_rows(tmp_path / "task.jsonl", rows)
    core = grpo_gym.R1ZeroEnv(**{**ENV_KWARGS, "max_new_tokens": 64}, task="jsonl", task_kwargs={"path": str(path)})
    core.reset(seed=0)
    env = DummyVecEnv([lambda: core])
    policy = make_policy(env)
    with pytest.warns(UserWarning) as caught:
        supervised_finetune(policy, env, steps=2, batch_size=8, learning_rate=1e-3)
    message = next(str(w.message) for w in caught if "gold reasoning" in str(w.message))
    assert message.startswith(f"{core.gold_stand_ins} of 16 cold-start examples (task 'jsonl') had no gold reasoning")
    assert 0 < core.gold_stand_ins < 16 and "cold_start_kwargs" in message


def test_malformed_sft_data_responses_are_counted_in_a_warning(tmp_path: Path) -> None:
    rows = [*ROWS, {"prompt": "Say x.", "response": "<think></think><answer>x</answer>"}]
    data = write_rows(tmp_path / "rows.jsonl", rows)
    env = make_vec_env()
    with pytest.warns(UserWarning, match=r"1 of 3 sft_data rows .* malformed \(row 3: empty <think>\)"):
        supervised_finetune(make_policy(env), env, steps=1, batch_size=2, learning_rate=1e-3, data=str(data))


def test_an_untrained_model_from_a_folder_is_named_and_cold_start_true_runs_it(tmp_path: Path) -> None:
    from algorithms.common.cold_start import check_pretrained, gold_nll
    from algorithms.common.model.loading import load_model

    folder = tmp_path / "fresh"
    load_model("tiny", seed=0, **TINY_KWARGS).save_pretrained(folder)  # from_config, saved: untrained weights
    env = DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**ENV_KWARGS))])
    kwargs = {"n_groups": 1, "group_size": 2, "seed": 0, "policy_kwargs": {"model": folder}}
    model = GRPO("TransformerPolicy", env, cold_start_kwargs={"steps": 7}, **kwargs)
    assert not model.policy.is_builtin and gold_nll(model.policy, env) > 0.9 * math.log(BUILTIN_VOCAB_SIZE)
    with pytest.warns(UserWarning, match=r"like an untrained one .* the cold start \(7 steps\) does not run") as got:
        model.learn(2)
    assert [w.filename for w in got if "untrained" in str(w.message)] == [__file__]  # the user's learn() line
    assert not model._cold_start_done
    model = GRPO(
        "TransformerPolicy", env, cold_start_kwargs={"steps": 60, "learning_rate": 3e-3}, cold_start=True, **kwargs
    )
    model.learn(2)
    assert model._cold_start_done and check_pretrained(model.policy, env, 60)  # now better than a uniform guess
