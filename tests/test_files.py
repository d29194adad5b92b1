"""algorithms/common/saving/atomic.py: atomic file and folder writes."""

from __future__ import annotations

import os
import random
import signal
import stat
import time
from pathlib import Path

import pytest

from algorithms.common.saving import atomic as files
from algorithms.common.saving.atomic import atomic_directory, atomic_write, recover_directory


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_atomic_write_replaces_the_file_and_keeps_its_permissions(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    with atomic_write(path, "w") as f:
        f.write("first é\n")
    assert path.read_text(encoding="utf-8") == "first é\n" and names(tmp_path) == ["out.txt"]
    os.chmod(path, 0o640)
    with atomic_write(path) as f:
        f.write(b"second")
    assert path.read_bytes() == b"second" and stat.S_IMODE(path.stat().st_mode) == 0o640


def test_atomic_write_error_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="boom"), atomic_write(path) as f:
        f.write(b"partial new content")
        raise RuntimeError("boom")
    assert path.read_bytes() == b"old" and names(tmp_path) == ["out.bin"]


def test_atomic_write_refuses_bad_targets(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mode must be one of"), atomic_write(tmp_path / "x", "ab"):
        pass
    with pytest.raises(ValueError, match="existing folder"), atomic_write(tmp_path):
        pass
    with pytest.raises(FileNotFoundError), atomic_write(tmp_path / "no" / "such" / "folder" / "x"):
        pass


def test_stale_temporaries_of_dead_processes_are_removed_live_ones_kept(tmp_path: Path) -> None:
    pid = os.fork() if hasattr(os, "fork") else None
    if pid == 0:
        os._exit(0)
    if pid is None:
        pytest.skip("needs os.fork")
    os.waitpid(pid, 0)  # a process id that no longer runs
    dead = tmp_path / f".out.bin.{pid}.abcd1234.tmp"
    live = tmp_path / f".out.bin.{os.getppid()}.abcd1234.tmp"
    other = tmp_path / f".other.bin.{pid}.abcd1234.tmp"
    for p in (dead, live, other):
        p.write_bytes(b"x")
    with atomic_write(tmp_path / "out.bin") as f:
        f.write(b"new")
    assert names(tmp_path) == sorted([live.name, other.name, "out.bin"])


def test_atomic_directory_writes_then_replaces_whole(tmp_path: Path) -> None:
    target = tmp_path / "export"
    with atomic_directory(target) as folder:
        (folder / "a.txt").write_text("1")
        (folder / "sub").mkdir()
        (folder / "sub" / "b.txt").write_text("1")
    assert names(target) == ["a.txt", "sub"]
    with atomic_directory(target) as folder:
        (folder / "c.txt").write_text("2")
    assert names(target) == ["c.txt"] and names(tmp_path) == ["export"]  # replaced whole, nothing left over
    with pytest.raises(RuntimeError), atomic_directory(target) as folder:
        (folder / "d.txt").write_text("3")
        raise RuntimeError("save_pretrained failed")
    assert names(target) == ["c.txt"] and names(tmp_path) == ["export"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="a file is in the way"), atomic_directory(tmp_path / "file"):
        pass


def test_fallback_swap_interrupted_between_its_renames_is_recovered(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "export"
    with atomic_directory(target) as folder:
        (folder / "v").write_text("old")
    monkeypatch.setattr(files, "_exchange", lambda a, b: False)  # as on a system without RENAME_EXCHANGE
    renames = []
    real_rename = os.rename

    def rename_then_die(src, dst):
        renames.append((src, dst))
        if len(renames) == 2:
            raise KeyboardInterrupt  # "killed" between the two renames
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename_then_die)
    with pytest.raises(KeyboardInterrupt), atomic_directory(target) as folder:
        (folder / "v").write_text("new")
    monkeypatch.setattr(os, "rename", real_rename)
    assert not target.exists() and (tmp_path / ".export.old" / "v").read_text() == "old"
    recover_directory(target)
    assert (target / "v").read_text() == "old" and names(tmp_path) == ["export"]
    with atomic_directory(target) as folder:  # the fallback swap, uninterrupted
        (folder / "v").write_text("new")
    assert (target / "v").read_text() == "new" and names(tmp_path) == ["export"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_kill_9_during_repeated_folder_writes_leaves_a_complete_folder(tmp_path: Path) -> None:
    target = tmp_path / "export"
    payload = 512 * 1024

    def write_version(k: int) -> None:
        with atomic_directory(target) as folder:
            for name in ("config.json", "model.safetensors", "tokenizer.json"):
                (folder / name).write_bytes(str(k).encode().ljust(payload, b"."))

    write_version(0)
    rng = random.Random(0)
    seen = set()
    for _ in range(25):
        ready_read, ready_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(ready_read)
                k = 0
                while True:
                    k += 1
                    write_version(k)
                    if k == 1:
                        os.write(ready_write, b"1")
            finally:
                os._exit(0)
        os.close(ready_write)
        os.read(ready_read, 1)
        os.close(ready_read)
        time.sleep(rng.uniform(0.0, 0.05))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        recover_directory(target)  # a no-op with RENAME_EXCHANGE; finishes an interrupted fallback swap
        contents = {p.name: p.read_bytes() for p in target.iterdir()}
        assert sorted(contents) == ["config.json", "model.safetensors", "tokenizer.json"]
        versions = {data.rstrip(b".") for data in contents.values()}
        assert len(versions) == 1 and all(len(data) == payload for data in contents.values())  # one whole version
        seen |= versions
    assert len(seen) > 1
    write_version(-1)  # the next write removes what the killed writers left
    assert names(tmp_path) == ["export"]
