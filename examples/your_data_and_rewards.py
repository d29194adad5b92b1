"""Your dataset and your reward functions: problems from a JSONL file, two reward functions with TRL's signature
beside the env's own, the built-in tiny model trained on them.

Each row needs ``prompt`` and ``answer`` (``solution``, a worked answer, feeds the cold start). A reward function
takes the prompts and completions (and any column of the rows, by name) and returns one float per completion, or
``None`` where it has no opinion::

    python examples/your_data_and_rewards.py --rows rows.jsonl   # writes a small file first when it is missing
"""

import argparse
import json
from pathlib import Path

import gymnasium as gym

import grpo_gym  # noqa: F401
from algorithms import GRPO
from algorithms.cli_types import COUNT, STEPS

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--rows", default="rows.jsonl", help="a JSONL file of {prompt, answer, solution} rows")
parser.add_argument("--cold-start-steps", type=STEPS, default=200)
parser.add_argument("--iterations", type=COUNT, default=20)
args = parser.parse_args()

if not Path(args.rows).exists():  # a small file to start from: "What is a times 3?"
    with open(args.rows, "w", encoding="utf-8") as file:
        for a in range(200):
            file.write(json.dumps({"prompt": f"What is {a} times 3?", "answer": 3 * a, "solution": f"{a}*3={3 * a}"}))
            file.write("\n")


def answer_tags(prompts, completions, **kwargs):
    """1 when the completion closes its answer, else 0."""
    return [1.0 if "<answer>" in c and c.rstrip().endswith("</answer>") else 0.0 for c in completions]


def exact(prompts, completions, answer, **kwargs):
    """1 for the row's answer inside the tags, 0 for another, None (no opinion) without tags."""
    scores = []
    for completion, gold in zip(completions, answer, strict=True):
        inside = completion.partition("<answer>")[2].partition("</answer>")[0]
        scores.append(None if not inside else float(inside.strip() == str(gold)))
    return scores


env = gym.make(
    "R1Zero-v0",
    task="jsonl",
    task_kwargs={"path": args.rows},
    template="compact",
    max_new_tokens=32,
    reward_funcs=[answer_tags, exact],
    reward_weights={"answer_tags": 0.5, "exact": 1.0},
)
obs, info = env.reset(seed=0)
problem = info["problem"]  # a row of the file: its prompt, answer and solution
right = f"<think>{problem.solution}</think><answer>{problem.answer}</answer>"
obs, reward, *_, info = env.step(env.unwrapped.encode_action(right))
print("problem:", problem.prompt, "| a right completion:", right)
print("its scores:", {name: round(value, 3) for name, value in info["reward_components"].items()})

model = GRPO("TransformerPolicy", env, n_groups=4, group_size=8, cold_start_kwargs={"steps": args.cold_start_steps})
model.learn(total_timesteps=args.iterations * 4 * 8)
print(f"mean reward of the last rollouts: {sum(e['r'] for e in model.ep_info_buffer) / len(model.ep_info_buffer):.3f}")
model.save("your_data.zip")
