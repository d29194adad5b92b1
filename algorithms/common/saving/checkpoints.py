"""Crash-safe runs: checkpoints at iteration boundaries (the newest two kept) and resuming from the newest.

A checkpoint is a folder ``<checkpoint dir>/iteration_<n>/`` holding ``model.zip`` (see
:mod:`algorithms.common.saving.run_file`: weights, optimizer, RNG states, counters, env and curriculum state),
``replay.npz`` when the model has a replay buffer, and ``run.json`` (what the command line needs to finish the
run: its total, the held-out results measured before training; :func:`read_run_json`). Plain and sharded
checkpoints are the same folder: with ``sharding="fsdp"`` on several processes the weights and optimizer state are
the folder's shards instead of ``model.zip``'s (one file per rank, :mod:`algorithms.common.saving.sharded`, which
``--resume`` reads on any number of processes). Either is written whole under a temporary name and swapped into
place (:func:`~algorithms.common.saving.atomic.atomic_directory`, with ``fsync``), so a kill at any instant leaves
the previous checkpoints complete and at most a temporary folder, which :func:`latest_checkpoint` ignores and the
next write removes.

The model is read only through its public face: ``iteration``, ``distributed``, ``is_sharded``, ``save``,
``save_sharded``, ``replay_buffer`` / ``save_replay_buffer``.

:class:`IterationCheckpoint` writes one every ``every`` iterations, and once more when :meth:`request_stop` was
called (by a signal handler): at the next environment step it saves (the state of the last finished iteration,
since a save during a rollout records that) and stops ``learn``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback

from algorithms.common.saving.atomic import atomic_directory, check_writable, remove_stale_temporaries
from algorithms.common.saving.model_file import CHECKPOINT_MODEL as MODEL
from algorithms.common.saving.model_file import model_file_path
from grpo_gym.validation import read_json

PREFIX = "iteration_"
REPLAY, RUN = "replay.npz", "run.json"


def check_writable_file(path: str | os.PathLike, what: str = "--save-path") -> Path:
    """``path`` as a model file name (``.zip`` added), after checking its folder can be written: raises a
    ``ValueError`` naming ``what`` and the fix otherwise (before any work is done)."""
    try:
        path = model_file_path(path)
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from None
    check_writable_dir(path.parent, what)
    return path


def check_writable_dir(path: str | os.PathLike, what: str = "--checkpoint-dir") -> Path:
    """Create the folder ``path`` if needed and check that a file can be written in it."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        check_writable(path)
    except OSError as error:
        raise ValueError(f"{what}: cannot write in {os.fspath(path)!r} ({error.strerror or error})") from None
    return path


def _folders(directory: str | os.PathLike) -> list[Path]:
    """Every ``iteration_<n>`` folder in ``directory``, complete or not, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if p.is_dir() and p.name.startswith(PREFIX)]
    return sorted(found, key=lambda p: int(p.name.removeprefix(PREFIX)) if p.name[len(PREFIX) :].isdigit() else -1)


def missing_files(folder: Path) -> list[str]:
    """The files a checkpoint folder lacks to be resumed from (``run.json``, ``model.zip``): ``[]`` when complete."""
    return [name for name in (RUN, MODEL) if not (folder / name).is_file()]


def checkpoints(directory: str | os.PathLike) -> list[Path]:
    """The complete checkpoints in ``directory`` (``run.json`` and ``model.zip`` both there), oldest first."""
    return [folder for folder in _folders(directory) if not missing_files(folder)]


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint folder in ``directory`` (None: none yet)."""
    found = checkpoints(directory)
    return found[-1] if found else None


def resume_point(directory: str | os.PathLike) -> tuple[Path, list[str]]:
    """The newest complete checkpoint of ``directory`` and what to say about the newer folders it skipped (one that
    lacks ``model.zip`` or ``run.json``: deleted, or copied in part); ``ValueError`` naming the fix when there is
    none to resume from."""
    folders = _folders(directory)
    newest = latest_checkpoint(directory)
    newer = folders[folders.index(newest) + 1 :] if newest is not None else folders
    notes = [
        f"--resume: skipped {os.fspath(folder)}: it has no {' or '.join(missing_files(folder))} (an incomplete "
        "checkpoint, left as it is)"
        for folder in newer
    ]
    if newest is None:
        detail = f" ({'; '.join(note.removeprefix('--resume: skipped ') for note in notes)})" if notes else ""
        raise ValueError(
            f"--resume: no complete checkpoint in {os.fspath(directory)!r}{detail}; start the run without --resume"
        )
    if notes:
        notes.append(f"--resume: resuming from {os.fspath(newest)}, the newest complete checkpoint")
    return newest, notes


def write_checkpoint(model: Any, directory: str | os.PathLike, run: dict[str, Any], keep: int = 2) -> Path | None:
    """Write ``model`` (and its replay buffer) with ``run`` as a new checkpoint folder, atomically; keep the newest
    ``keep``. Every process calls it: a sharded model writes its shards on every rank (``save_sharded``, a
    collective), a whole one on rank 0 alone; the folder, or None on a rank that wrote nothing."""
    directory = Path(directory)
    target = directory / f"{PREFIX}{model.iteration:07d}"
    main = model.distributed.is_main

    def extra(folder: Path) -> None:  # rank 0, into the temporary folder
        if getattr(model, "replay_buffer", None) is not None:
            model.save_replay_buffer(folder / REPLAY)
        (folder / RUN).write_text(json.dumps({**run, "iteration": model.iteration}, indent=1), encoding="utf-8")

    if not (main or model.is_sharded):
        return None
    if main:  # writes killed half-way (of any iteration): their temporary folders go
        remove_stale_temporaries(directory, lambda name: name.startswith(PREFIX))
    try:
        if model.is_sharded:
            model.save_sharded(target, write_extra=extra)
        else:
            with atomic_directory(target) as folder:
                model.save(folder / MODEL)
                extra(folder)
    except OSError as error:
        previous = latest_checkpoint(directory)
        kept = f"the previous checkpoint {os.fspath(previous)!r} is intact" if previous else "no earlier checkpoint"
        raise OSError(error.errno, f"checkpoint {os.fspath(target)!r} was not written ({error}); {kept}") from None
    if main:
        for old in checkpoints(directory)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return target


#: the held-out results a run.json records before GRPO, per difficulty: ``EvalResult``'s number fields (and ``source``)
RESULT_FIELDS = ("difficulty", "n_problems", "success_rate", "mean_reward", "mean_length")
#: the pass@k fields an ``EvalResult`` adds with ``samples`` (a count, then two numbers or null)
PASS_AT_K_FIELDS = ("samples", "sampled_success", "pass_at_k")


def read_run_json(folder: str | os.PathLike) -> dict[str, Any]:
    """The ``run.json`` of a checkpoint folder (the command line's total and held-out results; the model's own
    run state is its ``model.zip``, :func:`~algorithms.common.saving.run_file.read_saved_run`), checked: a
    ``ValueError`` names the file, the key and the fix."""
    path = Path(folder) / RUN
    where = os.fspath(path)
    move = f"or move {os.fspath(folder)!r} out of its folder to resume from the checkpoint before it"
    try:
        text = path.read_bytes()
    except OSError as error:
        raise ValueError(f"{where} cannot be read ({error.strerror or error}); {move.removeprefix('or ')}") from None
    run = read_json(text, where, fix=f"restore the file, {move}")
    if not isinstance(run, dict):
        raise ValueError(f"{where} must hold a JSON object, got {type(run).__name__}; restore the file, {move}")
    total = run.get("total_timesteps")
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise ValueError(
            f"{where}: 'total_timesteps' must be an integer >= 1 (the completions the run trains to), got "
            f"{total!r:.40}; write the run's total there (its n_timesteps, e.g. 20000), {move}"
        )
    tables = {"before": "before GRPO", "start": "before training"}
    for key, when in tables.items():
        rows = run.get(key, [])
        if not isinstance(rows, list) or not all(_is_result(row) for row in rows):
            fields = ", ".join(RESULT_FIELDS)
            raise ValueError(
                f"{where}: {key!r} must be the held-out results measured {when}, a list of {{{fields}, source}} "
                f"(numbers, and a text; with pass@k also samples, sampled_success, pass_at_k); write [] there to "
                f"report none, {move}"
            )
    return run


def _is_result(row: Any) -> bool:
    """Whether ``row`` is an ``EvalResult`` as ``dataclasses.asdict`` wrote it."""
    if not isinstance(row, dict) or not set(row) <= {*RESULT_FIELDS, *PASS_AT_K_FIELDS, "source"}:
        return False
    numbers = [row.get(key) for key in RESULT_FIELDS]
    numbers += [row[key] for key in PASS_AT_K_FIELDS[1:] if row.get(key) is not None]
    samples = row.get("samples", 0)
    return (
        all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers)
        and isinstance(samples, int) and not isinstance(samples, bool) and samples >= 0
        and isinstance(row.get("source", ""), str)
    )  # fmt: skip


class IterationCheckpoint(BaseCallback):
    """Write a checkpoint every ``every`` iterations (at the iteration boundary, before the next rollout) and,
    after :meth:`request_stop`, once more and stop training.

    :param directory: the checkpoint folder
    :param every: iterations between checkpoints (0: only when stopping)
    :param run: what to record in each checkpoint's ``run.json``
    :param keep: how many checkpoints to keep (the newest)
    """

    def __init__(self, directory: str | os.PathLike, every: int, run: dict[str, Any], keep: int = 2) -> None:
        super().__init__()
        self.directory, self.every, self.run, self.keep = Path(directory), int(every), run, keep
        self.stop_requested = False
        self.written: Path | None = None
        self._agreed_stop = False  # several processes: whether any rank asked to stop, agreed at the boundary

    def request_stop(self) -> None:
        """Checkpoint and stop at the next step (safe to call from a signal handler: it only sets a flag)."""
        self.stop_requested = True

    def _on_rollout_start(self) -> None:
        dist = self.model.distributed
        if dist.enabled:  # every rank stops at the same step, or none does
            self._agreed_stop = dist.sum(float(self.stop_requested)) > 0
        iteration = self.model.iteration
        if self.every and iteration and iteration % self.every == 0:
            self.save()

    def _on_step(self) -> bool:
        if not (self._agreed_stop if self.model.distributed.enabled else self.stop_requested):
            return True
        self.save()  # during a rollout: the state of the last finished iteration
        return False

    def save(self) -> Path | None:
        """Write a checkpoint of the last finished iteration, unless it is written already (rank 0; with sharding
        every rank, each writing its shards)."""
        if self.written is not None and self.written.name == f"{PREFIX}{self.model.iteration:07d}":
            return self.written
        written = write_checkpoint(self.model, self.directory, self.run, self.keep)
        self.written = written if written is not None else self.written
        return self.written
