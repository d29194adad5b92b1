"""reasoning-gym datasets as tasks: problems, partial credit in ``info``, the difficulty mapping, consistency only
for numeric answers, gold reasoning from the metadata, and GRPO training on two families."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

import grpo_gym
from algorithms import GRPO
from grpo_gym.tasks import ReasoningGymTask, make_task
from grpo_gym.tasks.reasoning_gym import dataset_names, difficulty_mapping, level_of
from tests.sizes import ENV_KWARGS, TINY

ENV = {**ENV_KWARGS, "max_new_tokens": 32}


def step(env: grpo_gym.R1ZeroEnv, problem: grpo_gym.Problem, reasoning: str, answer: str) -> dict:
    env.reset(options={"problem": problem})
    return env.step(env.encode_action(f"<think>{reasoning}</think><answer>{answer}</answer>"))[4]


def test_problems_are_the_datasets_entries_drawn_by_seed() -> None:
    task = make_task("reasoning_gym:basic_arithmetic")
    assert isinstance(task, ReasoningGymTask) and task.name == "reasoning_gym:basic_arithmetic"
    first = task.sample_seeded(0.5, 7)
    assert first == task.sample_seeded(0.5, 7) and first != task.sample_seeded(0.5, 8)
    assert first.task == task.name and first.prompt.startswith("Calculate") and first.metadata["metadata"]
    held_out = task.eval_problems(8, 1.0)
    assert held_out == task.eval_problems(8, 1.0) and len({p.prompt for p in held_out}) == 8
    assert not {p.prompt for p in held_out} & {task.sample_seeded(1.0, s).prompt for s in range(50)}
    assert task._dataset_for(1.0, held_out=True).seed == task._dataset_for(1.0).seed + 2**31  # other entries
    copy = pickle.loads(pickle.dumps(task))  # SubprocVecEnv workers and saved env states get it like this
    assert copy.sample_seeded(0.5, 7) == first and "basic_arithmetic" in dataset_names()


def test_partial_credit_shows_in_info() -> None:
    env = grpo_gym.R1ZeroEnv(**ENV, task="reasoning_gym:basic_arithmetic")
    problem = env.sample_problem(seed=0)
    full = step(env, problem, f"so {problem.answer}", problem.answer)
    assert full["reward_components"]["task"] == 1.0 and full["is_success"]
    partial = step(env, problem, f"so {problem.answer}", problem.answer + ".0")  # reasoning-gym: half credit
    assert 0.0 < partial["reward_components"]["task"] < 1.0 and not partial["is_success"]
    assert partial["reward_reasons"]["task"].startswith("partial credit")
    assert partial["reward_components"]["consistency"] == 1.0  # numeric: the conclusion agrees, no key terms
    wrong = step(env, problem, "no idea", "no idea")
    assert wrong["reward_components"]["task"] == 0.0 and wrong["reward_reasons"]["task"] == "incorrect"


def test_consistency_is_not_applicable_to_text_answers() -> None:
    env = grpo_gym.R1ZeroEnv(**ENV, task="reasoning_gym:spell_backward")
    problem = env.sample_problem(seed=1)
    info = step(env, problem, "reverse the letters", problem.answer)
    assert info["is_success"] and info["reward_components"]["consistency"] is None
    assert info["reward_components"]["task"] == 1.0 and "not applicable" in info["reward_reasons"]["consistency"]


def test_difficulty_maps_onto_the_curriculum_levels() -> None:
    assert difficulty_mapping("chain_sum") == {"num_terms": 11, "num_digits": 10}
    assert difficulty_mapping("gsm_symbolic") == {}  # no curriculum: fixed
    assert [level_of(d, 5) for d in (0.1, 0.3, 0.55, 1.0)] == [0, 1, 2, 4]
    task = make_task("reasoning_gym:chain_sum")
    easy, hard = task._dataset_for(0.1).config, task._dataset_for(1.0).config
    assert (easy.max_terms, easy.max_digits) == (2, 1) and (hard.max_terms, hard.max_digits) == (12, 10)
    terms = [p.prompt.count("+") + p.prompt.count("-") for p in (task.sample_seeded(1.0, s) for s in range(40))]
    assert max(terms) > 1  # harder problems appear at the top level
    fixed = make_task("reasoning_gym:chain_sum", config={"max_terms": 2, "min_terms": 2})
    assert fixed._dataset_for(1.0).config.max_terms == 2  # the user's config wins


def test_gold_reasoning_from_metadata_and_entries_without_an_answer() -> None:
    gsm = make_task("reasoning_gym:gsm_symbolic")
    problem = gsm.sample_seeded(1.0, 0)
    reasoning, answer = gsm.solution(problem)
    assert reasoning == problem.metadata["metadata"]["answer_cot"] and answer == problem.answer
    env = grpo_gym.R1ZeroEnv(context_length=2048, max_new_tokens=512, task="reasoning_gym:gsm_symbolic")
    env.reset(seed=0)
    env.gold_examples(2)
    assert env.gold_stand_ins == 0  # real reasoning, no stand-in
    boxnet = make_task("reasoning_gym:boxnet")
    with pytest.raises(ValueError, match=r"no single gold answer.*cold_start_kwargs"):
        boxnet.solution(boxnet.sample_seeded(0.1, 0))


def test_reward_functions_get_the_entry_to_score_with() -> None:
    def rg_score(completions, entry, metadata, **kwargs):
        assert all(isinstance(m, dict) for m in metadata)
        return [float(e["answer"] in c) for c, e in zip(completions, entry, strict=True)]

    env = grpo_gym.R1ZeroEnv(**ENV, task="reasoning_gym:leg_counting", reward_funcs={"rg": rg_score})
    problem = env.sample_problem(seed=2)
    assert step(env, problem, "count", problem.answer)["reward_components"]["rg"] == 1.0


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("reasoning_gym:no_such_dataset", {}, "unknown reasoning-gym dataset 'no_such_dataset'"),
        ("reasoning_gym:chain_sum", {"config": {"colour": 1}}, "has no field(s) ['colour']"),
        ("reasoning_gym:chain_sum", {"config": {"min_terms": 5, "max_terms": 2}}, "refused the configuration"),
        ("reasoning_gym:chain_sum", {"dataset": "x"}, "unknown key 'dataset'"),
    ],
)
def test_bad_reasoning_gym_tasks_are_refused(name: str, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        make_task(name, **kwargs)
    assert message in str(info.value)


class Infos(BaseCallback):
    def __init__(self) -> None:
        super().__init__()
        self.infos: list[dict] = []

    def _on_step(self) -> bool:
        self.infos.extend(self.locals["infos"])
        return True


@pytest.mark.parametrize("family", ["chain_sum", "spell_backward"])
def test_grpo_trains_on_a_reasoning_gym_family(family: str) -> None:
    env = DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**ENV, task=f"reasoning_gym:{family}"))])
    model = GRPO(
        "TransformerPolicy",
        env,
        n_groups=2,
        group_size=4,
        cold_start_kwargs={"steps": 2, "batch_size": 4},
        seed=0,
        policy_kwargs=TINY,
        learning_rate=1e-3,
    )
    before = [p.detach().clone() for p in model.policy.parameters()]
    spy = Infos()
    with pytest.warns(UserWarning, match="had no gold reasoning"):  # the cold start used stand-ins
        model.learn(16, callback=spy)
    assert model.num_timesteps == 16 and len(spy.infos) == 16
    assert any(not np.array_equal(a, b.detach()) for a, b in zip(before, model.policy.parameters(), strict=True))
    components = [info["reward_components"] for info in spy.infos]
    assert all(0.0 <= c["task"] <= 1.0 and c["syntax"] in (0.0, 1.0) for c in components)
    assert all(info["difficulty"] == 0.1 for info in spy.infos)
