"""Reward functions with TRL's signature: the checks at construction, the call (sync, async, None, bad output), and
the same function objects giving the same scores in TRL's GRPOTrainer and in R1Zero-v0."""

from __future__ import annotations

import asyncio
import functools
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import grpo_gym
from grpo_gym.rewards.functions import (
    PASSED,
    RewardLogs,
    call_reward_funcs,
    check_reward_funcs,
    check_reward_function,
    is_async,
)
from grpo_gym.validation import ReturnTypeError
from tests.sizes import ENV_KWARGS, TINY_KWARGS


def accuracy(prompts: list[str], completions: list[str], answer: list[str], **kwargs: Any) -> list[float]:
    """TRL style: 1 when the completion's answer block holds the reference answer."""
    return [1.0 if f"<answer>{a}</answer>" in c else 0.0 for c, a in zip(completions, answer, strict=True)]


async def brevity(completions: list[str], completion_ids: list[list[int]], difficulty: list[float], **kwargs: Any):
    """An async one: None (not applicable) without an answer block, else a score from the token count."""
    await asyncio.sleep(0)
    return [
        None if "<answer>" not in c else round(1.0 / len(ids) + d, 6)
        for c, ids, d in zip(completions, completion_ids, difficulty, strict=True)
    ]


# ---------------------------------------------------------------------------------------------- checks
class CallableObject:
    def __call__(self, prompts, completions, **kwargs):
        return [0.0] * len(completions)


class AsyncCallable:
    async def __call__(self, prompts, completions, **kwargs):
        return [0.0] * len(completions)


@pytest.mark.parametrize(
    "fn",
    [accuracy, brevity, CallableObject(), AsyncCallable(), functools.partial(accuracy), lambda **kwargs: [1.0]],
    ids=["function", "async", "callable", "async-callable", "partial", "kwargs-only"],
)
def test_trl_signatures_are_accepted(fn: Any) -> None:
    check_reward_function("f", fn, lambda: ["answer", "difficulty"])


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (42, r"must be a function fn\(prompts, completions, \*\*kwargs\)"),
        ("accuracy", "must be a function"),
        (lambda prompts, completions: [1.0], r"must accept \*\*kwargs"),
        (lambda prompts, completions, /, **kw: [1.0], "positionally only"),
        (lambda prompts, completions, solution, **kw: [1.0], "requires 'solution', which the task does not provide"),
    ],
)
def test_bad_functions_are_refused_naming_the_fix(fn: Any, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        check_reward_function("f", fn, lambda: ["answer", "difficulty"])


def test_reward_funcs_mapping_checks() -> None:
    assert check_reward_funcs(None, ("task",)) == {}
    assert check_reward_funcs({"acc": accuracy}, ("task",)) == {"acc": accuracy}
    with pytest.raises(ValueError, match=r"must be a list of functions .* or a dict"):
        check_reward_funcs(42, ("task",))
    with pytest.raises(ValueError, match="'task' is a built-in component"):
        check_reward_funcs({"task": accuracy}, ("task",))
    with pytest.raises(ValueError, match=r"'task' is a built-in component .*; rename the function, or pass a dict"):
        check_reward_funcs([task], ("task",))
    with pytest.raises(ValueError, match="non-empty strings"):
        check_reward_funcs({"": accuracy}, ("task",))


def test_errors_at_env_construction() -> None:
    with pytest.raises(ValueError, match="'shape' must accept \\*\\*kwargs"):
        grpo_gym.R1ZeroEnv(**ENV_KWARGS, reward_funcs={"shape": lambda prompts, completions: [0.0]})
    with pytest.raises(ValueError, match=r"requires 'solution'.*its columns: answer, difficulty, operands, ops"):
        grpo_gym.R1ZeroEnv(**ENV_KWARGS, reward_funcs={"acc": lambda completions, solution, **kw: [0.0]})
    with pytest.raises(ValueError, match="reward_weights: unknown key 'acc'"):
        grpo_gym.R1ZeroEnv(**ENV_KWARGS, reward_weights={"acc": 1.0})
    env = grpo_gym.R1ZeroEnv(**ENV_KWARGS, reward_funcs={"acc": accuracy}, reward_weights={"acc": -0.5})
    assert env.reward_fn.weights["acc"] == -0.5 and env.reward_fn.names[-1] == "acc"
    assert is_async(brevity) and is_async(AsyncCallable()) and not is_async(accuracy)


def task(prompts, completions, **kwargs):
    return [0.0] * len(completions)


def test_a_list_is_named_as_trl_names_its_functions() -> None:
    named = check_reward_funcs(
        [accuracy, brevity, functools.partial(accuracy), CallableObject(), lambda **kw: [0.0], lambda **kw: [1.0]],
        ("task",),
    )
    assert list(named) == ["accuracy", "brevity", "accuracy_2", "CallableObject", "lambda", "lambda_2"]
    assert named["accuracy"] is accuracy and named["brevity"] is brevity
    assert check_reward_funcs(accuracy, ()) == {"accuracy": accuracy}  # one function, as TRL takes it
    assert list(check_reward_funcs((accuracy, accuracy, accuracy), ())) == ["accuracy", "accuracy_2", "accuracy_3"]


def test_functions_named_by_module_path() -> None:
    path = f"{__name__}:accuracy"
    assert check_reward_funcs([path], ()) == {"accuracy": accuracy}  # imported: you named it
    assert check_reward_funcs({"acc": path}, ()) == {"acc": accuracy}
    env = grpo_gym.R1ZeroEnv(**ENV_KWARGS, reward_funcs=[path, brevity])
    assert env.reward_fn.names[-2:] == ("accuracy", "brevity")
    with pytest.raises(ValueError, match=r"reward function path 'tests\.nowhere:f': cannot import 'tests\.nowhere'"):
        check_reward_funcs(["tests.nowhere:f"], ())
    with pytest.raises(ValueError, match=rf"reward function path '{__name__}:missing': .* has no 'missing'"):
        check_reward_funcs([f"{__name__}:missing"], ())
    with pytest.raises(ValueError, match=r"must look like 'package\.module:name'"):
        check_reward_funcs(["accuracy"], ())


# ---------------------------------------------------------------------------------------------- calls
def kwargs_for(completions: list[str], **columns: Any) -> dict[str, Any]:
    logs = RewardLogs(len(completions))
    ids = [list(range(len(c) + 1)) for c in completions]
    turns = {
        "turn": [0] * len(completions),
        "turn_completions": list(completions),
        "tool_calls": [[] for _ in completions],
    }  # one-turn episodes, as the env passes them
    return {"prompts": ["p"] * len(completions), "completions": completions, "completion_ids": ids,
            "trainer_state": None, "log_extra": logs.log_extra, "log_metric": logs.log_metric,
            **turns, **columns}  # fmt: skip


def test_call_passes_trl_arguments_and_keeps_nones() -> None:
    seen: dict[str, Any] = {}

    def spy(prompts, completions, **kwargs):
        seen.update(kwargs, prompts=prompts, completions=completions)
        return [True, None]  # booleans count as numbers (TRL's torch.tensor does the same)

    values = call_reward_funcs({"spy": spy, "brevity": brevity}, kwargs_for(["a", "<answer>1</answer>"],
                               answer=["1", "1"], difficulty=[0.5, 0.25]), 2)  # fmt: skip
    assert values["spy"] == [1.0, None]
    assert values["brevity"] == [None, round(1 / 19 + 0.25, 6)]
    assert set(PASSED) <= set(seen) and seen["answer"] == ["1", "1"] and seen["trainer_state"] is None


def test_a_wrong_count_is_an_error_for_every_completion() -> None:
    values = call_reward_funcs({"bad": lambda **kw: [0.5]}, kwargs_for(["a", "b"]), 2)["bad"]
    assert all(isinstance(v, ValueError) and "returned 1 rewards for 2 completions" in str(v) for v in values)


@pytest.mark.parametrize(
    ("output", "error"),
    [
        ("0.5", "not a list of floats"),
        (None, "not a list of floats"),
        (np.float64(1.0), "returned one number, np.float64(1.0) (float64), not a list"),  # round four: "no len()"
        (["high", 1], "returned 'high' (str), not a number"),
    ],
)
def test_an_output_of_the_wrong_type_is_the_functions_error(output: Any, error: str) -> None:
    """A bug in the function, not in a completion: raised, whatever on_reward_error says (hostile round five)."""
    with pytest.raises(ReturnTypeError, match=re.escape(error)):
        call_reward_funcs({"bad": lambda **kw: output}, kwargs_for(["a", "b"]), 2)


def test_bad_values_are_errors_for_their_completion_only() -> None:
    values = call_reward_funcs({"f": lambda **kw: np.array([np.nan, 0.25, 1.0])}, kwargs_for(["a", "b", "c"]), 3)["f"]
    assert isinstance(values[0], ValueError) and "non-finite" in str(values[0]) and values[1:] == [0.25, 1.0]


def test_raising_functions_do_not_stop_the_others() -> None:
    async def broken(**kwargs):
        raise KeyError("async bug")

    def also_broken(**kwargs):
        raise RuntimeError("sync bug")

    values = call_reward_funcs({"a": broken, "b": also_broken, "c": brevity}, kwargs_for(["x"], difficulty=[0.1]), 1)
    assert isinstance(values["a"][0], KeyError) and isinstance(values["b"][0], RuntimeError)
    assert values["c"] == [None]


def test_async_functions_run_inside_a_running_event_loop() -> None:
    async def main() -> dict[str, Any]:  # as in a notebook: a loop already runs in this thread
        return call_reward_funcs({"b": brevity}, kwargs_for(["<answer>1</answer>"], difficulty=[0.0]), 1)

    assert asyncio.run(main())["b"] == [round(1 / 19, 6)]


def test_log_metric_and_log_extra_reach_info() -> None:
    def logging(completions, log_metric, log_extra, **kwargs):
        log_metric("calls", 1.0)
        log_extra("first_char", [c[:1] for c in completions])
        return [0.0] * len(completions)

    env = grpo_gym.R1ZeroEnv(**ENV_KWARGS, reward_funcs={"logging": logging})
    env.reset(seed=0)
    _, _, _, _, info = env.step(env.encode_action("<think>a</think><answer>1</answer>"))
    assert info["reward_metrics"] == {"calls": 1.0} and info["reward_extra"] == {"first_char": ["<"][0]}


# ---------------------------------------------------------------------------------------------- TRL
def recording(fn: Any, seen: list[tuple[str, str, Any]]) -> Any:
    """``fn`` unchanged, plus a record of (prompt, completion, score) of every call (async kept async)."""
    if is_async(fn):

        async def wrapped(prompts, completions, **kwargs):
            scores = await fn(prompts=prompts, completions=completions, **kwargs)
            seen.extend(zip(prompts, completions, scores, strict=True))
            return scores

    else:

        def wrapped(prompts, completions, **kwargs):
            scores = fn(prompts=prompts, completions=completions, **kwargs)
            seen.extend(zip(prompts, completions, scores, strict=True))
            return scores

    wrapped.__name__ = fn.__name__
    return wrapped


def run_trl(
    folder: Path, prompts: list[str], problems: list[Any], texts: dict[str, list[str]], funcs: list[Any], **config: Any
) -> Any:
    """One GRPOTrainer step on the saved tiny model whose completions are ``texts[prompt]`` (a rollout_func); the
    trainer (its ``_logs`` hold the rollout's prompts, completions, per-function rewards and advantages)."""
    import trl
    from datasets import Dataset

    tokenizer = grpo_gym.build_char_tokenizer()
    handed: dict[str, int] = {}

    def rollout(batch_prompts: list[str], trainer: Any) -> dict[str, list[list[Any]]]:
        out: dict[str, list[list[Any]]] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for prompt in batch_prompts:
            index = handed.get(prompt, 0)
            handed[prompt] = index + 1
            ids = [*tokenizer(texts[prompt][index % len(texts[prompt])]).input_ids, tokenizer.eos_token_id]
            out["prompt_ids"].append(tokenizer(prompt).input_ids)
            out["completion_ids"].append(ids)
            out["logprobs"].append([0.0] * len(ids))
        return out

    dataset = Dataset.from_dict(
        {"prompt": prompts, "answer": [p.answer for p in problems], "difficulty": [p.difficulty for p in problems]}
    )
    args = trl.GRPOConfig(
        output_dir=str(folder.parent / "trl"), use_cpu=True, bf16=False, fp16=False, seed=0,
        gradient_checkpointing=False, per_device_train_batch_size=8, num_generations=4, max_completion_length=48,
        max_steps=1, report_to="none", logging_strategy="no", save_strategy="no", disable_tqdm=True, beta=0.0,
        **config,
    )  # fmt: skip
    trainer = trl.GRPOTrainer(
        model=str(folder), reward_funcs=funcs, args=args, train_dataset=dataset, rollout_func=rollout
    )
    trainer.train()
    return trainer


def test_the_same_functions_give_the_same_scores_in_trl_and_here(tmp_path: Path) -> None:
    from algorithms.common.model.loading import load_model

    folder = tmp_path / "model"
    load_model("tiny", seed=0, **TINY_KWARGS).save_pretrained(folder)
    grpo_gym.build_char_tokenizer().save_pretrained(folder)
    env = grpo_gym.R1ZeroEnv(**{**ENV_KWARGS, "max_new_tokens": 48}, reward_funcs={"acc": accuracy, "brev": brevity})
    problems = [env.sample_problem(seed=s) for s in (1, 2)]
    prompts = [env.formatter.prompt(p.prompt) for p in problems]
    texts = {
        prompt: [
            f"<think>{env.task.solution(p)[0]}</think><answer>{p.answer}</answer>",  # gold
            "<think>guess</think><answer>-1</answer>",  # wrong
            "no tags at all",  # brevity: None
            f"<answer>{p.answer}</answer>",  # right answer, no reasoning
        ]
        for prompt, p in zip(prompts, problems, strict=True)
    }
    seen_acc: list[tuple[str, str, Any]] = []
    seen_brev: list[tuple[str, str, Any]] = []
    run_trl(folder, prompts, problems, texts, [recording(accuracy, seen_acc), recording(brevity, seen_brev)])
    trl_scores = {(p, c, k): s for k, seen in enumerate((seen_acc, seen_brev)) for p, c, s in seen}
    assert len(seen_acc) == len(seen_brev) == 8 and sum(s is None for *_, s in seen_brev) == 2

    ours: dict[tuple[str, str, int], Any] = {}
    for prompt, problem in zip(prompts, problems, strict=True):
        actions = [env.encode_action(text) for text in texts[prompt]]
        env.score_ahead([problem] * 4, actions)  # the batched path
        for text, action in zip(texts[prompt], actions, strict=True):
            env.reset(options={"problem": problem})
            components = env.step(action)[4]["reward_components"]
            ours[(prompt, text, 0)], ours[(prompt, text, 1)] = components["acc"], components["brev"]
    pairs = [(key, trl_scores[key]) for key in ours]
    assert all(ours[key] == score for key, score in pairs), [(k, ours[k], s) for k, s in pairs if ours[k] != s]
    assert {s for *_, s in seen_acc} == {0.0, 1.0} and len({s for *_, s in seen_brev}) >= 3  # not all alike


def answer_match(prompts, completions, answer, **kwargs):
    return [float(c.endswith(f"<answer>{a}</answer>")) for c, a in zip(completions, answer, strict=True)]


def thinks(prompts, completions, **kwargs):
    return [None if "<" not in c else float(c.startswith("<think>")) for c in completions]


def pairwise_order(values: list[float]) -> list[int]:
    """For every pair (i, j), i < j: -1, 0 or 1 as values[i] is below, equal to or above values[j]."""
    pairs = [(a, b) for i, a in enumerate(values) for b in values[i + 1 :]]
    return [int(np.sign(round(a - b, 9))) for a, b in pairs]


def test_two_functions_add_up_and_order_completions_as_trl_does(tmp_path: Path) -> None:
    """TRL's own aggregation (GRPOTrainer: weighted nansum of the functions, then group advantages) against the env's
    total with the built-ins off: the same order within each group, ties included; the seed's clip would break it."""
    from algorithms.common.model.loading import load_model

    folder = tmp_path / "model"
    load_model("tiny", seed=0, **TINY_KWARGS).save_pretrained(folder)
    grpo_gym.build_char_tokenizer().save_pretrained(folder)
    weights = {"syntax": 0.0, "consistency": 0.0, "task": 0.0, "answer_match": 1.0, "thinks": 0.5}
    env = grpo_gym.R1ZeroEnv(
        **{**ENV_KWARGS, "max_new_tokens": 48}, reward_funcs=[answer_match, thinks], reward_weights=weights
    )
    problems = [env.sample_problem(seed=s) for s in (3, 4)]
    prompts = [env.formatter.prompt(p.prompt) for p in problems]
    texts = {
        prompt: [
            f"<think>{env.task.solution(p)[0]}</think><answer>{p.answer}</answer>",  # 1 + 0.5
            "<think>guess</think><answer>-1</answer>",  # 0 + 0.5
            f"<answer>{p.answer}</answer>",  # 1 + 0
            "no tags at all",  # 0 + None (left out of TRL's nansum and of ours)
        ]
        for prompt, p in zip(prompts, problems, strict=True)
    }
    trainer = run_trl(folder, prompts, problems, texts, [answer_match, thinks], reward_weights=[1.0, 0.5])
    logs = trainer._logs
    assert list(logs["rewards"]) == ["answer_match", "thinks"]  # TRL names them as the env does
    by_prompt: dict[str, list[tuple[str, float]]] = {}
    for prompt, completion, advantage in zip(logs["prompt"], logs["completion"], logs["advantages"], strict=True):
        by_prompt.setdefault(prompt, []).append((completion, advantage))
    assert sorted(by_prompt) == sorted(prompts) and all(len(group) == 4 for group in by_prompt.values())
    clipped = grpo_gym.R1ZeroEnv(
        **{**ENV_KWARGS, "max_new_tokens": 48}, reward_funcs=[answer_match, thinks], reward_weights=weights,
        reward_clip=1.0,
    )  # fmt: skip
    orders = []
    with pytest.warns(RuntimeWarning, match="clipped"):  # the clipped env warns (once) that it flattens totals
        for prompt, problem in zip(prompts, problems, strict=True):
            completions, trl_advantages = zip(*by_prompt[prompt], strict=True)
            ours, seed_clip = [], []
            for text in completions:
                for scorer, totals in ((env, ours), (clipped, seed_clip)):
                    scorer.reset(options={"problem": problem})
                    totals.append(scorer.step(scorer.encode_action(text))[1])
            assert sorted(ours) == [0.0, 0.5, 1.0, 1.5]  # the sum, unclipped
            orders.append((pairwise_order(ours), pairwise_order(seed_clip), pairwise_order(list(trl_advantages))))
    for ours_order, clipped_order, trl_order in orders:
        assert ours_order == trl_order
        assert clipped_order != trl_order  # with the seed's clip, 1.5 and 1.0 tie at 1
