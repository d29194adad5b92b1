"""Prioritized replay at capacity 1e6: grpo-gym's ``PrioritizedTrajectoryBuffer`` vs torchrl's prioritized buffer.

Both buffers hold GRPO trajectories of one fixed shape: a ``--prompt-len`` token prompt, a ``--completion-len`` token
completion with its sampling log-probs, a reward, a group id and an iteration; token ids are int32 and log-probs
float32 on both sides, generated once up front (the timed loops only move them). Both use alpha 0.6, beta 0.4.

- torchrl: ``PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(capacity))`` fed TensorDicts.
  ``LazyTensorStorage`` (dense preallocated tensors) is torchrl's fastest storage and fits fixed-shape data exactly;
  ``ListStorage`` keeps one Python object per item and stacks them at every sample. The price of the dense storage
  shows only with variable lengths (it pads every trajectory to the longest), which this fixed-shape comparison
  leaves out. Its sum/min trees are torchrl's C++ segment trees (``torchrl._torchrl``); when the wheel's compiled
  extension does not load with the installed torch (torchrl 0.14.1 against torch 2.13), the script compiles the
  same C++ sources that ship in the wheel (``torchrl/csrc``) against the installed torch (once, about a minute,
  cached by ``torch.utils.cpp_extension``) and registers them under ``torchrl._torchrl`` before importing torchrl.
- ours: ``add_batch`` with GRPO rows (all-true masks), ``add`` for one trajectory; the token arena sized to hold
  every trajectory (``max_tokens = (capacity + insert batch) * (P + 2C)``), so only the slot capacity evicts, as in
  torchrl. Ours does more per call than torchrl: it validates the input (token ids in range, finite log-probs and
  rewards), normalises rewards and applies the high-reward boost, and ``sample_batch`` returns int64 padded arrays
  with masks where torchrl returns the stored int32 tensors.
- torch runs with ``--threads`` threads (default 1): on a 2-core machine shared with other work, two OpenMP
  threads per op made torchrl's small-batch ops many times slower; numpy does these ops on one thread anyway.

Measured (each at full capacity, so inserts overwrite the oldest; each for ``--seconds``, ``--repeats`` rounds
alternating the two buffers, best round kept):

- insert, batched: ``--insert-batch`` trajectories per call (ours ``add_batch``, torchrl ``extend``);
- insert, one by one (ours ``add``, torchrl ``add``);
- sample: a batch of ``--sample-batch`` with indices and importance weights and the trajectories' data (ours
  ``sample_batch``: padded GRPO arrays; torchrl ``sample(return_info=True)``: a TensorDict and its info);
- priority update of ``--sample-batch`` indices (ours ``update_priorities``, torchrl ``update_priority``).

Also: the time to fill the empty buffer to capacity in batches, and the growth of the process's RSS during the fill.

Command (about 35 s on 2 cores, 1.7 GB of RAM; add ``--results benchmarks/RESULTS.md`` to record the figures there)::

    nice -n 19 python benchmarks/buffer_throughput.py

Needs the ``bench`` extra (``torchrl``, which brings ``tensordict``), and a C++ compiler and ninja when torchrl's
compiled extension has to be rebuilt (see above). The grpo-gym package never imports torchrl.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from algorithms.common.replay.trajectory_buffer import PrioritizedTrajectoryBuffer

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: benchmarks/ is not a package
from common import cpu_name, memory_mib, update_results

SECTION = "## Prioritized replay buffer vs torchrl"
OPS = ["insert, batched", "insert, one by one", "sample", "priority update"]
UNITS = {
    "insert, batched": "traj/s",
    "insert, one by one": "traj/s",
    "sample": "batches/s",
    "priority update": "calls/s",
}


def import_torchrl() -> tuple[Any, str]:
    """Import torchrl with working C++ segment trees; returns (torchrl module, how its extension was obtained)."""
    from torch.utils import cpp_extension

    package = Path(importlib.util.find_spec("torchrl").origin).parent
    how = "the wheel's compiled extension"
    try:
        compiled = next(package.glob("_torchrl*.so"))
        spec = importlib.util.spec_from_file_location("torchrl._torchrl", compiled)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, StopIteration):
        os.environ.setdefault("MAX_JOBS", "1")
        csrc = package / "csrc"
        module = cpp_extension.load(
            name="_torchrl",
            sources=[str(csrc / "pybind.cpp"), str(csrc / "utils.cpp")],
            extra_include_paths=[str(csrc)],
            extra_cflags=["-O3"],
        )
        how = f"its C++ sources (torchrl/csrc) compiled with -O3 against torch {torch.__version__}"
    sys.modules["torchrl._torchrl"] = module
    import torchrl
    from torchrl.data.replay_buffers.samplers import prioritized

    assert prioritized.SumSegmentTreeFp32 is not None, "torchrl's segment trees did not load"
    return torchrl, how


def make_data(args: argparse.Namespace) -> dict[str, np.ndarray]:
    """``--pool`` fixed-shape trajectories (int32 ids, float32 log-probs), drawn once."""
    rng = np.random.default_rng(0)
    n = args.pool
    return {
        "prompt_ids": rng.integers(0, 32_000, (n, args.prompt_len), dtype=np.int32),
        "completion_ids": rng.integers(0, 32_000, (n, args.completion_len), dtype=np.int32),
        "log_probs": -rng.random((n, args.completion_len), dtype=np.float32) * 5,
        "reward": rng.uniform(-1, 1, n).astype(np.float32),
        "group_id": np.arange(n, dtype=np.int64) // 8,
    }


class Ours:
    """grpo-gym's buffer behind the four timed operations."""

    def __init__(self, args: argparse.Namespace, data: dict[str, np.ndarray]) -> None:
        # Room for capacity + one batch: a block never wraps around the arena's end, so a budget of exactly
        # capacity trajectories would evict by tokens when the capacity is not a multiple of the batch.
        words = (args.capacity + args.insert_batch) * (args.prompt_len + 2 * args.completion_len)
        self.buffer = PrioritizedTrajectoryBuffer(capacity=args.capacity, max_tokens=words, seed=0)
        self.data, self.b = data, args.insert_batch
        self.pmask = np.ones((self.b, args.prompt_len), dtype=bool)
        self.cmask = np.ones((self.b, args.completion_len), dtype=bool)
        self.indices = np.zeros(args.sample_batch, dtype=np.int64)

    def insert_batch(self, i: int) -> None:
        d, start = self.data, (i % (len(self.data["reward"]) // self.b)) * self.b
        s = slice(start, start + self.b)
        self.buffer.add_batch(
            d["prompt_ids"][s], self.pmask, d["completion_ids"][s], self.cmask, d["log_probs"][s],
            rewards=d["reward"][s], group_ids=d["group_id"][s], iteration=0, timestamp=0.0,
        )  # fmt: skip

    def insert_one(self, i: int) -> None:
        d, j = self.data, i % len(self.data["reward"])
        self.buffer.add(
            d["prompt_ids"][j], d["completion_ids"][j], d["log_probs"][j],
            reward=float(d["reward"][j]), group_id=int(d["group_id"][j]), iteration=0, timestamp=0.0,
        )  # fmt: skip

    def sample(self, batch: int) -> None:
        self.indices = self.buffer.sample_batch(batch).indices

    def update(self, priorities: np.ndarray) -> None:
        self.buffer.update_priorities(self.indices, priorities)


class TorchRL:
    """torchrl's ``PrioritizedReplayBuffer`` on a ``LazyTensorStorage``, behind the same four operations."""

    def __init__(self, args: argparse.Namespace, data: dict[str, np.ndarray]) -> None:
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer

        self.rb = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(args.capacity))
        n, self.b = len(data["reward"]), args.insert_batch
        self.td = TensorDict({k: torch.from_numpy(v) for k, v in data.items()}, batch_size=[n])
        self.td["iteration"] = torch.zeros(n, dtype=torch.int64)
        self.batches = [self.td[i : i + self.b] for i in range(0, n - self.b + 1, self.b)]
        self.singles = [self.td[i] for i in range(min(n, 4096))]
        self.indices = self.priorities = None

    def insert_batch(self, i: int) -> None:
        self.rb.extend(self.batches[i % len(self.batches)])

    def insert_one(self, i: int) -> None:
        self.rb.add(self.singles[i % len(self.singles)])

    def sample(self, batch: int) -> None:
        _, info = self.rb.sample(batch, return_info=True)
        self.indices = info["index"]

    def update(self, priorities: np.ndarray) -> None:
        if not isinstance(self.priorities, torch.Tensor) or len(self.priorities) != len(priorities):
            self.priorities = torch.as_tensor(priorities, dtype=torch.float32)  # its C++ trees take float32 only
        self.rb.update_priority(self.indices, self.priorities)


def rate(op: Callable[[int], None], seconds: float) -> float:
    """Calls of ``op`` per second over about ``seconds`` (after 3 warm-up calls)."""
    for i in range(3):
        op(i)
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for i in range(calls, calls + 8):
            op(i)
        calls += 8
    return calls / elapsed


def fill(impl: Ours | TorchRL, capacity: int, batch: int) -> tuple[float, float]:
    """Insert batches until the buffer holds ``capacity`` trajectories; returns (seconds, RSS growth in MiB)."""
    rss, start = memory_mib()["rss"], time.perf_counter()
    for i in range(-(-capacity // batch)):
        impl.insert_batch(i)
    return time.perf_counter() - start, memory_mib()["rss"] - rss


def measure(args: argparse.Namespace, impls: dict[str, Ours | TorchRL]) -> dict[str, dict[str, float]]:
    """Best rate of each operation over ``--repeats`` rounds that alternate the buffers."""
    priorities = np.random.default_rng(1).random(args.sample_batch) + 0.1
    ops: dict[str, Callable[[Ours | TorchRL], Callable[[int], None]]] = {
        "insert, batched": lambda impl: impl.insert_batch,
        "insert, one by one": lambda impl: impl.insert_one,
        "sample": lambda impl: lambda i: impl.sample(args.sample_batch),
        "priority update": lambda impl: lambda i: impl.update(priorities),
    }
    best = {name: dict.fromkeys(OPS, 0.0) for name in impls}
    for _ in range(args.repeats):
        for op in ["sample", "priority update", "insert, batched", "insert, one by one"]:
            for name, impl in impls.items():
                per_call = args.insert_batch if op == "insert, batched" else 1
                if op == "priority update":
                    impl.sample(args.sample_batch)
                best[name][op] = max(best[name][op], per_call * rate(ops[op](impl), args.seconds))
    return best


def report(args: argparse.Namespace, versions: str, how: str, fills: dict, rates: dict) -> str:
    """The markdown block: command, machine, versions, table of rates and ratios."""
    lines = [
        f"Command: `nice -n 19 python benchmarks/buffer_throughput.py {' '.join(sys.argv[1:])}` "
        f"({datetime.date.today().isoformat()}).",
        "",
        f"{versions}, Python {platform.python_version()}; {os.cpu_count()}-core {cpu_name()}; torch threads "
        f"{args.threads}. torchrl's segment trees: {how}. Capacity {args.capacity:,}; trajectories of "
        f"{args.prompt_len} prompt + {args.completion_len} completion tokens; insert batches of {args.insert_batch}, "
        f"sample batches of {args.sample_batch}; best of {args.repeats} rounds of {args.seconds:g} s each.",
        "",
        "| operation | ours | torchrl | ours / torchrl |",
        "|---|---|---|---|",
    ]
    for op in OPS:
        ours, theirs = rates["ours"][op], rates["torchrl"][op]
        lines.append(f"| {op} ({UNITS[op]}) | {ours:,.0f} | {theirs:,.0f} | **{ours / theirs:.2f}x** |")
    (t_ours, m_ours), (t_rl, m_rl) = fills["ours"], fills["torchrl"]
    lines.append(
        f"| fill to capacity (s; RSS growth) | {t_ours:.2f} s; {m_ours:,.0f} MiB | {t_rl:.2f} s; {m_rl:,.0f} MiB "
        f"| speed {t_rl / t_ours:.2f}x; RSS {m_ours / m_rl:.2f}x |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--completion-len", type=int, default=64)
    parser.add_argument("--insert-batch", type=int, default=256)
    parser.add_argument("--sample-batch", type=int, default=256)
    parser.add_argument("--pool", type=int, default=16_384, help="distinct trajectories generated up front")
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one timed round of one operation")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--results", type=Path, help="write the figures into this RESULTS.md")
    args = parser.parse_args()

    torchrl, how = import_torchrl()
    import tensordict

    torch.set_num_threads(args.threads)
    versions = (
        f"numpy {np.__version__}, torchrl {torchrl.__version__}, tensordict {tensordict.__version__}, "
        f"torch {torch.__version__}"
    )
    print(versions, "| torchrl trees:", how, flush=True)
    data = make_data(args)
    impls: dict[str, Ours | TorchRL] = {}
    fills = {}
    for name, cls in [("ours", Ours), ("torchrl", TorchRL)]:
        impls[name] = cls(args, data)
        fills[name] = fill(impls[name], args.capacity, args.insert_batch)
        print(f"{name}: filled {args.capacity:,} in {fills[name][0]:.2f} s, RSS +{fills[name][1]:,.0f} MiB", flush=True)
    assert len(impls["ours"].buffer) == len(impls["torchrl"].rb) == args.capacity
    rates = measure(args, impls)
    body = report(args, versions, how, fills, rates)
    print(body)
    if args.results:
        title = f"`--capacity {args.capacity} --prompt-len {args.prompt_len} --completion-len {args.completion_len}`"
        update_results(args.results, SECTION, title, body)


if __name__ == "__main__":
    main()
