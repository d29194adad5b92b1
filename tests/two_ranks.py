"""A test job as two real processes: ``python -m torch.distributed.run --standalone --nproc_per_node=2 JOB OUT MODE
...`` (gloo, one torch thread per rank), its output captured for the assertion message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_on_two_ranks(job: Path, out: Path, mode: str, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``job`` on 2 ranks with ``out`` (where it writes), ``mode`` and ``extra`` as its arguments."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(job),
               str(out), mode, *extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
