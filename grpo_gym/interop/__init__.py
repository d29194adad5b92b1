"""Other environment standards, both ways: train on their environments, serve ours to their trainers.

- :mod:`grpo_gym.interop.openenv`: an OpenEnv server's sessions as envs GRPO trains on (``pip install
  'grpo-gym[openenv]'``); :mod:`grpo_gym.interop.openenv_server`: ``R1Zero-v0`` served as an OpenEnv environment
  (``grpo-gym openenv-serve``), with its action, observation and client in :mod:`grpo_gym.interop.openenv_models`.
- :mod:`grpo_gym.interop.gem`: GEM environments as envs GRPO trains on, and ``R1Zero-v0`` in GEM's registry as
  ``"grpo_gym:R1Zero-v0"`` (``pip install 'grpo-gym[gem]'``).
- :mod:`grpo_gym.interop.r1zero_text`: ``R1Zero-v0`` played with text, what both servings share;
  :mod:`grpo_gym.interop.mcp`: MCP tools that run elsewhere, in our tool loop;
  :mod:`grpo_gym.interop.vec_env`: a VecEnv that steps its envs at once (remote sessions).

Importing this package imports neither openenv-core nor GEM; each module imports its own.
"""
