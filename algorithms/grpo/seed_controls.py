"""The seed's controls as steps of GRPO's batch building and update (S9-S12, S24): what each computes is a pure
function of :mod:`~algorithms.grpo.advantages` / :mod:`~algorithms.grpo.controls`; these methods gather it across
processes and log it. :class:`SeedControls` is a mixin of :class:`~algorithms.grpo.grpo.GRPO`."""

from __future__ import annotations

import warnings

import torch as th

from algorithms.common.rollout.rows import Rows
from algorithms.grpo import advantages, controls, update


class SeedControls:
    """The value baseline, group competition, diversity guard and per-group gradient logs of GRPO."""

    def _value_baseline(self, rows: Rows) -> th.Tensor:
        """S9: ``(K, G)`` the value head's estimate of each episode's first prompt (a group shares its prompt)."""
        baseline = self._dist.gather(advantages.value_baseline(self.policy, rows, self.group_size))  # (K, G)
        self.logger.record("train/value_baseline", baseline.mean().item())
        return baseline

    def _competition_scale(self, returns: th.Tensor) -> th.Tensor:
        """S10/S11: ``(K,)`` multipliers of the groups' advantages (the winning group's x the coefficient)."""
        result = advantages.competition(returns, self.competition, self.competition_coef, self._between_variance)
        self._between_variance = result.between_variance
        self.logger.record("train/competition_coef", result.coef)
        self.logger.record("train/winning_groups", int((result.scale != 1).sum()))
        return result.scale

    def _diversity_guard(self, returns: th.Tensor, rows: Rows) -> th.Tensor:
        """S12: ``(K,)`` groups to leave out: the signal-free ones, when the per-group entropy spread is too wide."""
        entropies = self._dist.gather(advantages.group_entropies(rows, self.group_size, self._local_groups))  # (K,)
        dropped, spread = advantages.diversity_left_out(entropies, returns, self.diversity_threshold)
        self.logger.record("diversity/entropy_spread", spread)
        self.logger.record("diversity/triggered", float(spread > self.diversity_threshold))
        self.logger.record("diversity/dropped_groups", int(dropped.sum()))
        return dropped

    def _log_group_gradients(self, groups: update.GroupDiagnostics) -> None:
        """S24: per-group gradient norms, their spread (warning above 0.3) and the groups' agreement."""
        self.logger.record("groups/grad_norm_mean", float(groups.norms.mean()))
        self.logger.record("groups/grad_norm_spread", groups.spread)
        self.logger.record("groups/stability", groups.stability)
        if groups.spread > controls.GRAD_SPREAD_WARNING:
            warnings.warn(
                f"per-group gradient-norm spread {groups.spread:.2f} > {controls.GRAD_SPREAD_WARNING} (S24)",
                stacklevel=4,
            )
