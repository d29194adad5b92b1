"""Plot a GRPO run's learning curve from its TensorBoard events (needs matplotlib: the `bench` extra).

python benchmarks/plot_curve.py runs/GRPO_1 --out benchmarks/demo_curve.png
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TAGS = {"rollout/success_rate": "training success rate (last 100 episodes)", "rollout/ep_rew_mean": "mean reward"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a TensorBoard run folder, e.g. runs/GRPO_1")
    parser.add_argument("--out", default="curve.png")
    parser.add_argument("--title", default="grpo-gym demo: GRPO after the cold start")
    args = parser.parse_args()
    events = EventAccumulator(args.run, size_guidance={"scalars": 0}).Reload()
    figure, axis = plt.subplots(figsize=(7, 4))
    for tag, label in TAGS.items():
        points = events.Scalars(tag)
        axis.plot([p.step for p in points], [p.value for p in points], label=label)
    axis.set_xlabel("completions (num_timesteps)")
    axis.set_ylim(0, 1)
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right")
    axis.set_title(args.title)
    figure.tight_layout()
    figure.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
