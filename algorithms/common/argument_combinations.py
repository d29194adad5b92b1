"""What two arguments mean together (:func:`check_combinations`, which :meth:`Arguments.check
<algorithms.common.arguments.Arguments.check>` runs on every constructor's values, a loaded file's with load's
overrides in): a setting of an optional part given while the part is off warns, naming the switch and both fixes; so
does a GSPO clip range that rarely clips; a combination that cannot run is refused, naming the fix."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

from algorithms.common.generation.engines.arguments import ENGINE_ATTRIBUTES
from grpo_gym.validation import ArgumentError, user_stacklevel


def _on(value: Any) -> bool:
    return bool(value) and value != "off"


_VLLM = ("rollout_engine", lambda v: v == "vllm", "rollout_engine='vllm'")
_LEARNABILITY = lambda v: v == "learnability"  # noqa: E731

#: settings of an optional part, each with the switch that turns the part on: (the switch, whether its value turns
#: the part on, the switch's setting to name). A setting away from its default while its part is off means nothing.
DEPENDS_ON: dict[str, tuple[str, Callable[[Any], bool], str]] = {
    **{name: _VLLM for name in ENGINE_ATTRIBUTES.values()},
    "replay_buffer_kwargs": ("replay_ratio", lambda v: v > 0, "controls_kwargs['replay_ratio'] > 0"),
    "max_replay_age": ("replay_ratio", lambda v: v > 0, "controls_kwargs['replay_ratio'] > 0"),
    "prompt_pool_size": ("prompt_sampling", _LEARNABILITY, "controls_kwargs['prompt_sampling']='learnability'"),
    "fresh_prompt_fraction": ("prompt_sampling", _LEARNABILITY, "controls_kwargs['prompt_sampling']='learnability'"),
    "max_resample_rounds": ("dynamic_sampling", _on, "dynamic_sampling=True"),
    "competition_coef": ("competition", lambda v: v is not None, "controls_kwargs['competition']"),
    "diversity_threshold": ("diversity_guard", _on, "controls_kwargs['diversity_guard']=True"),
    "sft_steps": ("cold_start", lambda v: v is not False, "cold_start=True or 'auto'"),
    "sft_batch_size": ("cold_start", lambda v: v is not False, "cold_start=True or 'auto'"),
    "sft_learning_rate": ("cold_start", lambda v: v is not False, "cold_start=True or 'auto'"),
    "sft_data": ("cold_start", lambda v: v is not False, "cold_start=True or 'auto'"),
}


#: a sequence-level (GSPO) clip range above this rarely clips: a warning (the paper's is 3e-4)
GSPO_CLIP_HINT = 0.01


def check_combinations(
    values: Mapping[str, Any], defaults: Mapping[str, Any], shown: Mapping[str, str] | None = None
) -> None:
    """Warn, naming the switch and both fixes, about a setting of an optional part (:data:`DEPENDS_ON`) given away
    from its default while the part is off (``max_resample_rounds=5`` without ``dynamic_sampling``,
    ``rollout_engine_kwargs={'mode': 'server'}`` with the built-in engine): the run ignores it. A warning, not an
    error: a preset holds a part's settings and a run may switch the part off (``-params cold_start:False``,
    ``--rollout-engine builtin``). ``values`` and ``defaults`` by attribute name (:meth:`Arguments.flattened`),
    ``shown``: how to name an attribute in the message."""
    shown = shown or {}
    for name, (switch, turns_on, setting) in DEPENDS_ON.items():
        if name not in values or switch not in values or turns_on(values[switch]):
            continue
        value = values[name]
        if not _same(value, defaults[name]):
            what, switched = shown.get(name, name), shown.get(switch, switch)
            warnings.warn(
                f"{what}={value!r:.80} has no effect with {switched}={values[switch]!r:.40}: it is a setting of the "
                f"part {setting} turns on; pass {setting} to use it, or leave {what} out to silence this",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
    if values.get("diagnostics") and values.get("sharding") == "fsdp":  # per-group gradients are whole ones
        raise ArgumentError(
            "controls_kwargs['diagnostics']=True measures each group's whole gradient: not with sharding='fsdp'; "
            "leave diagnostics off (or pass sharding=None)"
        )
    if values.get("importance_level") == "sequence":
        clips = [values.get("clip_range"), values.get("clip_range_high")]
        widest = max(v(1.0) if callable(v) else v for v in clips if v is not None)  # at the start of training
        if widest > GSPO_CLIP_HINT:
            warnings.warn(
                f"importance_level='sequence' clips GSPO's sequence ratio, which stays within about 1e-3 of 1: a "
                f"clip range of {widest:g} rarely clips it. GSPO's paper uses clip_range=3e-4, clip_range_high=4e-4 "
                "(pass them, as TRL's epsilon and epsilon_high)",
                UserWarning,
                stacklevel=user_stacklevel(),
            )


def _same(value: Any, default: Any) -> bool:
    """Whether ``value`` is the default (an empty dict for ``None`` too; a schedule or an object: compared by equality,
    never called)."""
    try:
        if (value is None or value == {}) and (default is None or default == {}):
            return True
        return bool(value == default)
    except Exception:  # an object whose == fails or is ambiguous (an array): not the default
        return False
