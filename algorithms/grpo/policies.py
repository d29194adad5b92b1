"""The policies GRPO accepts (as SB3's ``ppo/policies.py``: aliases of the shared ones)."""

from algorithms.common.policies import TransformerPolicy

__all__ = ["TransformerPolicy"]
