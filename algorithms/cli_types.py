"""Typed argparse converters for every number the ``grpo-gym`` command line takes.

Each option's value is checked as argparse reads it, before any command runs, with the same ranges the Python API
applies to the same argument. A bad value is argparse's usage error (exit code 2), naming the option and the range::

    grpo-gym train: error: argument -n/--n-timesteps: must be an integer >= 1, got -100

``tests/test_cli_types.py`` walks every sub-command's options: a numeric option without one of these converters
fails there, so a new option cannot be added unchecked.
"""

from __future__ import annotations

import argparse
import math
import os
import socket

from grpo_gym.tasks import MAX_DIFFICULTY, MIN_DIFFICULTY
from grpo_gym.validation import describe_range

__all__ = [
    "COUNT",
    "DIFFICULTY",
    "NON_NEGATIVE",
    "PORT",
    "POSITIVE",
    "SEED",
    "SHARE",
    "SOURCE",
    "VERBOSITY",
    "Integer",
    "Number",
]


class Integer:
    """An integer in ``[low, high]`` (either bound optional), as an argparse ``type``.

    :param low: the smallest valid value, or ``None``
    :param high: the largest valid value, or ``None``
    """

    def __init__(self, low: int | None = None, high: int | None = None) -> None:
        self.low, self.high = low, high
        bounds = f"in [{low}, {high}]" if low is not None and high is not None else describe_range(low, high)
        self.wanted = f"an integer {bounds}".rstrip()  # integers in full: [0, 4294967295], not 4.29497e+09

    def __call__(self, text: str) -> int:
        """The value of ``text``, or :class:`argparse.ArgumentTypeError` saying what is valid."""
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {self.wanted}, got {text!r}") from None
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise argparse.ArgumentTypeError(f"must be {self.wanted}, got {value}")
        return value

    def __repr__(self) -> str:
        return f"Integer(low={self.low}, high={self.high})"


class Number:
    """A finite real number inside a range (bounds optional, closed unless ``*_open``), as an argparse ``type``.

    :param low: the lower bound, or ``None``
    :param high: the upper bound, or ``None``
    :param low_open: exclude ``low`` itself
    :param high_open: exclude ``high`` itself
    """

    def __init__(
        self, low: float | None = None, high: float | None = None, low_open: bool = False, high_open: bool = False
    ) -> None:
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open
        self.wanted = f"a finite number {describe_range(low, high, low_open, high_open)}".rstrip()

    def __call__(self, text: str) -> float:
        """The value of ``text``, or :class:`argparse.ArgumentTypeError` saying what is valid."""
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {self.wanted}, got {text!r}") from None
        low, high = self.low, self.high
        below = low is not None and (value <= low if self.low_open else value < low)
        above = high is not None and (value >= high if self.high_open else value > high)
        if not math.isfinite(value) or below or above:
            raise argparse.ArgumentTypeError(f"must be {self.wanted}, got {text}")
        return value

    def __repr__(self) -> str:
        return f"Number(low={self.low}, high={self.high}, low_open={self.low_open}, high_open={self.high_open})"


#: a count of things: at least one
COUNT = Integer(low=1)
#: a number of steps, zero for none
STEPS = Integer(low=0)
#: a random seed (numpy's range)
SEED = Integer(low=0, high=2**32 - 1)
#: a TCP port (0: any free one)
PORT = Integer(low=0, high=65535)
#: the verbose level of SB3 (0 silent, 1 info, 2 debug)
VERBOSITY = Integer(low=0, high=2)
#: a task difficulty
DIFFICULTY = Number(low=MIN_DIFFICULTY, high=MAX_DIFFICULTY)
#: a rate, a coefficient or a temperature that must be above zero
POSITIVE = Number(low=0.0, low_open=True)
#: a weight or a duration that may be zero
NON_NEGATIVE = Number(low=0.0)
#: a share, in [0, 1]
SHARE = Number(low=0.0, high=1.0)


def SOURCE(text: str) -> str:
    """A model or tokenizer source (``--model``, ``--tokenizer``): a hub id, a folder or a ``.gguf`` file; an empty
    name or a file of another kind is :class:`argparse.ArgumentTypeError` naming the three, before anything loads."""
    wanted = "a hub id, a Hugging Face folder (written by save_pretrained) or a .gguf file"
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must name {wanted}, got {text!r}")
    if os.path.isfile(text) and not text.lower().endswith(".gguf"):
        raise argparse.ArgumentTypeError(f"{text!r} is a file, but not a .gguf file: pass {wanted}")
    return text


def HOST(text: str) -> str:
    """An address to listen on (``--host``): one this machine resolves, checked before the server starts, so a typo
    is argparse's usage error naming the option rather than the server's log line after start-up."""
    try:
        socket.getaddrinfo(text, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError) as error:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an address to listen on ({getattr(error, 'strerror', None) or error}); use an address of "
            "this machine, e.g. 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
        ) from None
    return text
