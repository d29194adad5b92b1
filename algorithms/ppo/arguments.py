"""LMPPO's constructor arguments: the shared ones (:data:`~algorithms.common.lm_arguments.LM_ARGUMENTS`) with LMPPO's
own inserted after ``group_size`` and its defaults for the shared ``n_groups``, ``group_size`` and ``gamma``, each
declared once. ``LMPPO``'s written signature is checked against :data:`LMPPO_ARGUMENTS`, and the ``:param:`` lines
of its docstring are made from it."""

from __future__ import annotations

from algorithms.common.arguments import Argument, boolean, choice, integer, number, schedule
from algorithms.common.lm_arguments import CURRICULUM, LM_ARGUMENTS

#: where the KL to the reference goes: a per-token reward penalty (InstructGPT) or a k3 term in the loss (GRPO's)
KL_PLACEMENTS = ("reward", "loss")

LMPPO_OWN = {
    "curriculum": CURRICULUM,
    "n_epochs": Argument(4, integer(low=1), "passes over each rollout (TRL's ``ppo_epochs``: 4)", "int"),
    "batch_size": Argument(
        None, integer(low=1, allow_none=True),
        "completions per minibatch (``None``: the whole rollout, one step per epoch)", "int | None",
    ),
    "clip_range": Argument(
        0.2, schedule(low=0.0), "the importance ratio's clip epsilon (0.2), constant or schedule", "float | Schedule"
    ),
    "clip_range_vf": Argument(
        0.2, schedule(low=0.0, allow_none=True),
        "the value clip around the sampling-time estimate (TRL's ``cliprange_value``: 0.2), constant or schedule; "
        "``None`` (SB3's default) for an unclipped value loss", "float | Schedule | None",
    ),
    "ent_coef": Argument(
        0.0, schedule(), "entropy bonus weight, constant or schedule (0: none, as TRL's PPO)", "float | Schedule"
    ),
    "vf_coef": Argument(
        0.1, number(low=0.0),
        "weight of the value loss ``0.5 * mean max((V - R)^2, (V_clip - R)^2)`` (TRL: 0.1; the value head shares "
        "the policy's network, so a large weight pulls the policy with it)", "float",
    ),
    "gae_lambda": Argument(0.95, number(low=0.0, high=1.0), "GAE's lambda (TRL: 0.95)", "float"),
    "normalize_advantage": Argument(
        True, boolean(), "whiten the advantages over the rollout's tokens (SB3's name; TRL whitens too)", "bool"
    ),
    "kl_coef": Argument(
        0.05, number(low=0.0),
        "weight of the KL to the frozen reference (TRL: 0.05); the reference (a copy of the policy after the cold "
        "start; with LoRA the base model) is only kept when ``kl_coef > 0``", "float",
    ),
    "kl_placement": Argument(
        "reward", choice(*KL_PLACEMENTS),
        '``"reward"`` (a per-token reward penalty with the k1 estimate, InstructGPT) or ``"loss"`` (GRPO\'s k3 term '
        "in the loss, weighted by ``kl_coef``)", "str",
    ),
    "target_kl": Argument(
        None, number(low=0.0, low_open=True, allow_none=True),
        "stop the rollout's update when a minibatch's approximate KL to the sampling policy exceeds "
        "``1.5 * target_kl`` (SB3's rule); ``None``: never", "float | None",
    ),
}  # fmt: skip

#: LMPPO's constructor arguments, in the signature's order
LMPPO_ARGUMENTS = LM_ARGUMENTS.extended(
    "group_size",
    LMPPO_OWN,
    n_groups={"default": 32},
    group_size={
        "default": 1,
        "doc": "completions per prompt (1: one per prompt, the usual PPO; more samples a prompt several times)",
    },
    gamma={"default": 1.0, "doc": "discount per token and per turn of a multi-turn episode (1.0: the usual for LMs)"},
    tensorboard_log={"doc": "the TensorBoard folder (runs go to ``<folder>/LMPPO_<n>``)"},
    policy_kwargs={"doc": ":class:`TransformerPolicy` arguments (``model``, ``temperature``, …); ``value_head`` is "
                   "always on"},
)  # fmt: skip
