"""Every code block of the README and of the docs site runs (or says why it cannot), so the docs cannot drift.

The files: ``README.md`` and every ``docs/**/*.md`` (not ``docs/hooks/``, which is code). The blocks:

- **Python** (```` ```python ````): the blocks of one page run in order in one namespace, as a reader pastes them
  into one session, in a temporary working folder. While they run, the built-in model sizes (``"tiny"``,
  ``"small"``, ...) are the tests' 1-layer, 32-wide model (``tests/sizes.py``): the text runs as written, only the
  arithmetic is smaller. A block whose first line is ``# docs: not run here (<why>)`` is compiled, not run.
  A block listed in :data:`RUN_ELSEWHERE` is run by the named test, which checks more than that it runs.
- **Shell** (```` ```bash ````, ``sh``, ``shell``, ``console``): each command line (``\\`` joins lines, ``&&``
  splits commands, comments are dropped) is, by its program:

  - ``grpo-gym ...`` (also ``python -m algorithms.cli ...`` and ``torchrun ... -m algorithms.cli ...``): parsed by
    the real parser (the options exist, the numbers are in range) and its ``--preset`` loaded from its config with
    its ``-params`` (the keys exist); in an unmarked block then run, as a subprocess in the page's temporary
    folder (the built-in sizes shrunk there too, by a ``sitecustomize`` on its ``PYTHONPATH``), within
    :data:`TIME_LIMIT` seconds, exit code 0 expected. :data:`LONG_COMMANDS` are parsed and checked, not run (the
    Quickstart's demo: about 7 minutes). A line whose comment starts with ``argument `` must be refused by the
    parser (exit code 2) with exactly that message.
  - ``pip install ...``: never run; every extra it names must exist in ``pyproject.toml``.
  - ``pytest``: the suite itself, never run; the README's Quickstart line must be the one ``.ci/run`` runs.
  - anything else (``torchrun`` of another module, ``bash``, ``python3 -m venv``, ...): only in a marked block.

:func:`inventory` counts what is run, checked, marked and run elsewhere (``python -m tests.test_docs`` prints it).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from tests.docs_blocks import PYTHON, ROOT, SHELL, Block, blocks, pages, section
from tests.sizes import TINY_KWARGS

#: blocks another test runs, with more checks: (page, a text the block holds) -> "file::test"
RUN_ELSEWHERE = {
    ("docs/guides/from-trl.md", "GRPO.from_trl("): "tests/test_trl_port.py::test_the_porting_recipe_runs_as_written",
}
#: commands parsed and checked but never run here, with why
LONG_COMMANDS = {"grpo-gym train --preset demo": "the Quickstart's demo, about 7 minutes on 2 cores"}
TIME_LIMIT = 300
QUICKSTART = [
    "pip install torch==2.13.0 -e . && grpo-gym train --preset demo",
    'pip install torch==2.13.0 -e ".[dev]" && pytest',
]
SHRINK = f"""# tests/test_docs.py: the built-in model sizes shrunk to the tests' model in its subprocesses
import algorithms.common.model.loading as _loading

for _name in list(_loading.BUILTIN_MODELS):
    _loading.BUILTIN_MODELS[_name] = {{**_loading.BUILTIN_MODELS[_name], **{TINY_KWARGS!r}}}
"""


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks(page)]


def elsewhere(block: Block) -> str | None:
    """The test that runs ``block``, when it is one of :data:`RUN_ELSEWHERE`."""
    tests = [test for (page, text), test in RUN_ELSEWHERE.items() if block.page == page and text in block.text]
    return tests[0] if tests else None


def page_ids(language: tuple[str, ...]) -> list[str]:
    return sorted({b.page for b in all_blocks() if b.language in language})


# ---------------------------------------------------------------------------------------------- shell lines
def command_lines(text: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, blank and comment-only lines dropped."""
    lines = textwrap.dedent(text).replace("\\\n", " ").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def split_commands(line: str) -> tuple[list[list[str]], str | None]:
    """``(commands, expected refusal)``: the line's ``&&``-separated commands as argv lists, and the argparse
    message its comment shows (``# argument -n/--n-timesteps: must be ...``), if any."""
    expected = re.search(r"\s#\s*(argument .+)$", line)
    tokens = shlex.split(line, comments=True)
    commands, current = [], []
    for token in tokens:
        if token == "&&":
            commands.append(current)
            current = []
        else:
            current.append(token)
    return [*commands, current], expected[1].strip() if expected else None


def cli_argv(argv: list[str]) -> list[str] | None:
    """The ``grpo-gym`` arguments of a command, or None when it is not one."""
    if argv[:1] == ["grpo-gym"]:
        return argv[1:]
    for i in range(len(argv) - 1):
        if argv[i] == "-m" and argv[i + 1] == "algorithms.cli" and argv[0] in ("python", "python3", "torchrun"):
            return argv[i + 2 :]
    return None


def parse(argv: list[str]) -> argparse.Namespace:
    """``grpo-gym argv`` as the command line reads it, its preset and overrides checked like ``train``'s."""
    from algorithms import cli
    from algorithms.cli_arguments import algorithm_of, config_of
    from algorithms.common.hyperparams import check_keys, default_config, load_hyperparams, parse_overrides

    if "--help" in argv or "-h" in argv:  # argparse prints the help and exits 0: the run checks it
        with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as exited:
            cli.build_parser().parse_args(argv)
        assert exited.value.code == 0
        return argparse.Namespace()
    args = cli.build_parser().parse_args(argv)
    overrides = parse_overrides(getattr(args, "hyperparams", None) or [])
    if getattr(args, "preset", None) or overrides:
        path = config_of(args) if hasattr(args, "algo") else (args.config or default_config())
        config = load_hyperparams(path, getattr(args, "env", "R1Zero-v0"), args.preset, overrides)
        if hasattr(args, "hyperparams"):  # train and sft: the keys a model takes
            check_keys(config, cli._grpo_keys(algorithm_of(args)), f"the preset {args.preset!r} with -params")
    return args


def refusal(argv: list[str]) -> str:
    """What the parser says when it refuses ``argv`` (an AssertionError when it takes it)."""
    from algorithms import cli

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(argv)
    assert exited.value.code == 2, f"grpo-gym {shlex.join(argv)} was accepted"
    return stderr.getvalue()


def check_pip(argv: list[str]) -> None:
    import tomllib  # Python >= 3.11, as the CI's

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = {extra for token in argv for group in re.findall(r"\[([\w,-]+)\]", token) for extra in group.split(",")}
    assert named <= extras, f"pip install names extras pyproject.toml does not have: {sorted(named - extras)}"


def run_cli(argv: list[str], folder: Path, shim: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "algorithms.cli", *argv], cwd=folder, env=env, capture_output=True, text=True,
        timeout=TIME_LIMIT,
    )  # fmt: skip
    assert done.returncode == 0, f"grpo-gym {shlex.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}"


def shell_plan(block: Block) -> list[tuple[str, list[str], str | None]]:
    """``(kind, argv, expected)`` for each command of a shell block; kind: run, check, refused, pip, pytest."""
    plan = []
    for line in command_lines(block.text):
        commands, expected = split_commands(line)
        for argv in commands:
            arguments = cli_argv(argv)
            if argv[:2] == ["pip", "install"]:
                plan.append(("pip", argv, None))
            elif argv == ["pytest"]:
                plan.append(("pytest", argv, line))
            elif arguments is not None and expected:
                plan.append(("refused", arguments, expected))
            elif arguments is not None:
                long = block.marked or shlex.join(argv) in LONG_COMMANDS or argv[0] != "grpo-gym"
                plan.append(("check" if long else "run", arguments, None))
            else:
                assert block.marked, f"{block.where}: {shlex.join(argv)!r} cannot run here: mark the block"
                plan.append(("marked", argv, None))
    return plan


@pytest.mark.parametrize("page", page_ids(SHELL))
def test_the_shell_blocks(page: str, tmp_path: Path) -> None:
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHRINK, encoding="utf-8")
    folder = tmp_path / "work"
    folder.mkdir()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for block in (b for b in blocks(ROOT / page) if b.language in SHELL):
        for kind, argv, expected in shell_plan(block):
            where = f"{block.where}: {shlex.join(argv)}"
            if kind == "pip":
                check_pip(argv)
            elif kind == "pytest":
                assert expected in ci, f"{where}: .ci/run does not run {expected!r}"
            elif kind == "refused":
                assert expected in refusal(argv), f"{where}: not refused with {expected!r}"
            elif kind in ("check", "run"):
                parse(argv)
                if kind == "run":
                    run_cli(argv, folder, shim)


# ---------------------------------------------------------------------------------------------- python blocks
@pytest.fixture
def small_builtins(monkeypatch: pytest.MonkeyPatch) -> None:
    from algorithms.common.model import loading

    for name, config in loading.BUILTIN_MODELS.items():
        monkeypatch.setitem(loading.BUILTIN_MODELS, name, {**config, **TINY_KWARGS})


@pytest.mark.parametrize("page", page_ids(PYTHON))
def test_the_python_blocks(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_builtins: None) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for block in (b for b in blocks(ROOT / page) if b.language in PYTHON):
        code = compile(block.text, block.where, "exec")
        if block.marked or elsewhere(block):
            continue
        exec(code, namespace)


def test_the_blocks_run_elsewhere_exist() -> None:
    for (page, text), test in RUN_ELSEWHERE.items():
        found = [b for b in blocks(ROOT / page) if text in b.text]
        assert len(found) == 1, f"{page}: {len(found)} blocks hold {text!r}"
        file, name = test.split("::")
        names = {n.name for n in ast.walk(ast.parse((ROOT / file).read_text())) if isinstance(n, ast.FunctionDef)}
        assert name in names, f"{test} does not exist"


def test_the_long_commands_are_in_the_docs() -> None:
    lines = {line for b in all_blocks() if b.language in SHELL for line in command_lines(b.text)}
    commands = {part.strip() for line in lines for part in line.split("&&")}
    assert set(LONG_COMMANDS) <= commands


def test_every_marked_block_says_why_and_every_block_is_closed() -> None:
    for page in pages():
        fences = [line for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("```")]
        assert len(fences) % 2 == 0 and all(f == "```" for f in fences[1::2]), f"{page}: an unclosed block"
    for block in all_blocks():
        if "docs: not run" in block.text.split("\n", 1)[0]:
            assert block.marked, f"{block.where}: write the marker as '# docs: not run here (<why>)'"


def test_the_quickstart_is_the_two_commands() -> None:
    (block,) = [b for b in blocks(ROOT / "README.md") if b.text in section(ROOT / "README.md", "## Quickstart")]
    assert command_lines(block.text) == QUICKSTART
    assert QUICKSTART[1] in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()


def test_the_demo_preset_exists_and_parses() -> None:
    args = parse(["train", "--preset", "demo"])
    assert args.preset == "demo"


def inventory() -> Counter:
    """What the docs' blocks amount to: python blocks run / marked / run elsewhere, shell commands by kind."""
    counts: Counter = Counter()
    for block in all_blocks():
        if block.language in PYTHON:
            counts["python " + ("marked" if block.marked else "run elsewhere" if elsewhere(block) else "run")] += 1
        elif block.language in SHELL:
            counts["shell blocks" + (" marked" if block.marked else "")] += 1
            for kind, _, _ in shell_plan(block):
                counts[f"shell commands: {kind}"] += 1
        else:
            counts[f"other ({block.language or 'plain'}), not code"] += 1
    return counts


def test_the_inventory_adds_up() -> None:
    counts = inventory()
    python = [b for b in all_blocks() if b.language in PYTHON]
    assert counts["python run"] + counts["python marked"] + counts["python run elsewhere"] == len(python)
    assert counts["python run"] > 2 * counts["python marked"], counts  # most examples run as written


if __name__ == "__main__":
    for key, value in sorted(inventory().items()):
        print(f"{value:4d}  {key}")
