"""Constructor arguments declared once: each has its default, its one rule, its ``:param:`` text and its annotation
here (:class:`Argument`), and an algorithm's table (:class:`Arguments`) is the shared ones
(:data:`~algorithms.common.lm_arguments.LM_ARGUMENTS`) with its own added (``algorithms/grpo/arguments.py``,
``algorithms/ppo/arguments.py``).

The table is the constructor's signature (SB3's flat keyword API: an algorithm writes ``__init__(self, policy, env,
**kwargs)`` and :meth:`Arguments.constructor` gives it the table's signature, which ``inspect`` and ``help`` show,
and every argument with its default), its docstring's ``:param:`` lines (:meth:`Arguments.docstring`)
and its checks (:meth:`Arguments.check`: each value by its rule, once, in its canonical type), and
:meth:`~algorithms.common.base_class.LMBaseAlgorithm.save` records the arguments it lists.

A rule takes the argument's name and value and returns the value in its canonical type (``4.0`` becomes ``4``
for an integer) or raises :class:`~grpo_gym.validation.ArgumentError` (a ``ValueError``) naming the argument,
the value and the valid range. Numbers must be finite; schedules (SB3's functions of the remaining progress,
or :class:`~algorithms.common.schedules.UpdateDecay`) are checked at both ends of training, so that no
non-finite value can reach the optimizer from any setting.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import os
import textwrap
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from algorithms.common.argument_combinations import check_combinations
from algorithms.common.schedules import UpdateDecay
from algorithms.common.trl_names import TRL_NAMES, with_trl_hints
from grpo_gym.validation import (
    ArgumentError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_mapping,
    check_path,
)

Rule = Callable[[str, Any], Any]


#: the largest count a size argument takes (completions per rollout, examples per batch, episodes in a window): past
#: it one iteration would not fit a machine's memory, and a file that says more is damaged
MOST = 1_000_000
#: the most gradient steps an argument may ask for (a billion: years of training)
MOST_STEPS = 1_000_000_000
#: the largest learning rate taken (1e-6 to 1e-3 is the practice; past float32's range torch's step crashes)
MOST_RATE = 10.0
#: the most weight versions ``max_staleness`` keeps (each a copy of the weights; one or two is the practice)
MOST_VERSIONS = 16


def integer(low: int | None = None, high: int | None = None, allow_none: bool = False) -> Rule:
    """An integer in ``[low, high]`` (an integral float is read as an integer)."""
    return lambda name, value: check_int(name, value, low=low, high=high, allow_none=allow_none)


def number(
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    allow_none: bool = False,
) -> Rule:
    """A finite real number in the range."""
    bounds = {"low": low, "high": high, "low_open": low_open, "high_open": high_open, "allow_none": allow_none}
    return lambda name, value: check_float(name, value, **bounds)


def boolean() -> Rule:
    """``True`` or ``False`` (not ``"no"``, not ``1``)."""
    return lambda name, value: check_bool(name, value)


def choice(*values: Any) -> Rule:
    """One of ``values``."""
    return lambda name, value: check_choice(name, value, values)


def mapping(valid_keys: Iterable[str]) -> Rule:
    """A dict (or ``None``) whose keys are among ``valid_keys``."""
    keys = tuple(valid_keys)
    return lambda name, value: check_mapping(name, value, keys)


def optional_path(existing_file: str = "") -> Rule:
    """A path, or ``None``; with ``existing_file`` (what the file should hold), a path to an existing file."""

    def rule(name: str, value: Any) -> Any:
        if value is None:
            return None
        path = check_path(name, value)
        if existing_file and not os.path.isfile(path):
            raise ArgumentError(f"{name} {value!r} is not a file; pass {existing_file}")
        return path

    return rule


def schedule(low: float | None = None, high: float | None = None, allow_none: bool = False, updates: bool = False):
    """A number in the range, or a schedule whose values at the start and the end of training are: an SB3
    schedule (a function of the remaining progress, 1 to 0) or, with ``updates``, an :class:`UpdateDecay`."""

    def rule(name: str, value: Any) -> Any:
        if value is None and allow_none:
            return None
        if isinstance(value, UpdateDecay):
            if not updates:
                raise ArgumentError(f"{name} takes a number or a schedule of the remaining progress, not UpdateDecay")
            for end in (value.start, value.end):
                check_float(f"{name} (UpdateDecay)", end, low=low, high=high)
            return value
        if callable(value):
            for progress in (1.0, 0.0):
                try:
                    result = value(progress)
                except Exception as error:  # a user's function: say which argument failed and how
                    raise ArgumentError(f"{name}: the schedule raised at progress {progress} ({error!r})") from None
                check_float(f"{name} at progress {progress}", result, low=low, high=high)
            return value
        return check_float(name, value, low=low, high=high)

    return rule


# ---------------------------------------------------------------------------------------------- the tables
@dataclass(frozen=True)
class Argument:
    """One constructor argument, declared once.

    :param default: its default value
    :param rule: checks a value and returns it in its canonical type (see the module docstring)
    :param doc: its ``:param:`` text
    :param annotation: its type, as the signature shows it
    :param saved: whether a model file records it (``device`` is the loader's to give)
    :param settings: for a settings dict (``rollout_engine_kwargs``, ...), its keys' declarations
    :param attributes: for a settings dict, the attribute the algorithm holds each key's value in
    """

    default: Any
    rule: Rule
    doc: str
    annotation: str = "Any"
    saved: bool = True
    settings: Mapping[str, Argument] | None = None
    attributes: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Retired:
    """An argument of an earlier version that others now cover.

    :param instead: what to pass today, as the constructor's error says it (``"dynamic_sampling=True with
        max_resample_rounds=0"``)
    :param translate: ``(its value, the other values) -> the values it stands for`` (for a file saved by an earlier
        version; ``{}``: it changed nothing)
    """

    instead: str
    translate: Callable[[Any, Mapping[str, Any]], dict[str, Any]]


def settings_argument(
    part: str, settings: Mapping[str, Argument], attributes: Mapping[str, str] | None = None, note: str = ""
) -> Argument:
    """The argument that holds the settings of an optional ``part`` in one dict (SB3's ``policy_kwargs`` style):
    ``None`` or a dict of some of ``settings``' keys, each checked by its rule; the checked value holds every key
    (the defaults filled in). The algorithm keeps each value as an attribute (``attributes``: key -> name; default
    the key itself); ``note`` adds to the docstring."""
    keys = ", ".join(f"``{key}``" for key in settings)
    lines = "; ".join(f"``{key}``: {item.doc} (default ``{item.default!r}``)" for key, item in settings.items())
    return Argument(
        None,
        settings_rule(part, settings),
        f"the settings of {part}{note}, a dict of some of {keys} (``None``: every default): {lines}",
        "dict[str, Any] | None",
        settings=settings,
        attributes=dict(attributes) if attributes is not None else {key: key for key in settings},
    )


def settings_rule(part: str, settings: Mapping[str, Argument]) -> Rule:
    """The rule of :func:`settings_argument`: unknown keys named with the close match and the valid ones."""

    def rule(name: str, value: Any) -> dict[str, Any]:
        if value is None:
            value = {}
        if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
            raise ArgumentError(
                f"{name} must be a dict of the settings of {part} ({', '.join(settings)}) or None, got {value!r:.80}"
            )
        for key in value:
            if key not in settings:
                close = difflib.get_close_matches(key, list(settings), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ArgumentError(
                    f"{name}: unknown setting {key!r:.60}{hint}; the settings of {part}: {', '.join(settings)}"
                )
        return {key: item.rule(f"{name}[{key!r}]", value.get(key, item.default)) for key, item in settings.items()}

    return rule


#: the constructor's parameters before the table's (SB3's ``policy, env``) and after it
HEAD = {
    "policy": ("str | type[TransformerPolicy]", '``"TransformerPolicy"`` or the class'),
    "env": ("GymEnv | str | None", 'an env, a VecEnv or a registered id (``"R1Zero-v0"``); sequence action mode'),
}
LAST = ("_init_setup_model", "bool", True, "build the policy now (``load()`` passes ``False``)")


class Arguments(Mapping[str, Argument]):
    """An algorithm's constructor arguments after ``policy`` and ``env``, in their order: a read-only mapping of
    name to :class:`Argument`.

    :param arguments: the arguments, in the signature's order
    :param retired: arguments of earlier versions that others now cover, by name
    """

    def __init__(self, arguments: Mapping[str, Argument], retired: Mapping[str, Retired] | None = None) -> None:
        self._arguments = dict(arguments)
        self.retired = dict(retired or {})

    def __getitem__(self, name: str) -> Argument:
        return self._arguments[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arguments)

    def __len__(self) -> int:
        return len(self._arguments)

    def extended(
        self,
        after: str,
        own: Mapping[str, Argument],
        retired: Mapping[str, Retired] | None = None,
        **changes: Mapping[str, Any] | Argument,
    ) -> Arguments:
        """These arguments with an algorithm's ``own`` inserted after the argument ``after``, its ``retired`` ones,
        and ``changes`` to shared ones (``group_size={"default": 1, "rule": ..., "doc": ...}``: the algorithm's
        default, rule or doc; an :class:`Argument` replaces the shared one whole)."""
        if set(own) & set(self._arguments):
            raise ValueError(f"declared twice: {sorted(set(own) & set(self._arguments))}")
        if clash := set(retired or {}) & (set(own) | set(self._arguments)):
            raise ValueError(f"retired and declared: {sorted(clash)}")
        arguments: dict[str, Argument] = {}
        for name, argument in self._arguments.items():
            change = changes.pop(name, {})
            arguments[name] = change if isinstance(change, Argument) else dataclasses.replace(argument, **change)
            if name == after:
                arguments.update(own)
        if changes:
            raise ValueError(f"changes to arguments that are not shared: {sorted(changes)}")
        return Arguments(arguments, {**self.retired, **(retired or {})})

    def check(self, values: Mapping[str, Any], combinations: bool = True) -> dict[str, Any]:
        """Every argument's value by its one rule (an argument without a value gets its default); with
        ``combinations``, what the values mean together
        (:func:`~algorithms.common.argument_combinations.check_combinations`: warnings, or an error for a
        combination that cannot run)."""
        checked = {name: argument.rule(name, values.get(name, argument.default)) for name, argument in self.items()}
        if combinations:
            check_combinations(self.flattened(checked), self._flat_defaults, self.shown_names())
        return checked

    @functools.cached_property
    def _flat_defaults(self) -> dict[str, Any]:
        """Every default in its canonical type, settings under their attributes (what :meth:`check` compares with)."""
        return self.flattened({name: argument.rule(name, argument.default) for name, argument in self.items()})

    @functools.cached_property
    def _flat_names(self) -> dict[str, tuple[str, str]]:
        return {
            attribute: (name, key)
            for name, argument in self.items()
            for key, attribute in (argument.attributes or {}).items()
        }

    def flat_names(self) -> dict[str, tuple[str, str]]:
        """Each setting of a settings dict by its attribute name (the flat argument name of earlier versions,
        ``vllm_mode``): ``(the settings dict, its key)``."""
        return dict(self._flat_names)

    def shown_names(self) -> dict[str, str]:
        """How a message names each setting of a settings dict, by its attribute: ``rollout_engine_kwargs['mode']``."""
        return {attribute: f"{name}[{key!r}]" for attribute, (name, key) in self._flat_names.items()}

    def flattened(self, checked: Mapping[str, Any]) -> dict[str, Any]:
        """Checked values with each settings dict's values under their attribute names (as the algorithm holds
        them), the dicts themselves kept too."""
        flat = dict(checked)
        for attribute, (name, key) in self._flat_names.items():
            if isinstance(checked.get(name), Mapping) and key in checked[name]:
                flat[attribute] = checked[name][key]
        return flat

    def regrouped(
        self, values: Mapping[str, Any], where: str = "", overrides: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """``values`` with the flat names of earlier versions (``vllm_mode``, ``sft_steps``, ``competition``) moved
        into their settings dicts, and the retired arguments (``drop_uniform_groups``) as the values they stand for,
        read with ``overrides`` (what will replace some of ``values``: ``load(path, importance_level=...)``): how a
        file saved by an earlier version, or TRL's names (``from_trl``), reach today's constructor. A setting given
        both ways with two values is an error (``where`` names the source)."""
        regrouped = {name: value for name, value in values.items() if name not in self.retired}
        for name, retired in self.retired.items():
            if name in values:
                regrouped.update(retired.translate(values[name], {**values, **(overrides or {})}))
        for attribute, (name, key) in self._flat_names.items():
            if attribute not in regrouped or attribute == name:
                continue
            value = regrouped.pop(attribute)
            inner = dict(regrouped.get(name) or {})
            if key in inner and inner[key] != value:
                raise ArgumentError(
                    f"{where}{attribute}={value!r:.40} and {name}[{key!r}]={inner[key]!r:.40} both given: keep one"
                )
            inner[key] = value
            regrouped[name] = inner
        return regrouped

    def moved(self, name: str, value: Any) -> str | None:
        """For a flat name of an earlier version, where it lives now, and for a retired argument what to pass
        instead (the message of the constructor's ``TypeError``); ``None`` for another name."""
        if name in self.retired:
            return f"{name} is gone: pass {self.retired[name].instead}"
        found = self._flat_names.get(name)
        if found is None or found[0] == name:
            return None
        group, key = found
        return f"{name} is now a setting of {group}: pass {group}={{{key!r}: {value!r:.60}}}"

    def signature(self) -> inspect.Signature:
        """``(self, policy, env, <the arguments, with their defaults>, _init_setup_model=True)``."""
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        parameters = [inspect.Parameter("self", kind)]
        parameters += [inspect.Parameter(name, kind, annotation=annotation) for name, (annotation, _) in HEAD.items()]
        parameters += [inspect.Parameter(n, kind, default=a.default, annotation=a.annotation) for n, a in self.items()]
        parameters.append(inspect.Parameter(LAST[0], kind, default=LAST[2], annotation=LAST[1]))
        return inspect.Signature(parameters, return_annotation="None")

    def docstring(self, indent: str = "    ") -> str:
        """The ``:param:`` lines of the constructor, SB3's reST style, one per parameter, wrapped at 116
        characters; every line but the first starts with ``indent`` (the class docstring's)."""
        docs = [(name, doc) for name, (_, doc) in HEAD.items()]
        docs += [(name, argument.doc) for name, argument in self.items()] + [(LAST[0], LAST[3])]
        lines = []
        for name, doc in docs:
            lines += textwrap.wrap(f":param {name}: {doc}", 116 - len(indent), subsequent_indent="    ")
        return f"\n{indent}".join(lines)

    def constructor(self, init: Callable[..., None]) -> Callable[..., None]:
        """The constructor of an algorithm whose ``__init__`` is written ``(self, policy, env, **kwargs)``: it gets
        the table's signature (:meth:`signature`: what ``inspect``, ``help`` and IDEs that read it show, and what
        ``save`` records), and every argument as a keyword, defaults filled in; a name it does not take raises a
        ``TypeError`` naming ours for a TRL name, where a flat name of an earlier version lives now, or the close
        matches (:func:`~algorithms.common.trl_names.with_trl_hints`)."""
        signature, arguments = self.signature(), self
        written = [p.name for p in inspect.signature(init).parameters.values()]
        if written != ["self", *HEAD, "kwargs"]:
            raise TypeError(f"{init.__qualname__} must be written (self, policy, env, **kwargs), got {written}")

        def bound_init(*args: Any, **kwargs: Any) -> None:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            values = dict(bound.arguments)
            init(values.pop("self"), values.pop("policy"), values.pop("env"), **values)

        bound_init.__signature__ = signature  # type: ignore[attr-defined]
        hinted = with_trl_hints(bound_init)  # a name the signature does not take: refused, naming the fix

        @functools.wraps(init)
        def constructor(self: Any, *args: Any, **kwargs: Any) -> None:
            # a TRL name (vllm_mode) gets TRL's hint, which says the same
            arguments.refuse_moved(kwargs, f"{type(self).__name__}()", keep=TRL_NAMES)
            hinted(self, *args, **kwargs)

        constructor.__signature__ = signature  # type: ignore[attr-defined]
        return constructor

    def refuse_moved(self, given: Mapping[str, Any], where: str, keep: Collection[str] = ()) -> None:
        """Raise a ``TypeError`` (starting with ``where``) for a flat name of an earlier version among ``given``,
        saying where it lives now (:meth:`moved`); the names in ``keep`` are left to another check."""
        for name, value in given.items():
            moved = self.moved(name, value)
            if moved is not None and name not in keep:
                raise TypeError(f"{where}: {moved}")

    def values_in(self, names: Mapping[str, Any]) -> dict[str, Any]:
        """The table's arguments as ``names`` holds them: a constructor passes its ``kwargs`` on whole (the
        constructor's other keywords, ``_init_setup_model``, left out)."""
        return {name: names[name] for name in self}
