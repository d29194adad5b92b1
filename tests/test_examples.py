"""Every script of examples/ runs, end to end, at a tiny size (its own flags cut the steps and iterations), in a
fresh folder, as a user runs it: ``python examples/<name>.py ...``. What each prints is checked, and each is shown
on the Examples page of the docs with its output (``docs/examples.md``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_blocks import ROOT

EXAMPLES = ROOT / "examples"
TINY = ["--cold-start-steps", "2"]


def run(script: str, *arguments: str, cwd: Path, timeout: float = 300) -> str:
    """``python examples/<script> <arguments>`` in ``cwd``; its standard output (the test fails with both streams
    when it exits non-zero)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *arguments], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_every_example_is_tested_and_shown() -> None:
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    page = (ROOT / "docs" / "examples.md").read_text(encoding="utf-8")
    for script in scripts:
        assert script.removesuffix(".py") in tested, f"examples/{script} has no test here"
        assert f"examples/{script}" in page, f"docs/examples.md does not show examples/{script}"
        assert (EXAMPLES / "output" / script.replace(".py", ".txt")).is_file(), f"no recorded output of {script}"


@pytest.mark.parametrize("source", ["folder", "gguf"])
def test_train_your_model(source: str, tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    from tests.gguf_files import byte_level_tokenizer, tiny_llama, write_gguf

    tokenizer = byte_level_tokenizer()
    llama = tiny_llama(len(tokenizer))
    if source == "folder":
        model = tmp_path / "model"
        llama.save_pretrained(model)
        tokenizer.save_pretrained(model)
    else:
        model = Path(write_gguf(llama, tokenizer, tmp_path / "tiny.gguf"))
    out = run("train_your_model.py", "--model", str(model), *TINY, "--iterations", "1", "--problems", "4",
              cwd=tmp_path)  # fmt: skip
    for row in ("before training", "after cold start", "after GRPO"):
        assert row in out
    assert (tmp_path / "your-model-grpo" / "config.json").is_file()


def test_your_data_and_rewards(tmp_path: Path) -> None:
    out = run("your_data_and_rewards.py", *TINY, "--iterations", "1", cwd=tmp_path)
    assert "'answer_tags': 1.0" in out and "'exact': 1.0" in out and "'task': 1.0" in out  # a right completion
    assert "mean reward of the last rollouts" in out
    assert (tmp_path / "rows.jsonl").is_file() and (tmp_path / "your_data.zip").is_file()


def test_tools(tmp_path: Path) -> None:
    out = run("tools.py", *TINY, "--iterations", "1", "--problems", "4", cwd=tmp_path)
    assert "the tool's result: 520000 | episode over: False" in out
    assert "answer turn: episode over: True | solved: True" in out  # the problem's own answer, after a tool turn
    assert "after training" in out


def test_port_trl_script(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    out = run("port_trl_script.py", *TINY, "--iterations", "1", cwd=tmp_path)
    assert "saved to from_trl.zip" in out and (tmp_path / "from_trl.zip").is_file()


def test_sb3_callbacks(tmp_path: Path) -> None:
    out = run("sb3_callbacks.py", *TINY, "--iterations", "10", cwd=tmp_path)
    assert "evaluate_policy: mean reward" in out and "greedy completion:" in out
    assert (tmp_path / "best" / "best_model.zip").is_file()  # EvalCallback ran (every 5 iterations)
    assert list((tmp_path / "checkpoints").glob("*.zip"))  # CheckpointCallback too
    assert list((tmp_path / "runs").rglob("events.out.tfevents.*"))


def test_resume_after_crash(tmp_path: Path) -> None:
    out = run("resume_after_crash.py", *TINY, "--iterations", "4", cwd=tmp_path)
    assert "newest checkpoint: iteration_" in out
    assert "same weights as the uninterrupted run: True" in out


def test_serve(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    with socket.socket() as probe:  # a free loopback port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = run("serve.py", *TINY, "--port", str(port), cwd=tmp_path)
    assert "answer: '" in out and "server stopped (exit" in out
