"""Weights that load without a word (issue 60): a model file's frozen reference (``ref_model.pth``) is checked as its
policy is (a NaN, another shape, a missing or extra tensor, not a dict of tensors); a model source (a GGUF file, a
Hugging Face folder, an INT8 export, a reward model) that lacks weights transformers would fill with random values,
or holds a NaN, is refused naming the weights; a folder named ``x.gguf`` is said to be a folder."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch as th

from algorithms import GRPO
from algorithms.cli import main
from algorithms.common.model.loading import build_builtin_model, load_model
from algorithms.deploy.loading import load_policy
from algorithms.deploy.quantize import quantize_int8, save_int8
from grpo_gym.rewards import RewardModelScorer
from tests.test_hostile_files import make_env, rewrite, saved, with_tensors  # noqa: F401  (saved: the fixture)
from tests.test_reward_model import COMPLETIONS, PROMPTS, _save_model

#: a weight of the tiny model that no other tensor is tied to
UNTIED = "model.layers.0.self_attn.q_proj.weight"


def _error_line(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """The command's error: exit status 2, no traceback, the message its last line (transformers' progress bars
    may come before it)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def _with_nan(state: dict[str, th.Tensor]) -> dict[str, th.Tensor]:
    state[UNTIED] = state[UNTIED].clone()
    state[UNTIED][0, 0] = float("nan")
    return state


def _reshaped(state: dict[str, th.Tensor]) -> dict[str, th.Tensor]:
    state["model.embed_tokens.weight"] = th.zeros(3, 3)
    return state


REFERENCE_CASES = {  # before: what GRPO.load did with such a ref_model.pth
    "nan": (_with_nan, rf"frozen reference of .* \(ref_model\.pth\) has 1 NaN or infinite values in '{UNTIED}'"),
    "shape": (_reshaped, r"its ref_model\.pth does not fit .*'model\.embed_tokens\.weight' of shape \(3, 3\)"),
    "missing": (lambda s: {k: v for k, v in s.items() if k != "lm_head.weight"}, r"ref_model\.pth .*missing 'lm_h"),
    "extra": (lambda s: {**s, "bogus.weight": th.zeros(2)}, r"ref_model\.pth does not fit .*unexpected 'bogus"),
    "integers": (lambda s: {**s, UNTIED: s[UNTIED].long()}, rf"ref_model\.pth .*'{UNTIED}' of torch\.int64"),
    "not a dict": (lambda s: [1, 2], r"holds a list, not a dict of tensors, in its ref_model\.pth"),
}


@pytest.mark.parametrize("case", REFERENCE_CASES)
def test_a_damaged_reference_is_refused_like_the_policy(
    saved: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    case: str,
) -> None:
    """Before: a NaN loaded, then every step logged "kl nan" and was skipped; another shape, a missing or extra key
    raised torch's "Error(s) in loading state_dict" (GRPO.load and grpo-gym eval); integers loaded rounded; a list
    raised "Expected state_dict to be dict-like"."""
    change, words = REFERENCE_CASES[case]
    path = rewrite(saved, tmp_path / "reference.zip", with_tensors("ref_model.pth", change))
    with pytest.raises(ValueError, match=words) as refusal:
        GRPO.load(path, env=make_env())
    assert str(path) in str(refusal.value) and "use another save" in str(refusal.value)
    if case in ("nan", "shape"):
        assert "ref_model.pth" in _error_line(["eval", str(path)], capsys)


def test_a_whole_reference_still_loads(saved: Path) -> None:  # noqa: F811
    model = GRPO.load(saved, env=make_env())
    assert model.ref_model is not None and th.equal(
        model.ref_model.state_dict()[UNTIED], model.policy.model.state_dict()[UNTIED]
    )


# ------------------------------------------------------------------------------------------------- model sources
@pytest.fixture(scope="module")
def gguf_parts() -> tuple[Any, Any]:
    pytest.importorskip("gguf")
    from tests.gguf_files import byte_level_tokenizer, tiny_llama

    tokenizer = byte_level_tokenizer()
    return tiny_llama(len(tokenizer)), tokenizer


def _nan_copy(model: Any) -> Any:
    broken = type(model)(model.config)
    broken.load_state_dict(model.state_dict())
    with th.no_grad():
        broken.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    return broken


def test_a_gguf_file_without_weights_or_with_a_nan_is_refused(
    tmp_path: Path, gguf_parts: tuple[Any, Any], capsys: pytest.CaptureFixture
) -> None:
    """Before: zero tensors (or some left out) evaluated and trained a randomly initialised model with rc 0, only
    transformers' "MISSING" report to say so; a NaN weight evaluated with rc 0, and train later blamed the learning
    rate."""
    from tests.gguf_files import write_gguf

    llama, tokenizer = gguf_parts
    empty = write_gguf(llama, tokenizer, tmp_path / "empty.gguf", leave_out=list(llama.state_dict()))
    partial = write_gguf(llama, tokenizer, tmp_path / "partial.gguf", leave_out=["model.norm.weight"])
    nan = write_gguf(_nan_copy(llama), tokenizer, tmp_path / "nan.gguf")
    cases = {
        empty: r"GGUF file .*empty\.gguf' lacks 21 of the model's 21 weights \('lm_head\.weight', .* and 18 more\)",
        partial: r"lacks 1 of the model's 21 weights \('model\.norm\.weight'\).*export it again",
        nan: r"nan\.gguf' has 1 NaN or infinite values in 'model\.layers\.0\.mlp\.down_proj\.weight'",
    }
    for path, words in cases.items():
        with pytest.raises(ValueError, match=words):
            load_model(path)
        with pytest.raises(ValueError, match=words):  # policy_kwargs' model, distillation's teacher, serve
            load_policy(path)
        evaluate = ["eval", "--model", path, "--difficulty", "0.1", "--n", "2", "--max-new-tokens", "4"]
        assert re.search(words, _error_line(evaluate, capsys))
    for path in (empty, nan):  # refused before any training (a NaN was later blamed on the learning rate)
        train = ["train", "--model", path, "-n", "4", "--no-progress-bar", "-params", "n_groups:2", "group_size:2"]
        assert re.search(cases[path], _error_line(train, capsys))


def test_a_folder_named_like_a_gguf_file_is_said_to_be_a_folder(tmp_path: Path, gguf_parts: tuple[Any, Any]) -> None:
    """Before: "GGUF file '.../x.gguf' does not exist"."""
    from tests.gguf_files import write_gguf

    folder = tmp_path / "x.gguf"
    folder.mkdir()
    with pytest.raises(ValueError, match=r"GGUF path .*x\.gguf' is a folder, not a file: pass the path of a \.gguf"):
        load_model(folder)
    write_gguf(*gguf_parts, folder / "inner.gguf")
    with pytest.raises(ValueError, match=r"is a folder, not a file: pass a \.gguf file inside it \(inner\.gguf\)"):
        load_model(folder)


def _saved_folder(model: Any, tokenizer: Any, folder: Path, change=None) -> str:
    from safetensors.torch import load_file, save_file

    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if change is not None:
        weights = folder / "model.safetensors"
        save_file(change(load_file(weights)), weights, metadata={"format": "pt"})
    return str(folder)


def test_a_hugging_face_folder_without_weights_or_with_a_nan_is_refused(
    tmp_path: Path, gguf_parts: tuple[Any, Any], capsys: pytest.CaptureFixture
) -> None:
    """Before: the same silent random initialisation (and a NaN loaded) from a save_pretrained folder whose
    model.safetensors lacks tensors, through load_model, policy_kwargs and --model."""
    llama, tokenizer = gguf_parts
    empty = _saved_folder(llama, tokenizer, tmp_path / "empty", lambda state: {})
    layer = _saved_folder(
        llama, tokenizer, tmp_path / "layer", lambda s: {k: v for k, v in s.items() if "ers.1." not in k}
    )
    nan = _saved_folder(_nan_copy(llama), tokenizer, tmp_path / "nan")
    with pytest.raises(ValueError, match=r"model folder .*empty' lacks 21 of the model's 21 weights .*save_pretrained"):
        load_model(empty)
    train = ["train", "--model", layer, "-n", "4", "--no-progress-bar", "-params", "n_groups:2", "group_size:2"]
    assert re.search(r"lacks 9 of the model's 21 weights \('model\.layers\.1\.", _error_line(train, capsys))
    with pytest.raises(ValueError, match=r"nan' has 1 NaN or infinite values in 'model\.layers\.0\.mlp\.down_proj"):
        load_model(nan)
    shutil.rmtree(tmp_path / "layer")  # a whole folder still loads
    assert load_model(_saved_folder(llama, tokenizer, tmp_path / "layer")).config.num_hidden_layers == 2


def test_an_int8_export_without_a_tensor_is_named(tmp_path: Path) -> None:
    """Before: torch's "Error(s) in loading state_dict ... Missing key(s)" (or "size mismatch") from load_policy
    (grpo-gym eval, serve, a distillation's teacher)."""
    from safetensors.torch import load_file, save_file

    small = build_builtin_model("tiny", seed=0, num_hidden_layers=1, hidden_size=32, intermediate_size=64)
    folder = save_int8(quantize_int8(small), tmp_path / "int8")
    weights = folder / "model_int8.safetensors"
    state = load_file(weights)
    save_file({k: v for k, v in state.items() if k != "model.norm.weight"}, weights)
    with pytest.raises(
        ValueError, match=r"INT8 export .* lacks 1 of the model's \d+ weights \('model\.norm\.weight'\)"
    ):
        load_policy(folder)
    save_file({**state, "model.norm.weight": th.ones(3)}, weights)
    with pytest.raises(ValueError, match=r"model_int8\.safetensors: its weights do not fit .*model\.norm\.weight"):
        load_policy(folder)


def test_a_reward_model_with_a_nan_is_refused(tmp_path: Path) -> None:
    """Before: every score was NaN, read as 0: training went on with no reward signal, without a word."""
    from safetensors.torch import load_file, save_file

    folder = _save_model(tmp_path / "reward")
    weights = folder / "model.safetensors"
    state = load_file(weights)
    state["model.layers.0.mlp.down_proj.weight"][0, 0] = float("inf")
    save_file(state, weights, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"reward model .* NaN or infinite values in 'model\.layers\.0\.mlp\.down_"):
        RewardModelScorer(folder).score(PROMPTS, COMPLETIONS)
