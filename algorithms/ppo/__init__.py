"""PPO for language models (``LMPPO``): a per-token value head, token-level GAE, the KL to the reference as a
reward penalty. Named ``LMPPO`` so that it does not shadow Stable-Baselines3's ``PPO`` on import."""

from algorithms.ppo.ppo import LMPPO

__all__ = ["LMPPO"]
