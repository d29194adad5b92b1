"""REINFORCE with a leave-one-out baseline (``RLOO``), built on the shared loop and update step."""

from algorithms.rloo.rloo import RLOO

__all__ = ["RLOO"]
