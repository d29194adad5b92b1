"""The arguments every :class:`~algorithms.common.base_class.LMBaseAlgorithm` takes (:data:`LM_ARGUMENTS`), declared
once with their defaults, rules and ``:param:`` texts; GRPO and LMPPO add their own
(``algorithms/grpo/arguments.py``, ``algorithms/ppo/arguments.py``). The machinery that holds a written
signature to its table, writes the docstring and checks the values is :mod:`algorithms.common.arguments`."""

from __future__ import annotations

import inspect
from typing import Any

from algorithms.common.arguments import (
    MOST,
    MOST_RATE,
    MOST_STEPS,
    MOST_VERSIONS,
    Argument,
    Arguments,
    boolean,
    choice,
    integer,
    mapping,
    number,
    optional_path,
    schedule,
    settings_argument,
)
from algorithms.common.collapse_guard import GuardSettings
from algorithms.common.generation.engines.arguments import ENGINE_ATTRIBUTES, ENGINE_SETTINGS, ROLLOUT_ENGINE
from algorithms.common.policies import TransformerPolicy
from algorithms.common.runtime.distributed import COMPRESSIONS
from algorithms.common.runtime.parallel import SHARDINGS
from algorithms.common.runtime.precision import check_precision
from algorithms.common.sampler_correction import SAMPLER_CORRECTIONS
from grpo_gym.validation import ArgumentError


def check_collapse_guard(name: str, value: Any) -> Any:
    """``"auto"``, ``True``, ``False``/``None`` or a dict of :class:`~algorithms.common.collapse_guard.GuardSettings`
    fields."""
    try:
        GuardSettings.parse(value)
    except (TypeError, ValueError) as error:
        raise ArgumentError(str(error)) from None
    return value


#: the keys ``policy_kwargs`` may hold: TransformerPolicy's arguments but those the algorithm passes itself
POLICY_KEYS = tuple(
    name
    for name in inspect.signature(TransformerPolicy.__init__).parameters
    if name not in ("self", "observation_space", "action_space", "lr_schedule")
)

_MIXED_PRECISION = (
    '``"auto"`` (float32 on a CPU, bf16 on a GPU that has it, else fp16), ``"bf16"``, ``"fp16"``, ``"no"`` '
    '(float32) or a dict of stages (``"sampling"``, ``"update"``, ``"sft"``) to those: forward passes under '
    "autocast, weights, optimizer and loss in float32 (:mod:`~algorithms.common.runtime.precision`; the choice is "
    "in ``model.precision``); a step with non-finite gradients is skipped and counted"
)
_SAMPLER_CORRECTION = (
    'the sampler/trainer mismatch correction (:mod:`~algorithms.common.sampler_correction`): ``"tis"`` (truncated '
    "importance sampling: the ratio taken against the update's own log-probs of the fresh rollout, each token's "
    'loss weighted by ``min(pi_old / pi_sampler, cap)``), ``"mask"`` (each sequence weighted by its whole ratio, '
    "one whose ratio exceeds ``cap`` left out: TRL's ``sequence_mask``), ``None`` (off: the ratio against the "
    'sampler\'s log-probs) or ``"auto"`` (``"tis"`` when sampling and update run in different precisions or the '
    'rollouts run on an external engine, ``rollout_engine="hf"`` or ``"vllm"``). The mismatch is logged every '
    'update as ``train/sampler_kl``; ``"auto"`` is ``"tis"`` too with ``max_staleness >= 1`` (older weights sample), '
    "the share of tokens whose weight the cap truncated logged as ``train/sampler_clipped_fraction``"
)
_MAX_STALENESS = (
    "TRL's name: 0 (the default) samples each rollout, then updates on it; ``k >= 1`` samples the first turns of "
    "rollout ``i`` on a producer thread with the weights of version ``max(0, i - k)`` (a fixed schedule: "
    "reproducible, resumed exactly) while the update runs on rollout ``i - 1``, each side on half of torch's threads "
    "(:mod:`~algorithms.common.rollout.staleness`); ``sampler_correction`` corrects the staleness, logged as "
    "``rollout/staleness`` and ``rollout/staleness_max``. A producer that fails or gives no answer within "
    "``distributed_kwargs['timeout']`` seconds ends ``learn()`` with an error naming it"
)
_COLLAPSE_GUARD = (
    'watch the run\'s success and step back when it falls (:mod:`~algorithms.common.collapse_guard`): ``"auto"`` '
    "(on for a model from a folder or hub name on a task with held-out problems, off for the built-in model and "
    "with ``max_staleness >= 1``), "
    "``True`` (its "
    "defaults: every 5 iterations the greedy success on 16 fixed held-out problems; two checks in a row more than "
    "0.1 below its best restore the best weights and optimizer state and halve the learning rate), a dict of its "
    'settings (``margin``, ``patience``, ``window``, ``lr_factor``, ``max_restores``, ``monitor``: ``"held_out"``, '
    '``"rollout"`` or ``"eval"`` (an ``EvalCallback`` given to ``learn()``), ``eval_problems``, ``eval_every``), or '
    "``False``/``None`` (off)"
)
_SHARDING = (
    'with several processes: ``None`` (each holds a whole replica, DDP) or ``"fsdp"`` (FSDP2: the weights, '
    "gradients, optimizer state and reference sharded over the processes; the same weights trained, see "
    ':mod:`~algorithms.common.runtime.parallel`); on one process ``"fsdp"`` trains unsharded'
)

#: whether later turns run from the KV cache of the turn before (a setting of ``turn_kwargs``)
TURN_CACHE = Argument(
    "auto", choice(True, False, "auto"),
    "keep each turn's KV cache for the next turn of multi-turn episodes (tool calls, feedback): a later turn then "
    "runs only the tokens the env added, and a row whose window dropped old tokens is prefilled afresh "
    "(:mod:`~algorithms.common.generation.continuation`; the builtin sampler only: other engines prefill each "
    'turn). ``"auto"``: when the env may play several turns (``max_turns > 1`` or ``tools``)',
)  # fmt: skip

#: the dynamic curriculum (LMPPO's argument, a setting of GRPO's ``controls_kwargs``)
CURRICULUM = Argument(
    False, boolean(),
    "the dynamic curriculum: a :class:`~algorithms.common.callbacks.CurriculumCallback` sets the difficulty of every "
    "env from the rolling success rate (``curriculum/difficulty``)", "bool",
)  # fmt: skip

#: the arguments that say how a run samples, not what it learns: ``--resume`` may change them
ENGINE_ARGUMENTS = ("rollout_engine", "rollout_engine_kwargs")

#: the arguments every :class:`~algorithms.common.base_class.LMBaseAlgorithm` takes; an algorithm inserts its own
#: after ``group_size`` (:meth:`Arguments.extended`)
LM_ARGUMENTS = Arguments(
    {
        "learning_rate": Argument(
            1e-5, schedule(low=0.0, high=MOST_RATE),
            "learning rate, constant or an SB3 schedule of the remaining progress",
            "float | Schedule",
        ),
        "n_groups": Argument(4, integer(low=1, high=MOST), "K, problems (prompts) per rollout", "int"),
        "group_size": Argument(8, integer(low=1, high=MOST), "G, completions per problem", "int"),
        "max_grad_norm": Argument(
            0.5, number(low=0.0, low_open=True), "global gradient-norm clip (the original design's 0.5)", "float"
        ),
        "gamma": Argument(
            0.99, number(low=0.0, high=1.0, low_open=True),
            "discount over the turns of a multi-turn episode (the original design's 0.99 for generation, 0.95 for "
            "dialogue)",
            "float",
        ),
        "sharding": Argument(None, choice(*SHARDINGS), _SHARDING, "str | None"),
        "distributed_kwargs": settings_argument(
            "several processes",
            {
                "gradient_compression": Argument(
                    None, choice(*COMPRESSIONS),
                    '(:mod:`~algorithms.common.runtime.distributed`) ``None``, ``"fp16"``, ``"bf16"`` or '
                    '``"powersgd"`` (PyTorch\'s DDP communication hooks)',
                ),
                "timeout": Argument(
                    300.0, number(low=0.0, low_open=True),
                    "seconds a rank waits for the others (and, with ``max_staleness``, the update for the rollout "
                    "producer) before the job fails: a hung rank or producer ends the job",
                ),
            },
            {"gradient_compression": "gradient_compression", "timeout": "dist_timeout"},
            " (``torchrun``; one process ignores them)",
        ),
        "mixed_precision": Argument("auto", check_precision, _MIXED_PRECISION, "str | dict[str, str]"),
        "sampler_correction": Argument("auto", choice(*SAMPLER_CORRECTIONS), _SAMPLER_CORRECTION, "str | None"),
        "sampler_correction_cap": Argument(
            2.0, number(low=1.0),
            "the ``cap`` of the correction: TIS's largest weight (TRL's and verl's 2), the mask's largest kept "
            "sequence ratio", "float",
        ),
        "max_staleness": Argument(0, integer(low=0, high=MOST_VERSIONS), _MAX_STALENESS, "int"),
        "turn_kwargs": settings_argument("multi-turn episodes", {"cache": TURN_CACHE}, {"cache": "turn_cache"}),
        "rollout_engine": Argument(*ROLLOUT_ENGINE),
        "rollout_engine_kwargs": settings_argument(
            "the rollout engine", {key: Argument(*fields) for key, fields in ENGINE_SETTINGS.items()},
            ENGINE_ATTRIBUTES, " (vLLM's: TRL's ``vllm_<key>``; ``--resume`` may change them)",
        ),
        "cold_start": Argument(
            "auto", choice(True, False, "auto"),
            'run the SFT stage before the first iteration: ``"auto"`` (only for a freshly initialised built-in '
            "model), ``True`` or ``False``", "bool | str",
        ),
        "cold_start_kwargs": settings_argument(
            "the cold start",
            {
                "steps": Argument(300, integer(low=0, high=MOST_STEPS), "SFT gradient steps", "int"),
                "batch_size": Argument(
                    32, integer(low=1, high=MOST),
                    "examples per SFT step (the task's gold: that many model turns; with tools, whole episodes "
                    "holding them)", "int",
                ),
                "learning_rate": Argument(1e-3, number(low=0.0, low_open=True, high=MOST_RATE), "SFT learning rate"),
                "data": Argument(
                    None, optional_path(existing_file="a JSONL file of prompt/response rows"),
                    'a JSONL file of ``{"prompt", "response"}`` rows to use instead of the task\'s gold solutions',
                ),
            },
            {"steps": "sft_steps", "batch_size": "sft_batch_size", "learning_rate": "sft_learning_rate",
             "data": "sft_data"},
            " (its SFT stage on the task's gold solutions)",
        ),
        "collapse_guard": Argument("auto", check_collapse_guard, _COLLAPSE_GUARD, "str | bool | dict[str, Any] | None"),
        "stats_window_size": Argument(
            100, integer(low=1, high=MOST),
            "episodes averaged in ``rollout/ep_rew_mean`` and ``rollout/success_rate``", "int",
        ),
        "tensorboard_log": Argument(
            None, optional_path(), "the TensorBoard folder (runs go to ``<folder>/<algorithm>_<n>``)", "str | None"
        ),
        "policy_kwargs": Argument(
            None, mapping(POLICY_KEYS),
            ":class:`TransformerPolicy` arguments (``model``, ``temperature``, ``top_p``, …)",
            "dict[str, Any] | None",
        ),
        "verbose": Argument(0, integer(low=0, high=2), "0 silent, 1 progress and logs", "int"),
        "seed": Argument(
            None, integer(low=0, allow_none=True),
            "seeds the model's initialisation, the sampler, the problems and the minibatch order", "int | None",
        ),
        "device": Argument(
            "auto", lambda name, value: value, '``"auto"``, ``"cpu"`` or ``"cuda"``', "th.device | str", saved=False
        ),
    }
)  # fmt: skip
