"""What ``grpo-gym train`` and ``eval`` say and take beyond their flags: where a run's files go, stopping on a signal
and a pasteable resume command, what ``-params`` may change on ``--resume``, progress wherever the output goes,
reward functions named on the command line, ``--nproc`` (the same command under torchrun)."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from algorithms.common.hyperparams import merged_over, parse_overrides


def checkpoint_dir(args: argparse.Namespace) -> Path:
    """``--checkpoint-dir``, or beside ``--save-path`` (``demo.zip`` -> ``demo_checkpoints/``), or ``./checkpoints``."""
    if args.checkpoint_dir:
        return Path(args.checkpoint_dir)
    if args.save_path:
        path = Path(args.save_path)
        return path.with_name(f"{path.name.removesuffix('.zip')}_checkpoints")
    return Path("checkpoints")


def main_says(model: Any, say: Any) -> Any:
    """``say`` on rank 0, nothing on the other ranks (several processes: only rank 0 prints)."""
    return say if model.distributed.is_main else lambda *_, **__: None


def torchrun(nproc: int, argv: Sequence[str]) -> int:
    """``grpo-gym train --nproc N ...``: the same command under ``torchrun --standalone --nproc_per_node N``."""
    rest, skip = [], False
    for arg in argv:  # drop --nproc and its value
        if skip or arg == "--nproc":
            skip = not skip
            continue
        if not arg.startswith("--nproc="):
            rest.append(arg)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return subprocess.call([*command, "-m", "algorithms.cli", *rest])


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


@contextlib.contextmanager
def stop_on_signals(checkpoint: Any, argv: list[str]) -> Iterator[dict[str, int]]:
    """SIGINT / SIGTERM: before training starts (setup, cold start, the first evaluation: nothing to checkpoint
    yet), stop at once, as Python's KeyboardInterrupt; once ``stops["learning"]`` is set, ask ``checkpoint`` to save
    and stop at the next step, and a second signal exits at once. Yields ``{"code": exit code (130 / 143, 0 when no
    signal came), "learning": 0 or 1}``."""
    stops = {"code": 0, "learning": 0}

    def handler(number: int, _frame: Any) -> None:
        code = 128 + number
        if not stops["learning"]:
            stops["code"] = code
            raise KeyboardInterrupt
        if stops["code"]:
            print(f"\nstopped without a new checkpoint. {next_step(checkpoint.directory, argv)}", file=sys.stderr)
            sys.stderr.flush()
            os._exit(code)
        stops["code"] = code
        checkpoint.request_stop()
        print("\nstopping: writing a checkpoint at the next iteration boundary (again to quit now)", file=sys.stderr)

    previous = {number: signal.signal(number, handler) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stops
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


def next_step(directory: Path, argv: list[str]) -> str:
    """What to run after a stop: resume from the newest checkpoint of ``directory``, or, with none yet, the same
    command without ``--resume`` (the run starts over)."""
    from algorithms.common.saving.checkpoints import latest_checkpoint

    if latest_checkpoint(directory) is not None:
        return resume_hint(argv)
    return f"no checkpoint was written yet; start again with: {shlex.join(['grpo-gym', *without_resume(argv)])}"


def differs(name: str, value: Any, saved: Any) -> bool:
    """Whether ``-params name:value`` changes the saved ``saved``: for a settings dict (merged key by key over the
    preset's), whether any key it gives has another value; for anything else, whether it is another value."""
    if merged_over(name, value, saved):
        return any(saved.get(key) != item for key, item in value.items())
    return saved != value


def without_resume(argv: list[str]) -> list[str]:
    return [arg for arg in argv if arg != "--resume"]


def resumed_params(
    hyperparams: list[str] | None,
    saved: dict[str, Any],
    run: dict[str, Any],
    env_record: dict[str, Any] | None = None,
    flags: dict[str, Any] | None = None,
) -> list[str]:
    """``-params`` on ``--resume``: the evaluation's and the rollout engine's settings are taken (returned, to say so);
    ``env_kwargs`` (and the env's flags, ``flags``) are taken when each value is the one the checkpoint's env records
    (``env_record``: the command that started the run, given again); a change to anything else is refused, naming it
    (a resumed run continues with the settings it was saved with)."""
    from algorithms.common.lm_arguments import ENGINE_ARGUMENTS

    given = parse_overrides(hyperparams or [])
    recorded = {**saved, "n_timesteps": run.get("total_timesteps")}
    # how it samples and evaluates, not how it learns
    runtime = ("eval_difficulties", "eval_problems", "eval_greedy", "eval_samples", *ENGINE_ARGUMENTS)
    taken = sorted(key for key in given if key in runtime)
    env_params = given.pop("env_kwargs", None)
    env_given = {**(env_params if isinstance(env_params, dict) else {}), **(flags or {})}
    changed = {
        key: value for key, value in given.items() if key not in taken and differs(key, value, recorded.get(key))
    }
    if env_params is not None and not isinstance(env_params, dict):
        changed["env_kwargs"] = env_params
    if env_given and env_record is None:
        changed["env_kwargs"] = env_given
        recorded["env_kwargs"] = "not recorded in the checkpoint"
    for key, value in env_given.items() if env_record is not None else ():
        if key not in env_record or env_record[key] != value:
            changed[f"env_kwargs.{key}"] = value
            recorded[f"env_kwargs.{key}"] = env_record.get(key, "not an env argument")
    if changed:
        shown = ", ".join(
            f"{key}:{value!r} (saved: {recorded.get(key, 'not a saved setting')!r})" for key, value in changed.items()
        )
        raise ValueError(
            f"--resume continues the saved run with its own settings; the command line would change {shown}. Drop them "
            "to resume, or start a new run (without --resume) to use them"
        )
    return taken + (["env_kwargs"] if env_params is not None else [])
