"""reasoning-gym's procedural datasets as tasks: ``task="reasoning_gym:<dataset name>"``.

Needs the optional extra ``pip install grpo-gym[reasoning-gym]`` (imported when such a task is made). Problems come
from ``reasoning_gym.create_dataset``; answers are scored by the dataset's own ``score_answer``, so the ``task``
reward component is reasoning-gym's score in [0, 1] with its partial credit (``0.5`` for ``-4.0`` against ``-4``
in ``basic_arithmetic``), and ``is_success`` means full credit.

**Difficulty.** A family with a reasoning-gym curriculum (all but ``acre``, ``composite``, ``gsm_symbolic`` and
``list_functions`` in reasoning-gym 0.1.x) sets every curriculum attribute to level
``round((difficulty - 0.1) / 0.9 * (levels - 1))`` of that attribute's levels (0.1 = the first level, 1.0 = the
last) and builds the configuration with reasoning-gym's default curriculum context (a range attribute spans
its levels from the first up to that one). ``grpo-gym tasks`` lists each family's attributes and level counts.
Families without a curriculum are fixed: difficulty changes nothing. ``config`` (task kwargs) sets configuration
fields yourself; they win over the mapping.

**Problems.** One dataset per level vector (cached), seeded with ``dataset_seed``, of ``VIRTUAL_SIZE`` (100,000)
entries; a problem is the entry at an index drawn from the env's generator, so the same seed gives the same
problem. Held-out problems (:meth:`ReasoningGymTask.eval_problems`) come from datasets seeded ``EVAL_SEED_OFFSET``
(2**31) higher, so they are not training entries (reasoning-gym seeds each entry with ``seed + index``; families
that read a fixed list of puzzles, such as ``arc_agi``, repeat theirs). ``Problem.metadata`` holds the entry's
``metadata`` and its raw ``answer``.

**Rewards.** Reward functions receive the columns ``question``, ``answer``, ``metadata``, ``entry`` (the whole
reasoning-gym entry, for ``score_answer(answer, entry)``) and ``difficulty``. Consistency applies to entries with
a numeric answer (the reasoning's last number must agree with the answer; prompts hold instructions and examples,
so no key terms are required); elsewhere it is ``None``. Gold reasoning for the cold start is the entry's
``metadata["answer_cot"]`` where the family gives one (``gsm_symbolic``); other entries get the cold start's
stand-in. Entries without a single gold answer (e.g. ``boxnet``) cannot make cold-start targets: use ``sft_data``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from grpo_gym.tasks.base import (
    HELD_OUT_SEED,
    MIN_DIFFICULTY,
    Problem,
    Task,
    Verdict,
    check_difficulty,
    numbers_agree,
)
from grpo_gym.validation import ArgumentError, check_int

PREFIX = "reasoning_gym:"
VIRTUAL_SIZE = 100_000  # some families allocate per entry at construction (gsm_symbolic): keep it modest
EVAL_SEED_OFFSET = 2**31
INSTALL = "pip install 'grpo-gym[reasoning-gym]'"


def _factory() -> Any:
    try:
        import reasoning_gym.factory as factory
    except ImportError:
        raise ImportError(f"reasoning-gym tasks need the reasoning-gym package: {INSTALL}") from None
    return factory


def dataset_names() -> list[str]:
    """The reasoning-gym dataset names (``ImportError`` naming the extra when it is not installed)."""
    return sorted(_factory().DATASETS)


def level_of(difficulty: float, n_levels: int) -> int:
    """The curriculum level of ``difficulty``: 0.1 -> 0, 1.0 -> ``n_levels - 1``, linear and rounded between."""
    return round((check_difficulty(difficulty) - MIN_DIFFICULTY) / (1.0 - MIN_DIFFICULTY) * (n_levels - 1))


def difficulty_mapping(name: str) -> dict[str, int]:
    """The curriculum attributes of dataset ``name`` and their level counts (empty: difficulty is fixed)."""
    factory = _factory()
    if name not in factory.CURRICULA:
        return {}
    curriculum = factory.create_curriculum(name)
    return {attr: len(definition.levels) for attr, definition in curriculum.attributes.items()}


class ReasoningGymTask(Task):
    """A reasoning-gym dataset as a task (see the module docstring).

    :param dataset: the reasoning-gym dataset name, e.g. ``"chain_sum"`` (``task="reasoning_gym:chain_sum"``)
    :param config: configuration fields of the dataset to fix (they win over the difficulty mapping)
    :param dataset_seed: the seed of the datasets the problems are indexed from
    """

    def __init__(self, dataset: str, config: dict[str, Any] | None = None, dataset_seed: int = 0) -> None:
        factory = _factory()
        if not isinstance(dataset, str) or dataset not in factory.DATASETS:
            raise ArgumentError(
                f"unknown reasoning-gym dataset {dataset!r}; `grpo-gym tasks` lists them (e.g. 'chain_sum')"
            )
        if config is not None and not isinstance(config, dict):
            raise ArgumentError(f"config must be a dict of {dataset!r}'s configuration fields or None, got {config!r}")
        self.dataset = dataset
        self.name = f"{PREFIX}{dataset}"  # type: ignore[misc]
        self.config = dict(config or {})
        self.dataset_seed = check_int("dataset_seed", dataset_seed, low=0)
        self._factory = factory
        self._datasets: dict[tuple[bool, tuple[int, ...]], Any] = {}
        self._mapping = difficulty_mapping(dataset)
        fields = {f.name for f in dataclasses.fields(factory.DATASETS[dataset][1])}
        unknown = sorted(set(self.config) - fields)
        if unknown:
            raise ArgumentError(f"config: {dataset!r} has no field(s) {unknown}; its fields: {sorted(fields)}")
        self._dataset_for(MIN_DIFFICULTY)  # a bad config fails here, not at the first reset

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_factory"], state["_datasets"] = None, {}  # rebuilt where the task is unpickled
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._factory = _factory()

    def _dataset_for(self, difficulty: float, held_out: bool = False) -> Any:
        levels = tuple(level_of(difficulty, n) for n in self._mapping.values())
        dataset = self._datasets.get((held_out, levels))
        if dataset is None:
            settings: dict[str, Any] = {}
            if self._mapping:
                curriculum = self._factory.create_curriculum(self.dataset)
                for attr, level in zip(self._mapping, levels, strict=True):
                    curriculum.set_attr_level(attr, level)
                config = curriculum.generate_configuration({})
                settings = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
            seed = self.dataset_seed + (EVAL_SEED_OFFSET if held_out else 0)
            settings.update(self.config, seed=seed, size=VIRTUAL_SIZE)
            try:
                dataset = self._factory.create_dataset(self.dataset, **settings)
            except (AssertionError, TypeError, ValueError) as error:
                raise ArgumentError(f"reasoning-gym {self.dataset!r} refused the configuration: {error}") from None
            self._datasets[(held_out, levels)] = dataset
        return dataset

    def sample(self, difficulty: float, rng: np.random.Generator) -> Problem:
        """The entry at an index drawn from ``rng`` of the dataset at ``difficulty``'s levels."""
        difficulty = check_difficulty(difficulty)
        index = int(rng.integers(VIRTUAL_SIZE))
        return self._problem(self._dataset_for(difficulty)[index], index, difficulty)

    def eval_problems(self, n: int, difficulty: float, seed: int = 0) -> list[Problem]:
        """``n`` entries of the held-out datasets (seeded ``EVAL_SEED_OFFSET`` higher), at indices drawn from seeds
        ``HELD_OUT_SEED + seed * n + i``: the same set every time, none of them a training entry."""
        difficulty = check_difficulty(difficulty)
        n, seed = check_int("n", n, low=0), check_int("seed", seed, low=0)
        dataset = self._dataset_for(difficulty, held_out=True)
        indices = [int(np.random.default_rng(HELD_OUT_SEED + seed * n + i).integers(VIRTUAL_SIZE)) for i in range(n)]
        return [self._problem(dataset[index], index, difficulty) for index in indices]

    def _problem(self, entry: dict[str, Any], index: int, difficulty: float) -> Problem:
        answer = entry.get("answer")
        return Problem(
            prompt=str(entry["question"]),
            answer="" if answer is None else str(answer),
            task=self.name,
            difficulty=difficulty,
            metadata={"index": index, "answer": answer, "metadata": entry.get("metadata", {})},
        )

    def entry(self, problem: Problem) -> dict[str, Any]:
        """The reasoning-gym entry of ``problem`` (what ``score_answer`` reads)."""
        return {"question": problem.prompt, "answer": problem.metadata.get("answer"), **_meta(problem)}

    def verify(self, problem: Problem, answer: str) -> Verdict:
        """The dataset's own ``score_answer``: full credit is correct, anything between is partial credit."""
        if not isinstance(answer, str):
            return Verdict(False, "answer is not text", 0.0)
        score = float(self._dataset_for(problem.difficulty).score_answer(answer, self.entry(problem)))
        score = min(1.0, max(0.0, score)) if score == score else 0.0
        if score >= 1.0 - 1e-9:
            return Verdict(True, "", 1.0)
        return Verdict(False, f"partial credit {score:.3g}" if score > 0 else "incorrect", score)

    def solution(self, problem: Problem) -> tuple[str, str]:
        """``(metadata["answer_cot"] or "", the answer)``; ``ValueError`` for entries without a gold answer."""
        if problem.metadata.get("answer") is None:
            raise ValueError(
                f"reasoning-gym {self.dataset!r} gives no single gold answer, so it cannot make cold-start targets: "
                "pass cold_start_kwargs={'data': ...} (prompt/response rows) or cold_start=False"
            )
        cot = _meta(problem)["metadata"].get("answer_cot")
        return (cot if isinstance(cot, str) else ""), problem.answer

    def key_terms(self, problem: Problem) -> list[str]:
        """None: reasoning-gym prompts hold instructions and examples, whose numbers are not the problem's terms."""
        return []

    def answers_agree(self, problem: Problem, first: str, second: str) -> bool:
        """Numeric agreement when both read as numbers, else equal after removing spaces."""
        numeric = numbers_agree(first, second)
        return numeric if numeric is not None else super().answers_agree(problem, first, second)

    def reward_columns(self, problem: Problem) -> dict[str, Any]:
        """``question``, ``answer``, ``metadata``, ``entry`` and ``difficulty`` (see the module docstring)."""
        entry = self.entry(problem)
        return {
            "question": problem.prompt,
            "answer": entry["answer"],
            "metadata": entry["metadata"],
            "entry": entry,
            "difficulty": problem.difficulty,
        }


def _meta(problem: Problem) -> dict[str, Any]:
    metadata = problem.metadata.get("metadata")
    return {"metadata": metadata if isinstance(metadata, dict) else {}}
