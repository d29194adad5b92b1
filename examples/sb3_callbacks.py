"""GRPO as an SB3 algorithm: SB3's own ``EvalCallback`` and ``CheckpointCallback`` during training, a ``Monitor``ed
eval env, ``evaluate_policy`` and ``predict`` after it, TensorBoard logs in ``runs/``::

    python examples/sb3_callbacks.py
    tensorboard --logdir runs
"""

import argparse

import gymnasium as gym
from stable_baselines3.common.callbacks import CheckpointCallback, EvalCallback
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor

import grpo_gym  # noqa: F401
from algorithms import GRPO
from algorithms.cli_types import COUNT, STEPS

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--cold-start-steps", type=STEPS, default=200)
parser.add_argument("--iterations", type=COUNT, default=20)
args = parser.parse_args()

env = gym.make("R1Zero-v0", template="compact", max_new_tokens=32)
eval_env = Monitor(gym.make("R1Zero-v0", template="compact", max_new_tokens=32))  # SB3's episode statistics
model = GRPO(
    "TransformerPolicy",
    env,
    n_groups=4,
    group_size=8,
    cold_start_kwargs={"steps": args.cold_start_steps},
    tensorboard_log="runs",
    seed=0,
)
callbacks = [
    EvalCallback(eval_env, eval_freq=5 * 32, n_eval_episodes=16, best_model_save_path="best"),  # every 5 iterations
    CheckpointCallback(save_freq=10 * 32, save_path="checkpoints"),
]
model.learn(total_timesteps=args.iterations * 32, callback=callbacks, progress_bar=False)
mean_reward, std_reward = evaluate_policy(model, eval_env, n_eval_episodes=16)
print(f"evaluate_policy: mean reward {mean_reward:.3f} +/- {std_reward:.3f} over 16 episodes")
obs, info = eval_env.reset(seed=0)
action, _ = model.predict(obs, deterministic=True)  # one completion's token ids
print("problem:", info["problem"].prompt)
print("greedy completion:", eval_env.unwrapped.decode_action(action))
