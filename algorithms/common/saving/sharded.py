"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP): each rank writes its own shard of the model's and
the optimizer's state, and any number of processes reads them back (DCP reshards at load), one process included.
The plain checkpoints (one ``model.zip`` with the weights) are :mod:`~algorithms.common.saving.checkpoints`'; an
algorithm's sharded checkpoint (``save_sharded``) is :func:`save_policy` here, read back by :func:`load_policy`.

A checkpoint is a folder: DCP's ``.metadata``, one ``__<rank>_0.distcp`` file per rank, and whatever the caller's
``write_extra`` adds (on rank 0, e.g. the run state). The folder is written atomically as a whole: rank 0 makes a
temporary folder beside the target (:func:`~algorithms.common.saving.atomic.atomic_directory`) and tells the other
ranks its name; every rank writes its shard there; once DCP has finished (every rank's files, then the metadata,
which rank 0 writes after the others reported their writes done), rank 0 ``fsync``\\ s the folder and swaps it into
place. A ``kill -9`` of any rank at any instant therefore leaves the previous checkpoint whole at the target, plus at
most a temporary folder that the next save of that target removes.

Every rank must see the same folder: one machine, or a file system shared by the machines.

An optimizer that has not stepped yet has no state, and none is written (gathering it with torch's API would first
create it with a zero step, which changes AdamW's next steps); loading such a checkpoint leaves the optimizer fresh.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from algorithms.common.saving.atomic import atomic_directory

#: the top-level keys of the saved state
MODEL, OPTIMIZER = "model", "optimizer"
#: the file DCP writes last, once every rank's shard is written
METADATA = ".metadata"

__all__ = ["check_complete", "load_policy", "load_sharded", "save_policy", "save_sharded", "saved_keys"]


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def _alone():
    """DCP in one process (``no_dist``), without its warning that one process is assumed: it is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to (save|load) in a single process")
        yield


def save_sharded(
    directory: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    write_extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``model``'s (sharded or plain) state and ``optimizer``'s to the checkpoint folder ``directory``, each rank
    its own shard, atomically (see the module doc); an existing folder there is replaced whole. Collective.

    :param directory: the checkpoint folder (its parent must exist)
    :param model: the model, as :func:`~algorithms.common.runtime.sharding.shard_model` left it (or unsharded)
    :param optimizer: its optimizer, made after sharding
    :param write_extra: called on rank 0 with the temporary folder once the shards are written, to add files that
        belong to the same checkpoint (they are swapped into place with it)
    """
    state: dict[str, object] = {MODEL: get_model_state_dict(model)}
    if optimizer is not None and optimizer.state:
        state[OPTIMIZER] = get_optimizer_state_dict(model, optimizer)
    distributed = _distributed()
    main = not distributed or dist.get_rank() == 0
    with atomic_directory(directory) if main else contextlib.nullcontext() as temporary:
        folder = _shared_path(temporary, distributed)
        with contextlib.nullcontext() if distributed else _alone():
            dcp.save(state, checkpoint_id=folder, no_dist=not distributed)
        if main and write_extra is not None:
            write_extra(Path(folder))
    if distributed:
        dist.barrier()  # the folder is in place before any rank goes on (e.g. to read it)
    return Path(directory)


def _shared_path(path: Path | None, distributed: bool) -> str:
    """Rank 0's ``path``, on every rank."""
    if not distributed:
        return os.fspath(path)
    box = [os.fspath(path) if path is not None else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def saved_keys(directory: str | os.PathLike) -> set[str]:
    """The keys a complete checkpoint folder holds, flattened: ``"model.<parameter>"``, ``"optimizer.<...>"``."""
    return set(FileSystemReader(Path(directory)).read_metadata().state_dict_metadata)


def check_complete(directory: Path) -> None:
    """Refuse a folder that lacks the metadata or one of the shard files it lists (a checkpoint copied in part, or
    written on machines that did not share the folder), naming what is missing."""
    if not (directory / METADATA).is_file():
        raise ValueError(
            f"{os.fspath(directory)!r} is not a complete sharded checkpoint (no {METADATA} file); "
            "pass the folder save_sharded wrote"
        )
    listed = {item.relative_path for item in FileSystemReader(directory).read_metadata().storage_data.values()}
    missing = sorted(name for name in listed if not (directory / name).is_file())
    if missing:
        raise ValueError(
            f"{os.fspath(directory)!r} is an incomplete sharded checkpoint: {', '.join(missing)} missing (each rank "
            "writes its own shard file); copy the checkpoint folder whole, and on several machines save it to a "
            "folder every machine sees"
        )


def load_sharded(
    directory: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> None:
    """Read a checkpoint written by :func:`save_sharded` (by any number of processes) into ``model`` and
    ``optimizer``, sharded like this job's (or plain, in one process). Collective.

    :raises ValueError: when ``directory`` holds no complete checkpoint
    """
    directory = Path(directory)
    check_complete(directory)
    saved = saved_keys(directory)
    state: dict[str, object] = {MODEL: get_model_state_dict(model)}
    if optimizer is not None and any(key.startswith(f"{OPTIMIZER}.") for key in saved):
        state[OPTIMIZER] = get_optimizer_state_dict(model, optimizer)  # the layout to read into
    distributed = _distributed()
    with contextlib.nullcontext() if distributed else _alone():
        dcp.load(state, checkpoint_id=directory, no_dist=not distributed)
    set_model_state_dict(model, state[MODEL])
    if OPTIMIZER in state:
        set_optimizer_state_dict(model, optimizer, state[OPTIMIZER])


# ---------------------------------------------------------------------------------------------- a policy's checkpoint
class _Checkpointed(nn.Module):
    """What a policy's sharded checkpoint holds, under one root: ``policy`` and, when there is one, ``ref_model``."""

    def __init__(self, policy: nn.Module, reference: nn.Module | None) -> None:
        super().__init__()
        self.policy = policy
        if reference is not None:
            self.ref_model = reference


def save_policy(
    directory: str | os.PathLike,
    policy: nn.Module,
    reference: nn.Module | None,
    write_extra: Callable[[Path], None] | None = None,
) -> Path:
    """The checkpoint folder of a policy, its optimizer (``policy.optimizer``) and the frozen reference, sharded or
    whole (rank 0 writes the tensors whole replicas hold), with ``write_extra``'s files from rank 0, atomically
    (:func:`save_sharded`). Collective."""
    return save_sharded(directory, _Checkpointed(policy, reference), policy.optimizer, write_extra)


def load_policy(model_file: Any, policy: nn.Module, reference: nn.Module | None) -> bool:
    """Read the checkpoint folder of :func:`save_policy` (written by any number of processes) that holds
    ``model_file`` into the policy, its optimizer and the reference, sharded or whole; whether it held a reference
    (a run saved at ``beta=0`` has none: the caller makes one). Collective."""
    if not isinstance(model_file, (str, os.PathLike)):
        raise ValueError("this model file's weights are in the sharded checkpoint folder around it: pass its path")
    folder = Path(model_file).parent
    if not (folder / METADATA).is_file():
        raise ValueError(
            f"{os.fspath(model_file)!r} holds no weights: it is the model file of a sharded checkpoint, whose weights "
            f"are the shard files saved beside it ({METADATA}, __<rank>_0.distcp); load it inside its checkpoint "
            "folder (copy the folder whole), or make a whole model file from it there: "
            "GRPO.load('<folder>/model.zip').save('whole.zip')"
        )
    held = reference is not None and any(key.startswith(f"{MODEL}.ref_model.") for key in saved_keys(folder))
    load_sharded(folder, _Checkpointed(policy, reference if held else None), policy.optimizer)
    return held
