"""TRL's names for the env's own arguments, and the hint a constructor gives for a name it does not take.

TRL users pass its generation and dataset names where ours go: ``gym.make("R1Zero-v0", max_completion_length=64)``
raises a ``TypeError`` that names ours (``max_new_tokens``), by the table :data:`ENV_NAMES`; a close miss of one of
the env's own names gets the closest. The table of every TRL name (``GRPOConfig``'s fields: the algorithms'
arguments and the policy's, with these) is the algorithms' (:mod:`algorithms.common.trl_names`, which builds on
this module; the env never imports it). :func:`with_trl_hints` is the decorator both use.

Where an equivalent goes (:attr:`TrlName.where`):

- ``"arg"``: the algorithm's constructor argument of that name (``group_size``);
- ``"env"``: an argument of the env, ``gym.make("R1Zero-v0", max_new_tokens=...)``;
- ``"policy"``: a key of ``policy_kwargs`` (``"temperature"``; ``"optimizer_kwargs.eps"`` is a key of that dict);
- ``"call"``: what SB3 does with a call or a callback (``learn(total_timesteps=...)``, ``CheckpointCallback``);
- ``"always"``: what this project always does (no switch);
- ``"none"``: no equivalent.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from grpo_gym.validation import ArgumentError

__all__ = ["ENV_NAMES", "TrlName", "hint", "spelled", "with_trl_hints"]

WHERE = ("arg", "env", "policy", "call", "always", "none")


@dataclass(frozen=True)
class TrlName:
    """One TRL name and its equivalent here.

    :param ours: our name (``where`` says what kind), or what to call; ``None`` when ``where`` is ``"none"``
    :param where: one of :data:`WHERE`
    :param note: a short note (defaults that differ, units, what to do instead)
    :param values: TRL's values mapped to ours, where they differ (``loss_type="dapo"`` -> ``"token"``)
    :param ported: whether ``GRPO.from_trl`` copies the value over (by ``values`` when given); the others need a
        hand (a schedule, a callback) and are named in its warning
    :param lmppo: LMPPO's equivalent when it differs from GRPO's (``beta`` -> ``kl_coef``)
    """

    ours: str | None
    where: str
    note: str = ""
    values: Mapping[Any, Any] | None = None
    ported: bool = True
    lmppo: str | None = None

    def __post_init__(self) -> None:
        assert self.where in WHERE and (self.ours is None) == (self.where == "none"), self


def _env(ours: str, note: str = "", **kwargs: Any) -> TrlName:
    return TrlName(ours, "env", note, **kwargs)


#: the TRL names (``GRPOTrainer``'s arguments, ``GRPOConfig``'s fields, a removed one) whose equivalent is an
#: argument of the env
ENV_NAMES: dict[str, TrlName] = {
    "reward_funcs": _env("reward_funcs", "the same functions, as a list or a dict; weight 1 each"),
    "train_dataset": _env("task_kwargs", '`task="dataset", task_kwargs={"data": ds, "answer": "<column>"}`'),
    "eval_dataset": _env("task_kwargs", '`task_kwargs={"eval_data": ds}`: the held-out split of evaluations'),
    "processing_class": _env("tokenizer", "a tokenizer object or folder; its chat template renders conversations"),
    "tools": _env("tools", "the same typed functions, called in the Hermes `<tool_call>` format (Episodes with tools)"),
    "max_completion_length": _env("max_new_tokens", "TRL 512, ours 64"),
    "chat_template_kwargs": _env("use_chat_template", "whether the tokenizer's template is used", ported=False),
    "reward_weights": _env("reward_weights", "a dict by function name (from_trl converts TRL's list)", ported=False),
    "max_tool_calling_iterations": _env(
        "max_tool_calls", "ours counts the calls of an episode, TRL counted tool-calling turns", ported=False
    ),
    "max_prompt_length": _env("context_length", "removed from TRL in 0.28; ours keeps a prompt's newest tokens"),
}
#: what the env says of an unknown name that is none of its own (a training argument, most likely)
NOT_THE_ENVS = "the algorithm's arguments (n_groups, group_size, ...) go to GRPO(...), not to the env"


# ---------------------------------------------------------------------------------------------- the hints
def spelled(name: str, entry: TrlName) -> str:
    """How a user writes our equivalent (``group_size=...``, ``gym.make("R1Zero-v0", max_new_tokens=...)``)."""
    if entry.where == "arg":  # a flat argument, or a key of a settings dict ("rollout_engine_kwargs.mode")
        key, _, inner = str(entry.ours).partition(".")
        return f'{key}={{"{inner}": ...}}' if inner else f"{key}=..."
    if entry.where == "env":
        return f'gym.make("R1Zero-v0", {entry.ours}=...)'
    if entry.where == "policy":
        key, _, inner = str(entry.ours).partition(".")
        return f'policy_kwargs={{"{key}": {{"{inner}": ...}}}}' if inner else f'policy_kwargs={{"{key}": ...}}'
    return str(entry.ours)


def hint(algorithm: str, name: str, accepted: set[str], names: Mapping[str, TrlName] = ENV_NAMES) -> str:
    """The message for ``name``, an argument ``algorithm`` does not take (``accepted``: the ones it does): our
    equivalent of a TRL name of the table ``names``, else the close matches among ours, else the TRL name it looks
    like and our equivalent."""
    head = f"{algorithm}() got an unexpected keyword argument {name!r}"
    if name in names:
        return f"{head}, TRL's name: {_equivalent(algorithm, names[name], accepted)}"
    close = difflib.get_close_matches(name, sorted(accepted), n=3)
    if close:
        return f"{head}; did you mean {', '.join(close)}?"
    trl = difflib.get_close_matches(name, list(names), n=1)
    if trl:
        return f"{head}; did you mean TRL's {trl[0]!r}? {_equivalent(algorithm, names[trl[0]], accepted)}"
    return head


def _equivalent(algorithm: str, entry: TrlName, accepted: set[str]) -> str:
    """What ``algorithm`` has for the TRL name of ``entry``."""
    own = algorithm.split(".")[0] == "LMPPO" and entry.lmppo is not None  # LMPPO's (or LMPPO.load's) own equivalent
    note = f" ({entry.note})" if entry.note and not own else ""
    ours = entry.lmppo if own else entry.ours
    if entry.where == "none":
        return f"we have no equivalent ({entry.note}); see 'From TRL's GRPOConfig' in docs/guides/from-trl.md"
    if entry.where == "always":
        return f"nothing to set, this is always so: {entry.ours}"
    if entry.where == "arg" and str(ours).partition(".")[0] not in accepted:
        return f"GRPO's equivalent is {ours}; {algorithm} has none"
    if entry.where == "env" and ours in accepted:  # the env itself: its own argument
        return f"ours is {ours}=...{note}"
    return f"ours is {spelled('', TrlName(ours, entry.where))}{note}"


Init = TypeVar("Init", bound=Callable[..., None])


def with_trl_hints(init: Init | None = None, *, names: Mapping[str, TrlName] = ENV_NAMES, otherwise: str = ""):
    """Wrap a constructor (R1ZeroEnv's; GRPO's and LMPPO's with the whole table) so that a keyword it does not take
    raises an :class:`~grpo_gym.validation.ArgumentError` (a ``TypeError``, as Python's own, and a ``ValueError``)
    naming our equivalent of a TRL name in ``names`` or the close matches (:func:`hint`),
    else ``otherwise``; its signature (what ``inspect`` and ``save`` read) is unchanged. ``@with_trl_hints`` or
    ``@with_trl_hints(names=..., otherwise=...)``."""

    def wrap(function: Init) -> Init:
        accepted = set(inspect.signature(function).parameters)

        @functools.wraps(function)
        def checked(self: Any, *args: Any, **kwargs: Any) -> None:
            unknown = [name for name in kwargs if name not in accepted]
            if unknown:
                message = hint(type(self).__name__, unknown[0], accepted, names)
                if otherwise and message.endswith(repr(unknown[0])):  # nothing better found
                    message += f"; {otherwise}"
                raise ArgumentError(message)  # a TypeError, as Python's own; a ValueError too: the CLI's one line
            function(self, *args, **kwargs)

        return checked  # type: ignore[return-value]

    return wrap if init is None else wrap(init)
