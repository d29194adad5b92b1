"""Resume after a crash: a ``grpo-gym train`` run killed mid-training (SIGKILL: what an out-of-memory kill or a lost
machine does) continues from its newest checkpoint with ``--resume``, to the same total, and ends with the same
weights as a run that was never stopped (bit for bit on a CPU).

    python examples/resume_after_crash.py
"""

import argparse
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from algorithms.cli_types import STEPS, Integer

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument(
    "--iterations", type=Integer(low=3), default=8, help="at least 3: the run is killed after its second checkpoint"
)
parser.add_argument("--cold-start-steps", type=STEPS, default=50)
args = parser.parse_args()

completions = args.iterations * 4 * 8  # the preset below: 4 problems x 8 completions per iteration
train = [  # grpo-gym train, as this Python runs it
    sys.executable, "-m", "algorithms.cli", "train", "--preset", "demo", "--no-progress-bar",
    "-n", str(completions), "--checkpoint-every", "1",
    "-params", "n_groups:4", "group_size:8", f'cold_start_kwargs:{{"steps": {args.cold_start_steps}}}',
    "eval_problems:16",
]  # fmt: skip

# 1. the run that crashes: killed once its second checkpoint is written
run = subprocess.Popen([*train, "--save-path", "crashed.zip"], stdout=subprocess.DEVNULL)
checkpoints = Path("crashed_checkpoints")
while run.poll() is None and len(list(checkpoints.glob("iteration_*/run.json"))) < 2:
    time.sleep(0.2)
run.kill()
run.wait()
newest = sorted(checkpoints.glob("iteration_*"))[-1].name if checkpoints.is_dir() else None
print(f"killed the run (exit {run.returncode}); newest checkpoint: {newest}")

# 2. the same command with --resume: on from that checkpoint to the same total
subprocess.run([*train, "--save-path", "crashed.zip", "--resume"], check=True, stdout=subprocess.DEVNULL)
print("resumed and finished: crashed.zip")

# 3. the run that never stopped, for comparison
subprocess.run([*train, "--save-path", "uninterrupted.zip"], check=True, stdout=subprocess.DEVNULL)


def weights(path: str) -> bytes:
    with zipfile.ZipFile(path) as archive:
        return archive.read("policy.pth")


print("same weights as the uninterrupted run:", weights("crashed.zip") == weights("uninterrupted.zip"))
