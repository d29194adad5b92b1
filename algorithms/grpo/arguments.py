"""GRPO's constructor arguments: the shared ones (:data:`~algorithms.common.lm_arguments.LM_ARGUMENTS`) with GRPO's own
inserted after ``group_size``, each declared once (default, rule, ``:param:`` text, annotation). ``GRPO``'s
written signature is checked against :data:`GRPO_ARGUMENTS`, and the ``:param:`` lines of its docstring are made
from it."""

from __future__ import annotations

import inspect

from algorithms.common.advantages import ADVANTAGE_SCALES
from algorithms.common.arguments import (
    MOST,
    MOST_STEPS,
    Argument,
    Retired,
    boolean,
    choice,
    integer,
    mapping,
    number,
    schedule,
    settings_argument,
)
from algorithms.common.lm_arguments import CURRICULUM, LM_ARGUMENTS, TURN_CACHE
from algorithms.common.losses import AGGREGATION_MODES, IMPORTANCE_LEVELS
from algorithms.common.replay.trajectory_buffer import PrioritizedTrajectoryBuffer
from algorithms.common.schedules import UpdateDecay
from algorithms.grpo import advantages, controls

#: ``ent_coef``'s default, the original design's: 0.01 decaying to 0.001 over 10,000 updates
ENT_COEF_DECAY = UpdateDecay(0.01, 0.001, 10_000)

#: the keys ``replay_buffer_kwargs`` may hold (``PrioritizedTrajectoryBuffer``'s arguments but those GRPO sets)
REPLAY_BUFFER_KEYS = tuple(
    name
    for name in inspect.signature(PrioritizedTrajectoryBuffer.__init__).parameters
    if name not in ("self", "pad_id", "seed")
)

#: what each model turn of a multi-turn episode trains on (a setting of GRPO's ``turn_kwargs``)
TURN_CREDIT = Argument(
    "episode", choice(*advantages.TURN_CREDITS),
    "what each model turn of a multi-turn episode trains on (tool calls, feedback; one-turn episodes are the "
    'same either way): ``"episode"`` (every turn gets its episode\'s advantage, from the discounted return '
    '``G_{i,0} = sum_t gamma^t r_{i,t}``) or ``"reward_to_go"`` (turn ``t`` gets '
    "``A_{i,t} = (G_{i,t} - mean_g G_{j,0}) / s_g``, its own discounted reward-to-go ``G_{i,t}`` against its "
    "group's episode-level baseline and scale: :func:`~algorithms.grpo.advantages.turn_advantages`); the value "
    "head's target follows", "str",
)  # fmt: skip

#: the original design's controls and the learnability prompt pool: the settings of ``controls_kwargs`` (GRPO holds
#: each as the attribute of its name)
CONTROLS = {
    "curriculum": CURRICULUM,
    "vf_coef": Argument(
        0.5, number(low=0.0),
        "the value baseline's (``advantage_baseline='value'``) weight of the value head's MSE to the episode "
        "return, when the policy has one "
        '(``policy_kwargs={"value_head": True}``, the FP32 value-network baseline)', "float",
    ),
    "competition": Argument(
        None, choice(None, "fixed", "adaptive"),
        'competition between groups: ``None`` (off), ``"fixed"`` (the competition coefficient: the winning '
        'group\'s advantages x ``competition_coef``, see :func:`~algorithms.grpo.controls.winning_groups`) or '
        '``"adaptive"`` (the coefficient follows the between-group reward variance, in [0.8, 1.5])', "str | None",
    ),
    "competition_coef": Argument(
        controls.COMPETITION_COEF, number(low=0.0, low_open=True), "the winning group's competition coefficient (1.2)",
        "float",
    ),
    "diversity_guard": Argument(
        False, boolean(),
        "the diversity guard: when the spread of per-group mean entropies exceeds ``diversity_threshold``, leave "
        "out the groups whose rewards carry no signal (all equal); logged as ``diversity/*``", "bool",
    ),
    "diversity_threshold": Argument(
        controls.DIVERSITY_SPREAD, number(low=0.0), "the diversity guard's entropy spread (0.15)", "float"
    ),
    "update_mode": Argument(
        "joint", choice("joint", "sequential"),
        '``"joint"`` (one step on all groups, as published) or ``"sequential"`` (one step per group, in turn)',
        "str",
    ),
    "reward_ramp": Argument(
        False, boolean(),
        "the reward ramp: the reward-model (consistency) weight starts at 0 and rises by 0.05 every 1000 timesteps "
        "up to the env's configured weight", "bool",
    ),
    "protected_rollouts": Argument(
        0, integer(low=0, high=MOST_STEPS),
        "the protected rollouts: the first rollouts are sampled by the frozen cold-start policy (the original design's "
        "\"first 3 groups\" read as the first 3 rollouts); the importance ratio corrects for it", "int",
    ),
    "diagnostics": Argument(
        False, boolean(),
        'per-group reward histograms, gradient norms and their spread, "group stability" and warnings; '
        "the update is then accumulated group by group (the same gradient)", "bool",
    ),
    "replay_ratio": Argument(
        0.0, number(low=0.0, high=1.0, high_open=True),
        "fraction of each update's completions replayed from a prioritized trajectory buffer (high-reward ones 3x as "
        "likely; "
        ":mod:`~algorithms.grpo.replay`): their sampling log-probs, their group's advantage times an importance "
        "weight; 0 (default) is published GRPO", "float",
    ),
    "max_replay_age": Argument(
        10, integer(low=0, high=MOST_STEPS),
        "completions collected more than this many iterations ago are evicted before sampling",
        "int",
    ),
    "replay_buffer_kwargs": Argument(
        None, mapping(REPLAY_BUFFER_KEYS), "arguments of the buffer (``capacity``, ``max_tokens``, ``alpha``, ...)",
        "dict[str, Any] | None",
    ),
    "prompt_sampling": Argument(
        "uniform", choice("uniform", "learnability"),
        '``"uniform"`` (the env\'s stream) or ``"learnability"``: ``fresh_prompt_fraction`` of each rollout\'s '
        "problems fresh, the rest from a pool of recent ones with probability ``p (1 - p) + 0.01`` "
        "(:class:`~algorithms.common.rollout.prompt_pool.LearnabilityPool`)", "str",
    ),
    "prompt_pool_size": Argument(256, integer(low=1, high=MOST), "the problems the learnability pool holds", "int"),
    "fresh_prompt_fraction": Argument(
        0.25, number(low=0.0, high=1.0),
        'the share of each rollout\'s problems drawn fresh under ``"learnability"``', "float",
    ),
}  # fmt: skip

GRPO_OWN = {
    "n_epochs": Argument(
        1, integer(low=1, high=MOST),
        "passes over each rollout (1: every update on-policy, as the published GRPO default)", "int",
    ),
    "batch_size": Argument(
        None, integer(low=1, high=MOST, allow_none=True),
        "completions per minibatch (``None``: the whole rollout, one update per epoch)", "int | None",
    ),
    "clip_range": Argument(
        0.2, schedule(low=0.0),
        "the lower clip epsilon of the importance ratio (0.2), constant or schedule; the token ratio's, or with "
        "``importance_level='sequence'`` the sequence ratio's (as TRL's ``epsilon``: GSPO uses 3e-4)",
        "float | Schedule",
    ),
    "clip_range_high": Argument(
        None, schedule(low=0.0, allow_none=True),
        "the upper clip epsilon (``None``: same as ``clip_range``; DAPO's clip-higher: 0.28; GSPO: 4e-4)",
        "float | Schedule | None",
    ),
    "beta": Argument(
        0.04, number(low=0.0),
        "weight of the k3 KL penalty to the reference (DeepSeekMath: 0.04; TRL: 0): a frozen copy of the policy "
        "after the cold start, built only when ``beta > 0``; with LoRA the base model (adapters disabled)", "float",
    ),
    "ent_coef": Argument(
        ENT_COEF_DECAY, schedule(updates=True),
        "entropy bonus weight: a float, an SB3 schedule, or an :class:`UpdateDecay` (default, the original design's: "
        "0.01 decaying to 0.001 over 10,000 updates)", "float | Schedule | UpdateDecay",
    ),
    "advantage_scale": Argument(
        "group", choice(*ADVANTAGE_SCALES),
        '``"group"`` (divide by the group std: GRPO), ``"batch"`` (by the rollout std) or ``"none"`` (Dr. GRPO)',
        "str",
    ),
    "loss_aggregation": Argument(
        "sequence", choice(*AGGREGATION_MODES),
        '``"sequence"`` (GRPO paper), ``"token"`` (DAPO) or ``"constant"`` (Dr. GRPO)', "str",
    ),
    "importance_level": Argument(
        "token", choice(*IMPORTANCE_LEVELS),
        '``"token"`` (GRPO: a ratio per token) or ``"sequence"`` (GSPO, Zheng et al. 2025: the length-normalised '
        "sequence ratio ``exp(mean_t(log pi - log pi_old))`` at every token, clipped by ``clip_range`` and "
        "``clip_range_high``: pass the paper's 3e-4 and 4e-4, as with TRL)", "str",
    ),
    "dynamic_sampling": Argument(
        False, boolean(),
        "DAPO's dynamic sampling: groups whose rewards are all equal are left out of the update, after up to "
        "``max_resample_rounds`` rounds that replace them by groups of new problems (0: left out, none "
        "replaced); refilling needs ``group_size`` to be a multiple of the number of envs "
        "(:mod:`~algorithms.grpo.sampling`)", "bool",
    ),
    "max_resample_rounds": Argument(
        3, integer(low=0, high=MOST),
        "the most refill rounds per rollout (their completions count in ``num_timesteps``; 0: uniform groups are "
        "left out, none replaced)", "int",
    ),
    "mask_truncated": Argument(
        False, boolean(),
        "leave completions cut at ``max_new_tokens`` without EOS out of the loss (DAPO's overlong filtering); they "
        "still count in their group's advantages", "bool",
    ),
    "advantage_baseline": Argument(
        "group", choice("group", "value", "leave_one_out"),
        '``"group"`` (the group\'s mean reward, GRPO), ``"value"`` (the value head\'s estimate for the prompt; '
        'needs ``policy_kwargs={"value_head": True}``) or ``"leave_one_out"`` (RLOO)', "str",
    ),
    "controls_kwargs": settings_argument(
        "the original design's controls", CONTROLS, None,
        " (each off by default; the ``seed`` preset turns them on together; the project's ablation finds none "
        "helps at the budgets measured)",
    ),
}  # fmt: skip


def _sequence_clip(key: str) -> Retired:
    """``sequence_clip_range`` or ``sequence_clip_range_high``: ``clip_range``'s or ``clip_range_high``'s value when
    the ratio was the sequence's."""
    return Retired(
        f"{key}=... with importance_level='sequence' (one clip range for either ratio, as TRL's epsilon)",
        lambda value, values: {key: value} if values.get("importance_level") == "sequence" else {},
    )


#: arguments of earlier versions that others now cover: the constructor's error says what to pass; a file saved by
#: an earlier version loads as the values they stood for
GRPO_RETIRED = {
    "drop_uniform_groups": Retired(
        "dynamic_sampling=True with max_resample_rounds=0 (uniform groups left out, none replaced)",
        lambda value, values: (
            {"dynamic_sampling": True, "max_resample_rounds": 0} if value and not values.get("dynamic_sampling") else {}
        ),
    ),
    "sequence_clip_range": _sequence_clip("clip_range"),
    "sequence_clip_range_high": _sequence_clip("clip_range_high"),
}


#: GRPO's constructor arguments, in the signature's order
GRPO_ARGUMENTS = LM_ARGUMENTS.extended(
    "group_size",
    GRPO_OWN,
    GRPO_RETIRED,
    n_groups={"doc": "K, problems per rollout (4: the original design's K groups)"},
    group_size={
        "rule": integer(low=2, high=MOST),
        "doc": "G, completions per problem (8; at least 2: a group of one has no group-relative advantage)",
    },
    tensorboard_log={"doc": "the TensorBoard folder (runs go to ``<folder>/GRPO_<n>``)"},
    turn_kwargs=settings_argument(
        "multi-turn episodes",
        {"cache": TURN_CACHE, "credit": TURN_CREDIT},
        {"cache": "turn_cache", "credit": "turn_credit"},
    ),
)
