"""A time limit on the user code that scores completions: reward functions (sync and async), the reward model, and
a user's task's scoring hooks (``verify`` and the consistency hooks, when any of them is not ``grpo_gym``'s own:
:func:`~grpo_gym.tasks.base.scores_with_user_code`; each completion's call is bounded, like a sync function).

``reward_timeout`` (seconds, :data:`DEFAULT_REWARD_TIMEOUT` = 30 by default; ``None`` disables it) bounds each
call: a call that has not returned by then raises :class:`RewardTimeout` for its component, which is then scored
like any reward error (0 and reported in ``info["reward_errors"]``, or re-raised with ``on_reward_error="raise"``),
and the env stays usable. How each kind of call is bounded:

- a **sync** function (or the reward model's ``score``) runs in a daemon thread of its own while the caller waits
  at most ``reward_timeout``; one that never returns is abandoned there and **keeps running** (Python cannot stop a
  thread), holding whatever it holds, until it returns or the process exits. Running off the main thread, a function
  that sets signal handlers (``signal.alarm``-based timeouts, e.g. math_verify's defaults) fails: give it its own
  timeouts off (math_verify: ``parsing_timeout=None, timeout_seconds=None``; ``reward_timeout`` then bounds it), or
  make the env with ``reward_timeout=None``, which calls functions in the caller's thread;
- an **async** function is awaited under ``asyncio.wait_for`` on the reward event loop and cancelled at the limit;
  one that blocks the loop itself (never awaits) is abandoned with that loop after ``reward_timeout +``
  :data:`LOOP_GRACE` seconds, and a fresh loop serves the next calls.

A :class:`~grpo_gym.rewards.reward_model.RewardModelScorer` loads its model before the clock starts: the limit is on
scoring, not on the first load.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from grpo_gym.validation import check_float

DEFAULT_REWARD_TIMEOUT = 30.0
"""Seconds a reward function or the reward model may take per call before it is scored 0 (``None``: no limit)."""
LOOP_GRACE = 1.0
"""Seconds past ``reward_timeout`` after which a reward event loop that has not answered is abandoned."""

T = TypeVar("T")


class RewardTimeout(TimeoutError):
    """A reward call did not return within ``reward_timeout`` seconds."""


def check_reward_timeout(value: Any) -> float | None:
    """``reward_timeout`` as seconds (a finite number > 0) or ``None`` (no limit); ``ArgumentError`` otherwise."""
    return check_float(  # type: ignore[return-value]
        "reward_timeout", value, low=0.0, low_open=True, allow_none=True, hint="seconds, or None for no limit"
    )


def timeout_error(what: str, timeout: float, still_running: bool = True) -> RewardTimeout:
    """The :class:`RewardTimeout` of ``what`` (``"reward function 'f'"``) past ``timeout`` seconds."""
    tail = "; the call keeps running in a daemon thread" if still_running else ""
    return RewardTimeout(f"{what} did not return within {timeout:g} s (reward_timeout), so it scores 0{tail}")


def call_with_timeout(fn: Callable[[], T], timeout: float | None, what: str) -> T:
    """``fn()`` in a daemon thread, waited for at most ``timeout`` seconds (``None``: called here, no limit).

    :raises RewardTimeout: when ``fn`` has not returned in time (it is abandoned, still running)
    :raises Exception: whatever ``fn`` raised
    """
    if timeout is None:
        return fn()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as error:  # handed to the caller's thread, which re-raises it
            outcome["error"] = error

    thread = threading.Thread(target=run, name="grpo-gym-reward-call", daemon=True)
    thread.start()
    thread.join(min(timeout, threading.TIMEOUT_MAX))
    if thread.is_alive():
        raise timeout_error(what, timeout)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
