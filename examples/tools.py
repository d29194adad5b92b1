"""Tools inside an episode: the model calls a Python function (``<tool_call>{...}</tool_call>``), reads its result
in the next turn, then answers. Your functions become tools from their signature and docstring; ``calculator`` is
built in (a safe arithmetic evaluator, never ``eval``).

Here one episode is played by hand, then the built-in tiny model learns to use the calculator with the ``tools``
preset's settings (``grpo-gym train --preset tools``): a cold start on gold tool episodes (1500 steps: the model
copies the call from about step 750), then GRPO (18 minutes on 2 CPU cores here, with the test suite running
beside it; 100% of 50 held-out problems at difficulty 0.5 after it)::

    python examples/tools.py
"""

import argparse

import gymnasium as gym

import grpo_gym  # noqa: F401
from algorithms import GRPO
from algorithms.cli_types import COUNT, STEPS
from algorithms.common.evaluation import evaluate_difficulties, format_table

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--cold-start-steps", type=STEPS, default=1500, help="SFT steps on gold tool episodes")
parser.add_argument("--iterations", type=COUNT, default=10)
parser.add_argument("--problems", type=COUNT, default=50, help="held-out problems")
args = parser.parse_args()


def population(city: str) -> int:
    """The population of a city.

    Args:
        city: the city's name, e.g. "Lyon"
    """
    return {"Paris": 2_100_000, "Lyon": 520_000}[city]


env = gym.make("R1Zero-v0", tools=["calculator", population], max_new_tokens=96, max_tool_calls=2)
obs, info = env.reset(seed=0)
problem = info["problem"]
print("problem:", problem.prompt)
call = '<tool_call>{"name": "population", "arguments": {"city": "Lyon"}}</tool_call>'  # any tool, any turn
obs, reward, terminated, truncated, info = env.step(env.unwrapped.encode_action(call))
print("the tool's result:", info["tool_calls"][0]["result"], "| episode over:", terminated)
answer = f"<think>the answer is {problem.answer}</think><answer>{problem.answer}</answer>"
obs, reward, terminated, truncated, info = env.step(env.unwrapped.encode_action(answer))
print("answer turn: episode over:", terminated, "| solved:", info["is_success"], "| reward", round(float(reward), 3))

env = gym.make("R1Zero-v0", tools=["calculator"], template="compact", max_new_tokens=112, context_length=512,
               difficulty=0.5, reward_weights={"syntax": 0.2, "consistency": 0.0, "task": 0.8})  # fmt: skip
cold_start = {"steps": args.cold_start_steps, "batch_size": 32, "learning_rate": 5e-4}
model = GRPO("TransformerPolicy", env, n_groups=8, group_size=8, learning_rate=2e-5, beta=0.0, ent_coef=0.0,
             cold_start_kwargs=cold_start, seed=0)  # fmt: skip
model.learn(total_timesteps=args.iterations * 8 * 8 * 2)  # timesteps count model turns: about two per episode
results = evaluate_difficulties(model.policy, model.get_env(), [0.5], args.problems, greedy=True)
print(format_table({"after training": results}))  # whole episodes: the call, the tool's result, the answer
