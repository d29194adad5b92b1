"""What ``grpo-gym train`` and ``eval`` say and take beyond their flags: where a run's files go, a pasteable resume
command, progress wherever the output goes, reward functions named on the command line."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any


def resume_hint(argv: list[str]) -> str:
    """The command that resumes this run, pasteable into a shell (every value quoted as it needs)."""
    return f"resume with: {shlex.join(['grpo-gym', *(arg for arg in argv if arg != '--resume'), '--resume'])}"


def where_it_goes(save_path: Path | None, directory: Path, every: int) -> str:
    """Where the run's model and checkpoints go, said before it starts."""
    model = f"the model goes to {save_path}" if save_path is not None else "the model is not saved (no --save-path)"
    checkpoints = f"every {every} iterations" if every else "on Ctrl-C / SIGTERM only"
    return f"{model}; checkpoints ({checkpoints}, the newest 2 kept) go to {directory}{os.sep}"


def progress_callbacks(checkpoint: Any, wanted: bool, label: str) -> tuple[Any, bool]:
    """``learn``'s callbacks and ``progress_bar``: SB3's bar on a terminal; lines per tenth when output goes to a
    file or a pipe (where a redrawn bar shows nothing until the end)."""
    from algorithms.common.progress import ProgressCallback

    if not wanted or sys.stdout.isatty():
        return checkpoint, wanted
    return [checkpoint, ProgressCallback(label)], False


def reward_funcs_argument(specs: list[str]) -> list[str] | dict[str, str]:
    """``--reward-funcs``: ``module:function`` paths (named after the functions, as a list is) or
    ``name=module:function`` (named as recorded); the env imports them, since you named them here."""
    named = [spec.partition("=") for spec in specs]
    if all(sep for _, sep, _ in named):
        return {name: path for name, _, path in named}
    if any(sep for _, sep, _ in named):
        raise ValueError("--reward-funcs: give every function as name=module:function, or none of them")
    return list(specs)
