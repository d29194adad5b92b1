"""Every number the ``grpo-gym`` command line takes is checked as it is read (algorithms/cli_types.py).

The cases are generated from the parser itself: every option of every sub-command is visited, an option whose value
is a number must carry a converter with a range, and each is fed a value outside it, which argparse must refuse
(exit code 2, the option and the range named) before any command runs. A new numeric option with ``type=int``, or
with a numeric default and no type at all, fails :func:`test_no_numeric_option_is_unchecked`.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys

import pytest

from algorithms.cli import build_parser
from algorithms.cli_types import Integer, Number

CONVERTERS = (Integer, Number)


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """``{name: parser}`` of every ``grpo-gym`` sub-command."""
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def required_argv(parser: argparse.ArgumentParser) -> list[str]:
    """Placeholder values for a sub-command's positionals and required options (never used: parsing stops first)."""
    argv: list[str] = []
    for action in parser._actions:
        if not action.option_strings and action.nargs not in (argparse.REMAINDER, "*", "?"):
            argv.append("placeholder")
        elif action.option_strings and action.required:
            argv += [action.option_strings[0], "placeholder"]
    return argv


def options() -> list[tuple[str, argparse.Action]]:
    """``(command, action)`` for every option of every sub-command but ``--help``."""
    return [
        (name, action)
        for name, parser in subcommands().items()
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
    ]


def numeric_options() -> list[tuple[str, argparse.Action]]:
    return [(name, action) for name, action in options() if isinstance(action.type, CONVERTERS)]


def out_of_range(converter: Integer | Number) -> str:
    """A value just outside the converter's range (below its low bound, else above its high one)."""
    step = 1 if isinstance(converter, Integer) else 0.5
    if converter.low is not None:
        return str(converter.low if getattr(converter, "low_open", False) else converter.low - step)
    assert converter.high is not None, f"{converter!r} has no range"
    return str(converter.high if converter.high_open else converter.high + step)


def test_no_numeric_option_is_unchecked() -> None:
    raw = [f"{name} {'/'.join(a.option_strings)}" for name, a in options() if a.type in (int, float)]
    assert not raw, f"options read with a bare int/float (use algorithms/cli_types.py): {raw}"
    untyped = [
        f"{name} {'/'.join(a.option_strings)}"
        for name, a in options()
        if a.type is None and type(a.default) in (int, float) and a.nargs != 0 and not isinstance(a.default, bool)
    ]
    assert not untyped, f"options with a numeric default read as text: {untyped}"
    unbounded = [f"{n} {a.option_strings}" for n, a in numeric_options() if a.type.low is None and a.type.high is None]
    assert not unbounded, f"numeric options without a range: {unbounded}"
    assert len(numeric_options()) >= 35  # train, sft, eval, env-demo, distill, serve, openenv-serve


@pytest.mark.parametrize(
    ("command", "action"), numeric_options(), ids=[f"{n} {a.option_strings[-1]}" for n, a in numeric_options()]
)
def test_an_out_of_range_value_is_a_usage_error(command: str, action: argparse.Action, capsys) -> None:
    parser = build_parser()
    option = action.option_strings[0]
    bad = out_of_range(action.type)
    with pytest.raises(SystemExit) as exited:  # parse_args alone: nothing can run past a missed refusal
        parser.parse_args([command, *required_argv(subcommands()[command]), option, bad])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert f"argument {'/'.join(action.option_strings)}: must be " in error, error
    assert f"got {bad}" in error and action.type.wanted in error
    if isinstance(action.type, Number):
        with pytest.raises(SystemExit):
            parser.parse_args([command, *required_argv(subcommands()[command]), option, "nan"])


@pytest.mark.parametrize(
    ("command", "action"), numeric_options(), ids=[f"{n} {a.option_strings[-1]}" for n, a in numeric_options()]
)
def test_the_default_is_in_range(command: str, action: argparse.Action) -> None:
    defaults = action.default if isinstance(action.default, list) else [action.default]
    for value in defaults:
        assert value is None or action.type(str(value)) == value


def test_the_converters() -> None:
    count = Integer(low=1)
    assert count("1") == 1 and count(" 7 ") == 7 and count("1_000") == 1000
    for text, message in (("0", "got 0"), ("-100", "got -100"), ("2.5", "got '2.5'"), ("many", "got 'many'")):
        with pytest.raises(argparse.ArgumentTypeError, match=f"must be an integer >= 1, {message}"):
            count(text)
    share = Number(low=0.0, high=1.0, high_open=True)
    assert share("0") == 0.0 and share("0.999") == 0.999 and share("1e-3") == 1e-3
    for text in ("1", "-0.1", "nan", "inf", "-inf", "half"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"must be a finite number in \[0, 1\)"):
            share(text)
    assert math.isclose(Number(low=0.0, low_open=True)("1e-300"), 1e-300)


def test_a_model_source_that_names_nothing_loadable_is_a_usage_error(tmp_path) -> None:
    """Hostile round four: ``--model ''`` and ``--model notes.txt`` said "could not load a tokenizer from ...",
    blaming a tokenizer the user never named."""
    from algorithms.cli_types import SOURCE

    (tmp_path / "notes.txt").write_text("x")
    assert SOURCE("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert SOURCE(str(tmp_path)) == str(tmp_path)  # a folder
    with pytest.raises(argparse.ArgumentTypeError, match=r"must name a hub id, a Hugging Face folder .* got ''"):
        SOURCE("")
    with pytest.raises(argparse.ArgumentTypeError, match=r"is a file, but not a \.gguf file: pass a hub id"):
        SOURCE(str(tmp_path / "notes.txt"))


def test_train_refuses_a_negative_count_from_the_shell() -> None:
    """The two numbers users found taken silently: ``train -n -100`` started a run, ``--checkpoint-every -1`` ran."""
    for flags, message in (
        (["-n", "-100"], "argument -n/--n-timesteps: must be an integer >= 1, got -100"),
        (["--checkpoint-every", "-1"], "argument --checkpoint-every: must be an integer >= 0, got -1"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "algorithms.cli", "train", *flags], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert not done.stdout  # nothing said about where files go: no work started
