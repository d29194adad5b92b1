"""Messages written for Python that reached the command line, examples at their edges, and a hub lookup with no
network (issue 60, benchmarks/hostile_round5.md): each now names the option, file or field, what was found and the
fix, on one line, before anything runs."""

from __future__ import annotations

import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from algorithms import GRPO
from algorithms.cli import build_parser, main
from algorithms.cli_arguments import pretrained_defaults
from algorithms.common.hyperparams import DEFAULT_CONFIG, load_hyperparams, parse_overrides
from tests.test_hostile_files import TINY, make_env, rewrite, saved, with_data  # noqa: F401  (saved: the fixture)

ROOT = Path(__file__).resolve().parents[1]


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def test_every_setting_train_help_lists_is_accepted_in_the_form_it_is_listed() -> None:
    """``-params cold_start_kwargs.steps:2`` (the dotted form ``train --help`` prints) was refused as an unknown key;
    a dotted key now sets one key of the settings dict and keeps the preset's others, env_kwargs included."""
    listed = dict(item.split(": ", 1) for item in pretrained_defaults().split(", ") if ": " in item)
    assert "cold_start_kwargs.steps" in listed and "env_kwargs.difficulty" in listed
    for key, value in listed.items():
        if key.startswith(("cold_start_kwargs.", "env_kwargs.")) and "{" not in value:
            config = load_hyperparams(DEFAULT_CONFIG, "R1Zero-v0", "pretrained", parse_overrides([f"{key}:{value}"]))
            name, field = key.split(".")
            assert str(config[name][field]) == value
    dotted = parse_overrides(["cold_start_kwargs.steps:2", "env_kwargs.difficulty:0.5"])
    config = load_hyperparams(DEFAULT_CONFIG, "R1Zero-v0", "pretrained", dotted)
    preset = load_hyperparams(DEFAULT_CONFIG, "R1Zero-v0", "pretrained")
    assert config["cold_start_kwargs"] == {**preset["cold_start_kwargs"], "steps": 2}
    assert config["env_kwargs"] == {**preset["env_kwargs"], "difficulty": 0.5}
    assert type(config["env_kwargs"]) is dict  # a plain dict for the constructor and the saved record


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ("cold_start_kwargs.a.b:1", "a dotted key names one setting of a settings dict"),
        (".steps:1", "a dotted key names one setting"),
        ("learning_rate.x:1", "learning_rate is not a settings dict"),
        ("nosuch_kwargs.x:1", "unknown key 'nosuch_kwargs'"),
    ],
)
def test_a_dotted_key_that_names_no_setting_says_so(item: str, words: str, capsys: pytest.CaptureFixture) -> None:
    assert words in _usage_error(["train", "-params", item, "-n", "8"], capsys)


@pytest.mark.parametrize(
    "argv", [["serve", "m.zip"], ["openenv-serve"], ["vllm-serve", "tiny"]], ids=lambda argv: argv[0]
)
def test_a_host_that_is_no_address_is_argparses_error_naming_the_option(
    argv: list[str], capsys: pytest.CaptureFixture
) -> None:
    """``openenv-serve --host 999.1.1.1`` started the server, which logged "Name or service not known"."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*argv, "--host", "999.1.1.1"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "argument --host: '999.1.1.1' is not an address to listen on" in err and "0.0.0.0" in err
    assert build_parser().parse_args([*argv, "--host", "0.0.0.0"]).host == "0.0.0.0"


def test_a_damaged_data_entry_is_named_as_damage_not_blamed_on_the_version(
    saved: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    """A ``data`` entry holding a list, or an object without ``format``, was "not written by this version of grpo-gym
    ... models saved by Stable-Baselines3's own save() are not read", and eval added "(or give --config)"."""
    as_list = rewrite(saved, tmp_path / "list.zip", lambda name, content: b"[1, 2]" if name == "data" else content)
    no_format = with_data(saved, tmp_path / "nofmt.zip", lambda data: data.pop("format"))
    sb3 = with_data(
        saved, tmp_path / "sb3.zip", lambda d: (d.pop("format"), d.update(policy_class={":serialized:": ""}))
    )
    for path, words in ((as_list, "holds a JSON list"), (no_format, "has no 'format' field")):
        with pytest.raises(ValueError, match=words) as refusal:
            GRPO.load(path, env=make_env())
        assert "damaged" in str(refusal.value) and "Stable-Baselines3" not in str(refusal.value)
        line = _usage_error(["eval", str(path)], capsys)
        assert words in line and "--config" not in line
    with pytest.raises(ValueError, match="Stable-Baselines3's own save"):  # an SB3 file is still told apart
        GRPO.load(sb3, env=make_env())
    assert "--config" not in _usage_error(["eval", str(tmp_path / "absent.zip")], capsys)


def test_eval_of_a_file_whose_env_record_cannot_be_built_names_the_file(
    saved: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    """A NaN difficulty in the file's env record was reported as if typed on the command line."""
    nan = with_data(
        saved, tmp_path / "nan.zip", lambda data: data["env"]["record"]["kwargs"].update(difficulty=float("nan"))
    )
    line = _usage_error(["eval", str(nan)], capsys)
    assert f"the env {nan} records could not be built" in line and "difficulty" in line and "nan" in line
    assert "the file's env record is damaged" in line and "--config" in line


def test_a_presets_settings_of_a_part_turned_off_are_not_blamed_on_the_user() -> None:
    """``--preset demo -params cold_start:False`` warned "leave cold_start_kwargs['learning_rate'] out" about a value
    the preset set; the preset's settings of the part go with it. Settings the user gives still warn."""
    config = load_hyperparams(DEFAULT_CONFIG, "R1Zero-v0", "demo", parse_overrides(["cold_start:False"]))
    assert "cold_start_kwargs" not in config and config["cold_start"] is False
    given = load_hyperparams(
        DEFAULT_CONFIG, "R1Zero-v0", "demo", parse_overrides(["cold_start:False", "cold_start_kwargs.steps:3"])
    )
    assert given["cold_start_kwargs"]["steps"] == 3
    with pytest.warns(UserWarning, match=r"cold_start_kwargs\['steps'\]=3 has no effect with cold_start=False"):
        GRPO("TransformerPolicy", make_env(), policy_kwargs=TINY, cold_start=False, cold_start_kwargs={"steps": 3})


@pytest.mark.parametrize(
    ("script", "argv", "words"),
    [
        ("your_data_and_rewards.py", ["--iterations", "0"], "argument --iterations: must be an integer >= 1, got 0"),
        ("resume_after_crash.py", ["--iterations", "0"], "argument --iterations: must be an integer >= 3, got 0"),
        ("train_your_model.py", ["--model", "m", "--difficulty", "7"], "argument --difficulty"),
        ("serve.py", ["--cold-start-steps", "-1"], "argument --cold-start-steps: must be an integer >= 0"),
    ],
)
def test_an_examples_number_out_of_range_is_its_usage_error(
    script: str, argv: list[str], words: str, tmp_path: Path
) -> None:
    """``your_data_and_rewards.py --iterations 0`` died with ZeroDivisionError; ``resume_after_crash.py`` printed a
    usage error, then a traceback."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_hub_name_fails_at_once_when_the_hub_cannot_be_reached(monkeypatch: pytest.MonkeyPatch) -> None:
    """``policy_kwargs={"model": "nonexistent-org/xyz-model"}`` retried the hub for 80 s with no network before its
    error; with the hub's host unresolvable, or ``HF_HUB_OFFLINE``, it now fails before any request."""
    from huggingface_hub import constants

    from algorithms.common.model.loading import load_model
    from grpo_gym import load_tokenizer

    def no_network(host: str, *args: object, **kwargs: object) -> list:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing was tried: no retry warnings
        with pytest.raises(ValueError, match=r"'nonexistent-org/xyz-model' is not a folder here .* cannot be reached"):
            load_model("nonexistent-org/xyz-model")
        with pytest.raises(ValueError, match="huggingface-cli download"):
            load_tokenizer("nonexistent-org/xyz-model")
    monkeypatch.undo()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE is set"):
        load_model("nonexistent-org/xyz-model")


def test_eval_reads_the_class_a_zip_records_whatever_algo_says(
    saved: Path,  # noqa: F811
    capsys: pytest.CaptureFixture,
) -> None:
    """``grpo-gym eval grpo.zip --algo ppo`` said "load it with GRPO.load" (the reverse of an LMPPO zip without
    ``--algo``, tests/test_cli.py): the class the zip records is loaded."""
    assert main(["eval", str(saved), "--algo", "ppo", "--difficulty", "0.1", "--n", "2"]) == 0
    assert "good" in capsys.readouterr().out


def test_eval_of_a_good_file_with_a_bad_option_names_the_option_not_the_file(
    saved: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    """Found by the review: the error of an option given with the file (``--eval-data`` a task does not take) is not
    blamed on the file's env record."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1 + 1", "answer": "2"}\n', encoding="utf-8")
    line = _usage_error(["eval", str(saved), "--eval-data", str(rows)], capsys)
    assert "eval_data" in line and "damaged" not in line
