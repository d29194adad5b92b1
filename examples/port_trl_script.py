"""A TRL ``GRPOTrainer`` script, ported: the same dataset, reward functions and ``GRPOConfig`` values, through
``GRPO.from_trl``. TRL's names are translated (``num_generations`` -> ``group_size``, ...); every value that differs
from what TRL would use is said when the model is built.

TRL::

    trainer = GRPOTrainer(model, reward_funcs=[accuracy, think_format], args=GRPOConfig(...), train_dataset=dataset)
    trainer.train()

grpo-gym (this script)::

    python examples/port_trl_script.py --model tiny   # or your folder / hub id / .gguf
"""

import argparse

from datasets import Dataset

from algorithms import GRPO
from algorithms.cli_types import COUNT, STEPS

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--model", default="tiny", help="TRL's model argument: a folder, a hub id, a .gguf, or tiny")
parser.add_argument("--cold-start-steps", type=STEPS, default=100, help="for the built-in tiny model (it starts blank)")
parser.add_argument("--iterations", type=COUNT, default=10)
args = parser.parse_args()

SYSTEM = "Think in <think> </think>, then answer in <answer> </answer>."
dataset = Dataset.from_list(
    [
        {
            "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {a} + {b}?"}],
            "solution": str(a + b),
        }
        for a in range(10)
        for b in range(10)
    ]
)


def accuracy(completions, solution, **kwargs):  # conversational: each completion is [{"role": "assistant", ...}]
    pairs = zip(completions, solution, strict=True)
    return [float(c[0]["content"].endswith(f"<answer>{s}</answer>")) for c, s in pairs]


def think_format(completions, **kwargs):
    return [float(c[0]["content"].startswith("<think>") and "</think><answer>" in c[0]["content"]) for c in completions]


model = GRPO.from_trl(
    args.model,
    [accuracy, think_format],
    args={"num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 32, "learning_rate": 5e-5},
    train_dataset=dataset,
    cold_start_kwargs={"steps": args.cold_start_steps},  # GRPO's own arguments go after TRL's
    seed=0,
)
model.learn(total_timesteps=args.iterations * 8)  # trainer.train(); timesteps count completions
model.save("from_trl.zip")
print("trained", model.num_timesteps, "completions; saved to from_trl.zip")
