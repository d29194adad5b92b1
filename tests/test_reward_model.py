"""Tests for grpo_gym.rewards.reward_model, with a real tiny sequence classifier built and saved locally."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from grpo_gym.rewards import CompositeReward, RewardModelScorer
from grpo_gym.tasks.base import Problem, Task, Verdict

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

REPO = Path(__file__).resolve().parents[1]

PROMPTS = ["What is 12 + 30?", "What is 1 + 2?", "", "Add 7 and 8 please"]
COMPLETIONS = [
    "<think>12 + 30 = 42</think><answer>42</answer>",
    "<think>1 + 2 = 3 so the answer is 3</think><answer>3</answer>",
    "<answer>nothing</answer>",
    "<think>7 + 8 = 15 , let me check : 7 + 8 is 15 indeed</think><answer>15</answer> trailing words",
]


def _tokenizer(with_eos: bool = True):
    """A small word-level tokenizer trained on the test strings, wrapped as a transformers tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["[UNK]", "[EOS]"] if with_eos else ["[UNK]"]
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(PROMPTS + COMPLETIONS, trainers.WordLevelTrainer(special_tokens=specials))
    kwargs = {"eos_token": "[EOS]"} if with_eos else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", **kwargs)


def _save_model(path: Path, num_labels: int = 1, with_eos: bool = True, seed: int = 0) -> Path:
    """Build a tiny random Llama sequence classifier and save it (and its tokenizer) to ``path``."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tokenizer = _tokenizer(with_eos)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        num_labels=num_labels,
    )
    torch.manual_seed(seed)
    model = LlamaForSequenceClassification(config)
    with torch.no_grad():  # a larger head spreads the scores away from 0.5
        model.score.weight.mul_(50.0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_model(tmp_path_factory.mktemp("rm1"))


def _manual_scores(path: Path, softmax: bool) -> np.ndarray:
    """Score each pair alone (no padding) straight through transformers."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    out = []
    with torch.no_grad():
        for prompt, completion in zip(PROMPTS, COMPLETIONS, strict=True):
            ids = tokenizer(prompt, completion, return_tensors="pt")
            logits = model(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"]).logits[0]
            out.append(float(torch.softmax(logits, -1)[1] if softmax else torch.sigmoid(logits[0])))
    return np.array(out)


def test_score_shape_range_determinism(model_dir: Path) -> None:
    scorer = RewardModelScorer(model_dir, batch_size=3)
    assert not scorer.loaded
    scores = scorer.score(PROMPTS, COMPLETIONS)
    assert scorer.loaded
    assert scores.shape == (4,) and scores.dtype == np.float64
    assert np.all((scores >= 0.0) & (scores <= 1.0))
    assert np.ptp(scores) > 1e-3  # a real model, not a constant
    np.testing.assert_array_equal(scores, scorer.score(PROMPTS, COMPLETIONS))
    np.testing.assert_array_equal(scores, RewardModelScorer(str(model_dir), batch_size=3).score(PROMPTS, COMPLETIONS))


def test_single_logit_is_sigmoid(model_dir: Path) -> None:
    scores = RewardModelScorer(model_dir).score(PROMPTS, COMPLETIONS)
    np.testing.assert_allclose(scores, _manual_scores(model_dir, softmax=False), atol=1e-5)


def test_two_labels_is_softmax_of_label_1(tmp_path: Path) -> None:
    path = _save_model(tmp_path, num_labels=2)
    scores = RewardModelScorer(path, batch_size=2).score(PROMPTS, COMPLETIONS)
    np.testing.assert_allclose(scores, _manual_scores(path, softmax=True), atol=1e-5)


def test_batch_size_does_not_change_scores(model_dir: Path) -> None:
    one = RewardModelScorer(model_dir, batch_size=1).score(PROMPTS, COMPLETIONS)
    four = RewardModelScorer(model_dir, batch_size=4).score(PROMPTS, COMPLETIONS)
    np.testing.assert_allclose(one, four, atol=1e-5, rtol=0)


def test_pad_token_from_eos(model_dir: Path) -> None:
    scorer = RewardModelScorer(model_dir).load()
    assert scorer._tokenizer.pad_token == "[EOS]"
    assert scorer._model.config.pad_token_id == scorer._tokenizer.convert_tokens_to_ids("[EOS]")


def test_pad_token_added_without_eos(tmp_path: Path) -> None:
    path = _save_model(tmp_path, with_eos=False)
    scorer = RewardModelScorer(path, batch_size=4)
    scores = scorer.score(PROMPTS, COMPLETIONS)
    assert scorer._tokenizer.pad_token == "[PAD]"
    assert scorer._model.get_input_embeddings().num_embeddings == len(scorer._tokenizer)
    one = RewardModelScorer(path, batch_size=1).score(PROMPTS, COMPLETIONS)
    np.testing.assert_allclose(scores, one, atol=1e-5, rtol=0)


def test_max_length_truncates(model_dir: Path) -> None:
    scorer = RewardModelScorer(model_dir, max_length=8)
    long = COMPLETIONS[3] * 200
    scores = scorer.score([PROMPTS[0]], [long])
    assert scores.shape == (1,) and 0.0 <= scores[0] <= 1.0


def test_huge_texts_are_cut_before_tokenizing_without_changing_scores(model_dir: Path, monkeypatch) -> None:
    import grpo_gym.rewards.reward_model as reward_model

    scorer = RewardModelScorer(model_dir, max_length=16)
    prompt = f"{PROMPTS[0]} " * 100 + f"{PROMPTS[1]} " * 100  # more than 64 * 16 characters; start != end
    assert len(prompt) > reward_model.MAX_CHARS_PER_TOKEN * 16
    cut = scorer.score([prompt, "short"], [COMPLETIONS[0] * 100, COMPLETIONS[1]])
    monkeypatch.setattr(reward_model, "MAX_CHARS_PER_TOKEN", 10**9)  # no cut: the whole texts are tokenized
    np.testing.assert_array_equal(scorer.score([prompt, "short"], [COMPLETIONS[0] * 100, COMPLETIONS[1]]), cut)


def test_empty_and_mismatched(model_dir: Path) -> None:
    scorer = RewardModelScorer(model_dir)
    assert scorer.score([], []).shape == (0,)
    assert not scorer.loaded  # nothing to score, nothing loaded
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        scorer.score(["a", "b"], ["c"])


def test_pickle_drops_model(model_dir: Path) -> None:
    scorer = RewardModelScorer(model_dir)
    scores = scorer.score(PROMPTS, COMPLETIONS)
    copy = pickle.loads(pickle.dumps(scorer))
    assert scorer.loaded and not copy.loaded
    np.testing.assert_allclose(copy.score(PROMPTS, COMPLETIONS), scores, atol=1e-6)


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"does not exist.*save_pretrained"):
        RewardModelScorer(tmp_path / "missing")
    with pytest.raises(ValueError, match="does not exist"):
        RewardModelScorer("./not/here")
    a_file = tmp_path / "weights.bin"
    a_file.write_bytes(b"\x00")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        RewardModelScorer(a_file)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"has no config\.json"):
        RewardModelScorer(empty)
    (empty / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json is not a valid UTF-8 JSON file"):  # checked when made
        RewardModelScorer(empty)
    (empty / "config.json").write_text("{}")
    scorer = RewardModelScorer(empty)  # lazy: the model is only read when scoring
    with pytest.raises(ValueError, match=r"could not load a reward model .*save_pretrained.*Cause: "):
        scorer.score(["p"], ["c"])
    with pytest.raises(ValueError, match="batch_size"):
        RewardModelScorer(empty, batch_size=0)


def test_a_hub_name_not_in_the_cache_stops_the_first_scoring(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hostile round four: the env was built and trained with the consistency reward 0 at every step."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import: set it for this test
    reward = CompositeReward(reward_model="someone/not-a-model")
    problem = Problem(prompt="What is 0 + 0?", answer="0", task="sum", difficulty=0.3)
    with pytest.raises(ValueError, match=r"reward model 'someone/not-a-model' is not a folder here"):
        reward(SumTask(), problem, "<think>0</think><answer>0</answer>", prompt_text="What is 0 + 0?")


def test_a_causal_lm_folder_is_refused_as_a_reward_model(tmp_path: Path) -> None:
    """Hostile round four: transformers gave it a random score head ("score.weight MISSING") and it scored noise."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"has no trained weights for score\.weight: it is not a sequence-class"):
        RewardModelScorer(tmp_path).load()


def test_three_labels_rejected(tmp_path: Path) -> None:
    path = _save_model(tmp_path, num_labels=3)
    with pytest.raises(ValueError, match="num_labels=3"):
        RewardModelScorer(path).load()


class SumTask(Task):
    name = "sum"

    def sample(self, difficulty: float, rng: np.random.Generator) -> Problem:
        raise NotImplementedError

    def verify(self, problem: Problem, answer: str) -> Verdict:
        return Verdict(answer.strip() == problem.answer, "wrong sum")

    def solution(self, problem: Problem) -> tuple[str, str]:
        raise NotImplementedError


def test_composite_uses_reward_model(model_dir: Path) -> None:
    task = SumTask()
    problems = [
        Problem(prompt=p or "What is 0 + 0?", answer=a, task="sum", difficulty=0.3)
        for p, a in zip(PROMPTS, ["42", "3", "0", "15"], strict=True)
    ]
    expected = RewardModelScorer(model_dir).score(PROMPTS, COMPLETIONS)
    for reward in (
        CompositeReward(reward_model=RewardModelScorer(model_dir)),
        CompositeReward(reward_model=model_dir),
    ):
        results = reward.score_batch(task, problems, COMPLETIONS, PROMPTS)
        consistency = np.array([r.components["consistency"] for r in results])
        np.testing.assert_allclose(consistency, expected, atol=1e-6)
        totals = [r.total for r in results]
        hand = [
            0.3 + 0.4 * expected[0] + 0.3,
            0.3 + 0.4 * expected[1] + 0.3,
            0.4 * expected[2],
            0.4 * expected[3] + 0.3,
        ]
        np.testing.assert_allclose(totals, hand, atol=1e-6)
        single = reward(task, problems[0], COMPLETIONS[0], prompt_text=PROMPTS[0])
        assert single.components["consistency"] == pytest.approx(expected[0], abs=1e-5)
        assert single.reasons["consistency"].startswith("reward model score ")


def test_composite_reward_model_survives_bad_completions(model_dir: Path) -> None:
    task = SumTask()
    problem = Problem(prompt="What is 1 + 2?", answer="3", task="sum", difficulty=0.3)
    bad = [
        b"\xff\xfe<think>1 + 2</think><answer>3</answer>",
        b"\xff" * (5 * 1024 * 1024),
        "",
        "<answer>" * 1000,
    ]
    results = CompositeReward(reward_model=RewardModelScorer(model_dir, max_length=64)).score_batch(
        task, [problem] * 4, bad, ["Q"] * 4
    )
    assert [r.is_success for r in results] == [True, False, False, False]
    assert all(0.0 <= r.total <= 1.0 and 0.0 <= r.components["consistency"] <= 1.0 for r in results)


def _run_python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)


def test_rewards_package_does_not_import_torch() -> None:
    # Load grpo_gym.rewards without running grpo_gym/__init__.py, so only the rewards package is judged.
    code = (
        "import sys, types\n"
        "pkg = types.ModuleType('grpo_gym'); pkg.__path__ = ['grpo_gym']; sys.modules['grpo_gym'] = pkg\n"
        "import grpo_gym.rewards\n"
        "grpo_gym.rewards.CompositeReward(reward_model=grpo_gym.rewards.RewardModelScorer('org/some-model'))\n"
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = _run_python(code)
    assert proc.returncode == 0, proc.stderr


def test_import_grpo_gym_rewards_does_not_import_torch() -> None:
    proc = _run_python("import grpo_gym.rewards, sys; assert 'torch' not in sys.modules")
    assert proc.returncode == 0, proc.stderr
