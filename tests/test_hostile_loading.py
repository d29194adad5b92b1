"""Hostile Hugging Face folders and records (grpo_gym.hub): no loader runs a folder's code, asks a question whose
yes would run it, or reads an oversized config or allocates an implausible model before a clear error."""

from __future__ import annotations

import builtins
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import grpo_gym  # noqa: F401
from algorithms import GRPO
from algorithms.cli import main as cli_main
from algorithms.common.model.loading import build_builtin_model, load_model
from algorithms.common.model.tokenizer_check import model_tokenizer
from algorithms.common.policies import TransformerPolicy
from algorithms.deploy.loading import load_policy
from algorithms.deploy.quantize import load_int8, quantize_int8, save_int8
from grpo_gym import hub
from grpo_gym.hub import MAX_CONFIG_BYTES, MAX_TOKENIZER_BYTES, RemoteCodeError, check_hf_source, check_model_config
from grpo_gym.rewards import RewardModelScorer
from grpo_gym.tokenizer import build_char_tokenizer, load_tokenizer
from grpo_gym.validation import ArgumentError
from tests.sizes import ENV_KWARGS, TINY, TINY_KWARGS

REPO = Path(__file__).resolve().parents[1]
EVIL_CODE = """from pathlib import Path
Path({marker!r}).write_text("the folder's code ran")
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
class EvilConfig(LlamaConfig):
    model_type = "evilmodel"
class EvilModel(LlamaForCausalLM):
    config_class = EvilConfig
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


def edit_json(path: Path, **fields: Any) -> None:
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


def add_remote_code(folder: Path, marker: Path, tokenizer_only: bool = False) -> Path:
    """Make ``folder`` (a save_pretrained folder) one whose loading would run ``evil.py``, which writes ``marker``:
    an "auto_map" in its configs and a model_type transformers has no class for (so, unset, it would ask)."""
    (folder / "evil.py").write_text(EVIL_CODE.format(marker=str(marker)))
    if not tokenizer_only:
        edit_json(
            folder / "config.json",
            model_type="evilmodel",
            auto_map={"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"},
        )
    edit_json(
        folder / "tokenizer_config.json",
        auto_map={"AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]},
        tokenizer_class="EvilTokenizer",  # a class transformers does not have: unset, it would ask
    )
    return folder


def save_tiny(folder: Path) -> Path:
    build_builtin_model("tiny", seed=0, **TINY_KWARGS).save_pretrained(folder)
    build_char_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every question put on the terminal, each answered "y" (the answer that would run the code)."""
    questions: list[str] = []

    def answer(prompt: str = "") -> str:
        questions.append(prompt)
        return "y"

    monkeypatch.setattr(builtins, "input", answer)
    return questions


@pytest.fixture
def evil(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "ran.txt"
    return add_remote_code(save_tiny(tmp_path / "evil"), marker), marker


LOADERS: dict[str, Callable[[Path], Any]] = {
    "load_tokenizer": lambda f: load_tokenizer(f),
    "env tokenizer=": lambda f: gym.make("R1Zero-v0", tokenizer=str(f)),
    "load_model": lambda f: load_model(f),
    "policy model (GRPO)": lambda f: GRPO(
        "TransformerPolicy", gym.make("R1Zero-v0", **ENV_KWARGS), policy_kwargs={"model": str(f)}
    ),
    "policy model (env id)": lambda f: GRPO("TransformerPolicy", "R1Zero-v0", policy_kwargs={"model": str(f)}),
    "RewardModelScorer": lambda f: RewardModelScorer(f),
    "env reward_model=": lambda f: gym.make("R1Zero-v0", reward_model=str(f)),
    "serve's loader (load_policy)": lambda f: load_policy(f),
    "tokenizer guard (model_tokenizer)": lambda f: model_tokenizer(f),
}


@pytest.mark.parametrize("loader", list(LOADERS))
def test_a_folder_with_auto_map_is_refused_and_its_code_never_runs(evil, asked, loader: str) -> None:
    folder, marker = evil
    with pytest.raises(RemoteCodeError, match=r"(?s)auto_map.*trust_remote_code=True") as error:
        LOADERS[loader](folder)
    assert str(folder) in str(error.value)
    assert not marker.exists() and asked == []


@pytest.mark.parametrize("loader", ["load_tokenizer", "env tokenizer=", "serve's loader (load_policy)"])
def test_a_tokenizer_config_alone_with_auto_map_is_refused(tmp_path: Path, asked, loader: str) -> None:
    marker = tmp_path / "ran.txt"
    folder = add_remote_code(save_tiny(tmp_path / "tok"), marker, tokenizer_only=True)
    with pytest.raises(RemoteCodeError, match=r"tokenizer_config\.json"):
        LOADERS[loader](folder)
    assert not marker.exists() and asked == []


@pytest.mark.parametrize("loader", [name for name in LOADERS if not name.startswith("env reward")])
def test_transformers_is_told_never_to_run_the_code_even_past_our_check(evil, asked, monkeypatch, loader: str):
    """Defence in depth: with the up-front refusal switched off, every call still passes trust_remote_code=False,
    so transformers refuses (or uses its own classes) without asking and without running the folder's code."""
    folder, marker = evil
    monkeypatch.setattr(hub, "refuse_remote_code", lambda *args, **kwargs: None)
    try:
        LOADERS[loader](folder)
    except ValueError as error:
        assert "auto_map" not in str(error)  # transformers' own refusal, not ours
    assert not marker.exists() and asked == []


def test_a_cached_hub_name_is_checked_like_a_folder(evil, asked, monkeypatch, tmp_path: Path) -> None:
    """A hub id whose files are in the local Hugging Face cache: the cached config is read and refused."""
    import huggingface_hub.constants

    folder, marker = evil
    cache = tmp_path / "hub"
    snapshot = cache / "models--someone--evil" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for file in folder.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    (cache / "models--someone--evil" / "refs").mkdir()
    (cache / "models--someone--evil" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for load in (load_tokenizer, load_model, RewardModelScorer):
        with pytest.raises(RemoteCodeError, match="'someone/evil'"):
            load("someone/evil")
    assert not marker.exists() and asked == []


def test_an_int8_export_with_auto_map_is_refused(tmp_path: Path, asked) -> None:
    marker = tmp_path / "ran.txt"
    folder = tmp_path / "int8"
    save_int8(quantize_int8(build_builtin_model("tiny", seed=0, **TINY_KWARGS)), folder, build_char_tokenizer())
    add_remote_code(folder, marker)
    for load in (load_int8, load_policy):
        with pytest.raises(RemoteCodeError, match="auto_map"):
            load(folder)
    assert not marker.exists() and asked == []


def test_the_opt_in_is_an_explicit_argument_and_really_runs_the_code(evil, asked) -> None:
    folder, marker = evil
    model = load_model(folder, trust_remote_code=True)
    assert type(model).__name__ == "EvilModel" and marker.exists() and asked == []
    with pytest.raises(ArgumentError, match="trust_remote_code"):
        load_tokenizer(folder, trust_remote_code="yes")


def test_a_saved_model_config_with_auto_map_or_huge_sizes_is_refused(asked) -> None:
    env = gym.make("R1Zero-v0", **ENV_KWARGS)
    spaces = (env.observation_space, gym.spaces.MultiDiscrete([359] * 4))
    config = build_builtin_model("tiny", seed=0, **TINY_KWARGS).config.to_dict()
    with pytest.raises(RemoteCodeError, match="saved model_config"):
        TransformerPolicy(*spaces, lambda _: 1e-3, model_config={**config, "auto_map": {"AutoModel": "x.Y"}})
    with pytest.raises(ValueError, match="num_hidden_layers = 100000"):
        TransformerPolicy(*spaces, lambda _: 1e-3, model_config={**config, "num_hidden_layers": 100000})
    with pytest.raises(ValueError, match="must be a dict"):
        TransformerPolicy(*spaces, lambda _: 1e-3, model_config=["llama"])


def test_a_zip_whose_env_record_names_a_code_folder_is_refused_by_grpo_gym_eval(tmp_path: Path, asked, capsys) -> None:
    tokenizer_folder = tmp_path / "tok"
    build_char_tokenizer().save_pretrained(tokenizer_folder)
    env = gym.make("R1Zero-v0", tokenizer=str(tokenizer_folder), **ENV_KWARGS)
    GRPO("TransformerPolicy", env, policy_kwargs=TINY, seed=0).save(tmp_path / "run.zip")
    marker = tmp_path / "ran.txt"
    add_remote_code(tokenizer_folder, marker, tokenizer_only=True)  # after the run was saved
    with pytest.raises(SystemExit) as exited:
        cli_main(["eval", str(tmp_path / "run.zip"), "--n", "1"])
    assert exited.value.code == 2
    assert "auto_map" in capsys.readouterr().err
    assert not marker.exists() and asked == []


def test_grpo_gym_serve_of_a_code_folder_exits_with_the_error_even_when_stdin_says_yes(evil) -> None:
    folder, marker = evil
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "algorithms.cli", "serve", str(folder), "--port", "0"],
        input="y\ny\ny\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "auto_map" in done.stderr and "[y/N]" not in done.stdout + done.stderr
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------- sizes
@pytest.mark.parametrize(("name", "size"), [("config.json", 3 * 2**30), ("tokenizer.json", 2**30)])
def test_an_oversized_file_is_refused_before_it_is_read(tmp_path: Path, name: str, size: int) -> None:
    folder = save_tiny(tmp_path / "big")
    os.truncate(folder / name, size)  # sparse: no disk used; reading it would take GiBs of memory
    for load in (load_tokenizer, load_model, RewardModelScorer):
        with pytest.raises(ValueError, match=rf"{name} is {size} bytes, more than the"):
            load(folder)
    assert size > max(MAX_CONFIG_BYTES, MAX_TOKENIZER_BYTES)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_hidden_layers": 100000}, "num_hidden_layers = 100000"),
        ({"vocab_size": 10**9}, "vocab_size"),
        ({"hidden_size": -5}, "hidden_size = -5"),
        ({"text_config": {"num_hidden_layers": 10**6}}, "text_config.num_hidden_layers"),
        ({"hidden_size": 65536, "num_hidden_layers": 1024, "intermediate_size": 262144}, "more than this machine"),
    ],
)
def test_an_implausible_model_config_is_refused_before_allocating(tmp_path: Path, fields: dict, message: str) -> None:
    folder = save_tiny(tmp_path / "huge")
    edit_json(folder / "config.json", **fields)
    for load in (load_model, RewardModelScorer, load_policy):
        with pytest.raises(ValueError, match=message):
            load(folder)


@pytest.mark.parametrize("content", [b"\xff\xfe not utf-8", b'{"model_type": "llama",', b"[" * 100000, b"[1, 2]"])
def test_a_broken_config_file_is_an_error_naming_it(tmp_path: Path, content: bytes) -> None:
    folder = save_tiny(tmp_path / "broken")
    (folder / "config.json").write_bytes(content)
    with pytest.raises(ValueError, match=r"config\.json"):
        load_model(folder)


def test_a_record_never_opts_in(evil) -> None:
    folder, marker = evil
    scorer = RewardModelScorer(folder, trust_remote_code=True)  # the user's own opt-in, in Python
    env = gym.make("R1Zero-v0", reward_model=scorer).unwrapped
    record = env.describe()
    assert "reward_model" in record["needs"]  # rebuilding asks for the object; the path alone would be refused
    with pytest.raises(ValueError, match="reward_model="):
        type(env).from_description(record)
    assert not marker.exists()  # nothing loaded yet: the scorer loads its model on first use


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    auto_map=st.one_of(
        st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=30), min_size=1, max_size=3),
        st.lists(st.text(max_size=10), min_size=1, max_size=3),
        st.text(min_size=1, max_size=40),
    ),
    file=st.sampled_from(["config.json", "tokenizer_config.json", "generation_config.json"]),
)
def test_any_auto_map_in_any_config_file_is_refused(tmp_path: Path, auto_map: Any, file: str) -> None:
    folder = tmp_path / "f"
    folder.mkdir(exist_ok=True)
    for name in ("config.json", "tokenizer_config.json", "generation_config.json"):
        (folder / name).write_text(json.dumps({"model_type": "llama"}))
    (folder / file).write_text(json.dumps({"model_type": "llama", "auto_map": auto_map}))
    with pytest.raises(RemoteCodeError, match=file):
        check_hf_source(folder)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["num_hidden_layers", "hidden_size", "vocab_size", "intermediate_size", "other"]),
        st.one_of(st.integers(-(10**12), 10**12), st.floats(allow_nan=False), st.text(max_size=5), st.none()),
        max_size=5,
    )
)
def test_model_config_checks_never_crash(fields: dict) -> None:
    try:
        check_model_config(fields, "test config")
    except ValueError as error:
        assert "test config" in str(error)


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("policy_kwargs", "dict(model='tiny')", "is not a Python dict literal"),
        ("policy_kwargs", "__import__('pathlib').Path('{marker}').touch()", "is not a Python dict literal"),
        ("policy_kwargs", "{'model': 'tiny'", "is not a Python dict literal"),
        ("policy_kwargs", "[1, 2]", "must be a mapping"),
        ("env_kwargs", "dict(task='countdown')", "is not a Python dict literal"),
        ("env_kwargs", "5", "must be a mapping"),
    ],
)
def test_a_config_mapping_written_as_code_is_refused_naming_the_key(
    tmp_path: Path, capsys, key: str, value: str, words: str
) -> None:
    """rl-zoo3 writes ``policy_kwargs: "dict(...)"`` and evaluates it; here it is never evaluated, and the error
    names the key and the literal to write (it was ``malformed node or string``, a TypeError or a SyntaxError)."""
    import yaml

    from algorithms.common.hyperparams import load_hyperparams
    from tests.test_cli import write_config

    marker = tmp_path / "ran.txt"
    value = value.replace("{marker}", str(marker))
    config = write_config(tmp_path)
    with pytest.raises(SystemExit) as exited:
        cli_main(["train", "--config", str(config), "-params", f"{key}:{value}"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert f"grpo-gym train: error: {key}" in error and words in error and "Traceback" not in error
    document = yaml.safe_load(config.read_text())
    document["R1Zero-v0"][key] = value
    config.write_text(yaml.safe_dump(document))
    with pytest.raises(ValueError, match=rf"^{key}.*{words}"):
        load_hyperparams(config, "R1Zero-v0")
    assert not marker.exists()


@pytest.mark.parametrize("recorded", [["evil_rewards:accuracy"], {"acc": "evil_rewards:accuracy"}, "evil_rewards:acc"])
def test_a_record_naming_a_reward_function_module_never_imports_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, recorded: Any
) -> None:
    """A zip's env record with ``reward_funcs: ["module:function"]`` made ``grpo-gym eval`` and ``GRPO.load`` import
    that module (from the current folder, beside the zip): records name reward functions, never code."""
    import zipfile

    marker = tmp_path / "ran.txt"
    (tmp_path / "evil_rewards.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\n"
        "def accuracy(prompts, completions, **kwargs):\n    return [1.0] * len(completions)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    GRPO("TransformerPolicy", gym.make("R1Zero-v0", **ENV_KWARGS), policy_kwargs=TINY, seed=0).save(tmp_path / "a.zip")
    with zipfile.ZipFile(tmp_path / "a.zip") as source, zipfile.ZipFile(tmp_path / "crafted.zip", "w") as target:
        for name in source.namelist():
            content = source.read(name)
            if name == "data":
                data = json.loads(content)
                data["env"]["record"]["kwargs"]["reward_funcs"] = recorded
                content = json.dumps(data).encode()
            target.writestr(name, content)
    with pytest.raises(SystemExit) as exited:
        cli_main(["eval", str(tmp_path / "crafted.zip"), "--n", "1"])
    assert exited.value.code == 2 and "never names code to import" in capsys.readouterr().err
    with pytest.warns(UserWarning, match="never names code to import"):
        assert not GRPO.load(tmp_path / "crafted.zip").get_env()  # the model loads; no env is rebuilt
    assert not marker.exists() and "evil_rewards" not in sys.modules
