"""Argument checkers shared by the environment and the algorithms: one clear error per bad value.

Every checker takes the argument's ``name`` first and returns the value in its canonical type, or raises
:class:`ArgumentError` (a ``ValueError`` *and* a ``TypeError``, so callers may catch either) whose message
names the argument, shows the value and says what is valid::

    context_length = check_int("context_length", context_length, low=2)
    beta = check_float("beta", beta, low=0.0)
    use_all = check_bool("use_all", use_all)
    mode = check_choice("action_mode", action_mode, ("sequence", "token"))
    weights = check_mapping("reward_weights", weights, ("syntax", "consistency", "task"))

The rules, in one place:

- **integers**: Python and numpy integers; an integral float (``4.0``) is read as ``4``; ``2.7``, ``nan``,
  strings and booleans are refused (``True`` is not a count);
- **numbers**: Python and numpy reals, finite (``nan`` and ``inf`` refused unless ``allow_inf``), inside the
  optional range; strings (``"0.5"``, ``"no"``) and booleans are refused;
- **booleans**: ``True``/``False`` (and numpy booleans) only; ``"no"``, ``1`` and ``None`` are refused;
- **choices**: one of a tuple of allowed values (compared with ``==``, same type);
- **mappings**: a ``Mapping`` with string keys among the valid names; an unknown key is refused with the
  valid names listed (and the closest one suggested).

``None`` passes through (returned as is) only where the call says ``allow_none=True``.
"""

from __future__ import annotations

import difflib
import json
import math
import numbers
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_LINE_BYTES",
    "ArgumentError",
    "check_bool",
    "check_choice",
    "check_float",
    "check_int",
    "check_mapping",
    "check_path",
    "describe_range",
    "json_depth",
    "read_json",
    "read_lines",
    "unicode_error",
]


class ArgumentError(ValueError, TypeError):
    """A bad argument value. Both a ``ValueError`` and a ``TypeError``, so existing handlers of either catch it."""


class ReturnTypeError(TypeError, ValueError):
    """User code (a reward function, a task's ``sample`` or ``verify``, a wrapped env's ``step``) returned a value of a
    type its contract does not name (the text ``"0.5"`` for a reward): a bug in that code, not in the model's output,
    so raised (whatever ``on_reward_error`` says), naming the code and the value. A ``TypeError`` and a ``ValueError``
    (the command line reports those without a traceback); not an :class:`ArgumentError`, which a server answers as
    the client's mistake."""


#: the project's packages: a warning about what the user passed names the first line outside them (the user's)
PACKAGES = tuple(f"{Path(__file__).resolve().parents[1] / package}{os.sep}" for package in ("algorithms", "grpo_gym"))


def user_stacklevel() -> int:
    """The ``stacklevel`` for ``warnings.warn``, called by the function that calls this, that names the first line
    outside the project's packages: the user's ``GRPO(...)``, ``GRPO.load(...)`` or ``learn(...)``, however deep the
    call."""
    frame, level = sys._getframe(1), 1  # file names compared resolved: a checkout reached through a link too
    while frame.f_back is not None and os.path.realpath(frame.f_code.co_filename).startswith(PACKAGES):
        frame, level = frame.f_back, level + 1
    return level


def show_value(value: Any) -> str:
    """``repr`` of a value for a message, capped, with its type when the repr hides it (``'4'`` vs ``4``)."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit for str()
        text = f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else f"<{type(value).__name__}>"
    if len(text) > 80:
        text = text[:77] + "..."
    kind = type(value).__name__
    return text if kind in ("int", "float", "bool", "NoneType") else f"{text} ({kind})"


def describe_range(low: float | None, high: float | None, low_open: bool = False, high_open: bool = False) -> str:
    """Human-readable range: ``"in [0, 1]"``, ``">= 1"``, ``"> 0"``, ``"in (0, 1]"`` or ``""`` (no bound)."""
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{_number(low)}, {_number(high)}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {_number(low)}"
    if high is not None:
        return f"{'<' if high_open else '<='} {_number(high)}"
    return ""


def _number(x: float) -> str:
    """A bound as written: an integer in full (``1000000``), another number short (``1e-08``)."""
    return str(x) if isinstance(x, int) and not isinstance(x, bool) else f"{x:g}"


def _fail(name: str, value: Any, wanted: str, hint: str = "") -> ArgumentError:
    return ArgumentError(f"{name} must be {wanted}, got {show_value(value)}{'; ' + hint if hint else ''}")


def _in_range(x: float, low: float | None, high: float | None, low_open: bool, high_open: bool) -> bool:
    if low is not None and (x <= low if low_open else x < low):
        return False
    return not (high is not None and (x >= high if high_open else x > high))


def check_int(
    name: str,
    value: Any,
    *,
    low: int | None = None,
    high: int | None = None,
    allow_none: bool = False,
    hint: str = "",
) -> int | None:
    """``value`` as an ``int`` in ``[low, high]`` (either bound optional).

    :param name: the argument's name, used in the message
    :param value: the value to check
    :param low: smallest valid value (inclusive), or ``None``
    :param high: largest valid value (inclusive), or ``None``
    :param allow_none: return ``None`` for ``None`` instead of raising
    :param hint: appended to the message (e.g. how to fix it)
    :raises ArgumentError: when ``value`` is not an integer (or integral float) in range
    """
    if type(value) is int and (low is None or value >= low) and (high is None or value <= high):
        return value  # the common case, fast (these checks run in hot paths such as env resets)
    if value is None and allow_none:
        return None
    bounds = describe_range(low, high)
    wanted = f"an integer {bounds}".rstrip()
    if isinstance(value, (bool, np.bool_)):
        raise _fail(name, value, wanted, hint)
    if isinstance(value, numbers.Integral):
        result = int(value)
    elif isinstance(value, numbers.Real) and math.isfinite(float(value)) and float(value).is_integer():
        result = int(float(value))
    else:
        raise _fail(name, value, wanted, hint)
    if not _in_range(result, low, high, False, False):
        raise _fail(name, value, wanted, hint)
    return result


def check_float(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    allow_none: bool = False,
    allow_inf: bool = False,
    hint: str = "",
) -> float | None:
    """``value`` as a finite ``float`` inside the range (bounds optional, closed unless ``*_open``).

    :param name: the argument's name, used in the message
    :param value: the value to check
    :param low: lower bound, or ``None``
    :param high: upper bound, or ``None``
    :param low_open: exclude ``low`` itself
    :param high_open: exclude ``high`` itself
    :param allow_none: return ``None`` for ``None`` instead of raising
    :param allow_inf: accept ``inf``/``-inf`` (still checked against the range); ``nan`` is never accepted
    :param hint: appended to the message (e.g. how to fix it)
    :raises ArgumentError: when ``value`` is not a real number, not finite, or out of range
    """
    if (
        type(value) is float
        and math.isfinite(value)
        and (low is None or (value > low if low_open else value >= low))
        and (high is None or (value < high if high_open else value <= high))
    ):
        return value  # the common case, fast
    if value is None and allow_none:
        return None
    bounds = describe_range(low, high, low_open, high_open)
    wanted = f"a {'' if allow_inf else 'finite '}number {bounds}".rstrip()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise _fail(name, value, wanted, hint)
    result = float(value)
    if math.isnan(result) or (math.isinf(result) and not allow_inf):
        raise _fail(name, value, wanted, hint)
    if not _in_range(result, low, high, low_open, high_open):
        raise _fail(name, value, wanted, hint)
    return result


def check_bool(name: str, value: Any, *, allow_none: bool = False, hint: str = "") -> bool | None:
    """``value`` as a ``bool``: only ``True``/``False`` (or numpy booleans) pass; ``"no"``, ``1``, ``None`` do not.

    :param name: the argument's name, used in the message
    :param value: the value to check
    :param allow_none: return ``None`` for ``None`` instead of raising
    :param hint: appended to the message
    :raises ArgumentError: for any other value
    """
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise _fail(name, value, "True or False" + (" (or None)" if allow_none else ""), hint)


def check_choice(name: str, value: Any, choices: Iterable[Any], *, hint: str = "") -> Any:
    """``value`` when it is one of ``choices`` (same type and ``==``), else an error listing them.

    :param name: the argument's name, used in the message
    :param value: the value to check
    :param choices: the valid values, e.g. ``("sequence", "token")``
    :param hint: appended to the message
    :raises ArgumentError: when ``value`` is not one of ``choices``
    """
    options = tuple(choices)
    for option in options:
        if type(value) is type(option) and value == option:
            return value
    listed = ", ".join(repr(option) for option in options)
    if isinstance(value, str):
        names = [o for o in options if isinstance(o, str)]
        same_but_case = [o for o in names if o.lower() == value.lower()]  # 'TIS', 'BF16': difflib scores them 0
        close = same_but_case or difflib.get_close_matches(value, names, n=1)
        hint = f"did you mean {close[0]!r}?" + (f" {hint}" if hint else "") if close else hint
    raise _fail(name, value, f"one of {listed}", hint)


def check_mapping(
    name: str,
    value: Any,
    valid_keys: Iterable[str],
    *,
    allow_none: bool = True,
    hint: str = "",
) -> dict[str, Any]:
    """``value`` as a ``dict`` whose keys are all among ``valid_keys`` (values are the caller's to check).

    ``None`` gives ``{}`` when ``allow_none``. An unknown key is refused with the valid names listed and the
    closest one suggested (``n_group`` → ``n_groups``).

    :param name: the argument's name, used in the message
    :param value: the mapping to check
    :param valid_keys: the accepted key names
    :param allow_none: read ``None`` as an empty mapping
    :param hint: appended to the message
    :raises ArgumentError: when ``value`` is not a mapping, or has a non-string or unknown key
    """
    if value is None and allow_none:
        return {}
    valid = list(valid_keys)
    listed = ", ".join(valid) if valid else "(none)"
    if not isinstance(value, Mapping):
        raise _fail(name, value, f"a dict with keys among: {listed}", hint)
    for key in value:
        if not isinstance(key, str) or key not in valid:
            close = difflib.get_close_matches(key, valid, n=1) if isinstance(key, str) else []
            suggestion = f" (did you mean {close[0]!r}?)" if close else ""
            raise ArgumentError(
                f"{name}: unknown key {key!r}{suggestion}; valid keys: {listed}" + (f"; {hint}" if hint else "")
            )
    return dict(value)


def unicode_error(text: str) -> str | None:
    """What makes ``text`` impossible to encode as UTF-8 (``"a lone surrogate U+D800 at character 5"``: Python
    strings may hold one, e.g. from a JSON ``"\\ud800"`` escape; tokenizers refuse it), or ``None`` when it is valid."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"a lone surrogate U+{ord(text[error.start]):04X} at character {error.start + 1}"
    return None


# ---------------------------------------------------------------------------------------------- JSON
MAX_JSON_DEPTH = 100
"""The deepest nesting of arrays and objects :func:`read_json` reads by default (a model file's ``data``, a
``run.json``, a data row hold a few levels; Python's own recursion gives out near 1000)."""


def json_depth(text: str) -> int:
    """The deepest nesting of ``{``/``[`` in a JSON text, brackets inside strings ignored (one linear scan)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def read_json(text: str | bytes, where: str, *, max_depth: int = MAX_JSON_DEPTH, fix: str = "") -> Any:
    """``text`` parsed as JSON, or a ``ValueError`` that names ``where``, what is wrong and ``fix``: not UTF-8, not
    JSON, nested deeper than ``max_depth`` levels (checked before parsing, so no ``RecursionError``), or a number
    too long to read (Python reads at most 4300 digits). ``NaN`` and ``Infinity`` are read as floats, as ``json``
    reads them.

    :param text: the JSON text (``bytes`` are decoded as UTF-8, a byte-order mark skipped)
    :param where: the file (and line) or argument the text came from, for the message
    :param max_depth: the deepest nesting read
    :param fix: what to do about it, appended to the message
    """
    tail = f"; {fix}" if fix else ""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{where}: not UTF-8 text (byte 0x{text[error.start]:02x} at {error.start}){tail}"
            ) from None
    if text.count("[") + text.count("{") > max_depth and json_depth(text) > max_depth:  # counting first: C speed
        raise ValueError(f"{where}: JSON nested deeper than {max_depth} levels, which is never read{tail}")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{where}: JSON nested too deeply to read{tail}") from None
    except ValueError as error:  # JSONDecodeError, or a number past Python's 4300-digit limit
        detail = error.msg if isinstance(error, json.JSONDecodeError) else "a number longer than 4300 digits"
        raise ValueError(f"{where}: not valid JSON ({detail}){tail}") from None


# ---------------------------------------------------------------------------------------------- text files
MAX_LINE_BYTES = 16 * 2**20
"""The longest line (in bytes, newline excluded) that :func:`read_lines` accepts by default: 16 MiB. A longer
line is an error naming the file and line (raise the limit where a reader takes ``max_line_bytes``)."""

_BOM = b"\xef\xbb\xbf"


def check_path(name: str, value: Any, *, what: str = "a file") -> str:
    """``value`` as a ``str`` path: a ``str`` or ``os.PathLike`` (``pathlib.Path``) only.

    :param name: the argument's name, used in the message
    :param value: the value to check
    :param what: what the path should point at, for the message
    :raises ArgumentError: for any other value (``None``, a number, an open file)
    """
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if isinstance(path, str) and path:
            return path
    raise _fail(name, value, f"a path (str or pathlib.Path) to {what}")


def read_lines(
    path: str | os.PathLike[str], *, max_line_bytes: int = MAX_LINE_BYTES, what: str = "file"
) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)`` for each line of a UTF-8 text file, reading one bounded line at a time.

    A line longer than ``max_line_bytes`` bytes (newline excluded) or not valid UTF-8 raises ``ValueError``
    naming the file and the line number, before the rest of the file is read; a UTF-8 byte-order mark at the
    start is skipped; the newline (``\\n`` or ``\\r\\n``) is removed. Memory stays ``O(max_line_bytes)``.

    :param path: the file
    :param max_line_bytes: the longest accepted line, in bytes
    :param what: what the file is, for the messages (``"jsonl task file"``)
    :raises ValueError: when the file cannot be opened, a line is too long or not UTF-8
    """
    where = check_path("path", path, what=f"a {what}")
    limit = check_int("max_line_bytes", max_line_bytes, low=1)
    try:
        handle = open(where, "rb")
    except OSError as error:
        raise ValueError(f"cannot read {what} {where!r}: {error.strerror or error}") from None
    with handle:
        number = 0
        while True:
            raw = handle.readline(limit + 2)  # room for the limit and "\r\n": a longer read is a longer line
            if not raw:
                return
            number += 1
            content = raw[:-1] if raw.endswith(b"\n") else raw
            content = content[:-1] if content.endswith(b"\r") else content
            if number == 1 and content.startswith(_BOM):
                content = content[len(_BOM) :]
            if len(content) > limit or (len(raw) == limit + 2 and not raw.endswith(b"\n")):
                raise ValueError(
                    f"{where}:{number}: line longer than {limit} bytes (max_line_bytes); split the row or raise "
                    "the limit"
                )
            try:
                text = content.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{where}:{number}: not UTF-8 text (byte 0x{content[error.start]:02x} at byte {error.start + 1} "
                    f"of the line); save the {what} as UTF-8"
                ) from None
            yield number, text
