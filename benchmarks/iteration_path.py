"""Which modules one GRPO iteration runs through, in the order it enters them, with their line counts.

Runs one warm-up iteration of a tiny default GRPO (no cold start), then records every function call of the next
iteration (``sys.setprofile``) and lists the project's modules it entered, first entry first. The modules are
sorted into three kinds, the way Stable-Baselines3's PPO is read (``on_policy_algorithm.py`` and ``ppo.py``; its
policies, buffers, logger and env are other files a reader takes as given):

- the algorithm: the learning loop, the rollout, the advantages, the update and the loss;
- what the algorithm uses: the base class in SB3's ``BaseAlgorithm`` role (construction, run state, save and load, and
  the short steps every algorithm's ``learn`` shares around its own: setup, the guarded optimizer step, the logs), the
  policy and its sampler, the rollout's row containers and their returns (SB3's buffers), the env plumbing and the
  schedules (SB3's ``env_util`` and ``utils``), the runtime (processes, precision, determinism, seeds), the model's
  checks, saving;
- the env (``grpo_gym``): observations, rewards, tasks.

The base class's role straddles two of SB3's: its ``BaseAlgorithm`` part is taken as given, but the steps every
``learn`` shares (``collect_rollouts``, the guarded optimizer step, ``dump_logs``: SB3's ``OnPolicyAlgorithm`` has them)
are read too; the last line gives the lines of its functions the iteration ran, for a count that adds them.

    python benchmarks/iteration_path.py
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: modules of ``algorithms/`` a reader of the iteration takes as given (prefixes of their paths)
USED = (
    "algorithms/common/base_class.py",  # SB3's BaseAlgorithm role: construction, run state, save and load
    "algorithms/common/env_util.py",  # SB3's env_util and VecEnv plumbing
    "algorithms/common/schedules.py",  # SB3's schedules (in its utils)
    "algorithms/common/policies.py",
    "algorithms/common/generation/",
    "algorithms/common/model/",
    "algorithms/common/runtime/",
    "algorithms/common/saving/",
    "algorithms/common/rollout/rows.py",
    "algorithms/common/rollout/batch.py",
)


def kind(path: str) -> str:
    if path.startswith("grpo_gym/"):
        return "env"
    if path.startswith(USED):
        return "used"
    return "algorithm"


def entered_modules() -> dict[str, set[str]]:
    """The project's modules one iteration enters, first entry first, with the functions it ran in each."""
    import gymnasium as gym

    import grpo_gym  # noqa: F401  (registers R1Zero-v0)
    from algorithms import GRPO

    model = GRPO("TransformerPolicy", gym.make("R1Zero-v0"), n_groups=2, group_size=4, cold_start=False, seed=0)
    model.learn(8)  # one iteration: imports and first calls out of the way
    entered: dict[str, set[str]] = {}
    root = f"{ROOT}/"

    def record(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            entered.setdefault(frame.f_code.co_filename[len(root) :], set()).add(frame.f_code.co_name)

    sys.setprofile(record)
    try:
        model.learn(8, reset_num_timesteps=False)
    finally:
        sys.setprofile(None)
    return entered


def main() -> None:
    entered = entered_modules()
    totals: dict[str, tuple[int, int]] = {}
    print(f"{'lines':>5}  {'kind':9}  module (functions run)")
    for path, names in entered.items():
        lines = sum(1 for _ in open(ROOT / path, encoding="utf-8"))
        what = kind(path)
        count, total = totals.get(what, (0, 0))
        totals[what] = (count + 1, total + lines)
        print(f"{lines:5d}  {what:9}  {path} ({len(names)})")
    for what in ("algorithm", "used", "env"):
        count, total = totals.get(what, (0, 0))
        print(f"{what}: {count} modules, {total} lines")
    base = "algorithms/common/base_class.py"  # its role straddles: the lines of the functions the iteration ran there
    ran = function_lines(base, entered.get(base, set()))
    print(f"{base} (used): the functions the iteration ran there hold {ran} lines")


def function_lines(path: str, names: set[str]) -> int:
    """The lines of the functions (methods included, decorators and docstrings too) named ``names`` in ``path``."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name in names]
    return sum(node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1 for node in functions)


if __name__ == "__main__":
    main()
