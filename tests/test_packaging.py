"""The wheel: built from the checkout, installed in a fresh virtualenv, it runs the main job from anywhere."""

from __future__ import annotations

import site
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_runs_the_demo_preset_from_a_fresh_virtualenv(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("grpo_gym-*.whl")
    fresh = tmp_path / "fresh"
    venv.create(fresh, with_pip=True)
    python = fresh / "bin" / "python"
    # the dependencies (torch, transformers, ...) come from this environment, the project only from the wheel:
    # a path line in a .pth file (this environment's own .pth files, the editable install's among them, are not read)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n", encoding="utf-8")
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import algorithms, algorithms.common.hyperparams as h; print(algorithms.__file__, h.DEFAULT_CONFIG)",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    ).stdout
    assert str(ROOT) not in where and "site-packages" in where, where  # the wheel's copy, not the checkout
    run = subprocess.run(
        [
            str(fresh / "bin" / "grpo-gym"),
            "train",
            "--preset",
            "demo",
            "-n",
            "256",
            "-params",
            "cold_start_kwargs:{'steps': 5}",
            "eval_problems:8",
            "--no-progress-bar",
            "--checkpoint-every",
            "0",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "GRPO: 256 completions" in run.stdout and "after GRPO" in run.stdout
