"""Parse one completion written in the R1-Zero template ``<think>REASONING</think><answer>ANSWER</answer>``.

Model output is data: the parser never executes it, never raises on it and runs in linear time (plain
``str.count`` / ``str.find`` scans, no regular expression), whatever the input.

Rules
-----
1. **Input.** ``bytes`` (or ``bytearray``/``memoryview``) are decoded as UTF-8 with ``errors="replace"``, so
   invalid bytes become U+FFFD and never crash. Any other non-text object gives an empty, not-well-formed
   parse with a reason.
2. **Length cap.** Only completions of at most :data:`MAX_COMPLETION_CHARS` characters (64 Ki) are examined.
   A longer one is *not well formed* and yields no reasoning and no answer: a tag could hide past any cut,
   so no answer extracted from a prefix can be called unambiguous. Byte input longer than four times the cap
   is rejected before decoding (UTF-8 never packs more than four bytes into one character).
3. **Tags** are exactly ``<think>``, ``</think>``, ``<answer>`` and ``</answer>`` (lower case, no spaces or
   attributes). Any other spelling (``<Answer>``, ``<answer >``) is ordinary text.
4. **Answer** (stripped) is extracted only when unambiguous: exactly one ``<answer>`` and one
   ``</answer>``, in that order; not inside a ``<think>`` block (after an opening ``<think>`` whose
   ``</think>`` has not come yet); no think tag inside it; not empty after stripping. Otherwise ``answer``
   is ``None`` and ``reason`` says why (``"2 <answer> tags"``, ``"unclosed <answer>"``,
   ``"<answer> inside <think>"``, …).
5. **Reasoning** (stripped) is the content of the think block when exactly one ``<think>`` and one
   ``</think>`` occur, in that order; otherwise ``None``. It is extracted even when the rest of the
   completion is malformed.
6. **Well formed** means: optional leading whitespace, one think block with non-blank content, optional
   whitespace, one answer block with non-blank content, optional whitespace, end of text. Each of the four
   tags occurs exactly once, so there is no repeated, nested or stray tag and no answer inside the reasoning.
7. **Reason** is ``""`` exactly when the completion is well formed; otherwise it names the first problem
   found, problems with the answer first (so it also explains a missing ``answer``), then with the think
   block, then with the layout.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_COMPLETION_CHARS = 65536
"""Completions longer than this many characters are not well formed and yield nothing (rule 2)."""

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"


@dataclass(frozen=True)
class ParsedCompletion:
    """What :func:`parse_completion` found in one completion.

    :param reasoning: the stripped content of the single think block, or ``None``
    :param answer: the stripped content of the single, unambiguous answer block, or ``None``
    :param well_formed: whether the completion follows the template exactly (rule 6)
    :param reason: why it is not well formed (``""`` when it is)
    """

    reasoning: str | None
    answer: str | None
    well_formed: bool
    reason: str


def completion_text(completion: object) -> str | None:
    """Decode ``completion`` to text as the parser does (rule 1), or ``None`` when it is not text.

    Over-long byte strings are decoded from their first ``4 * MAX_COMPLETION_CHARS`` bytes only; callers that
    need the whole text (e.g. a reward model with its own truncation) may cut it further.

    :param completion: a ``str``, or UTF-8 ``bytes``/``bytearray``/``memoryview``
    :return: the text, or ``None`` for any other object
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (bytes, bytearray, memoryview)):
        raw = bytes(completion[: 4 * MAX_COMPLETION_CHARS + 1])
        return raw.decode("utf-8", errors="replace")
    return None


def _block(text: str, open_tag: str, close_tag: str) -> tuple[int, int, str]:
    """Locate the single ``open_tag … close_tag`` block: ``(start, end, "")`` or ``(-1, -1, reason)``.

    ``start`` is the index just after ``open_tag``, ``end`` the index of ``close_tag``.
    """
    n_open, n_close = text.count(open_tag), text.count(close_tag)
    if n_open == 0 and n_close == 0:
        return -1, -1, f"no {open_tag} block"
    if n_open > 1:
        return -1, -1, f"{n_open} {open_tag} tags"
    if n_close > 1:
        return -1, -1, f"{n_close} {close_tag} tags"
    if n_close == 0:
        return -1, -1, f"unclosed {open_tag}"
    if n_open == 0:
        return -1, -1, f"{close_tag} without {open_tag}"
    start, end = text.find(open_tag), text.find(close_tag)
    if end < start:
        return -1, -1, f"{close_tag} before {open_tag}"
    return start + len(open_tag), end, ""


def _extract_answer(text: str) -> tuple[str | None, int, int, str]:
    """Rule 4: ``(answer, start, end, reason)``; ``answer`` is ``None`` with a reason when ambiguous."""
    start, end, reason = _block(text, ANSWER_OPEN, ANSWER_CLOSE)
    if reason:
        return None, start, end, reason
    open_at = start - len(ANSWER_OPEN)
    last_think = text.rfind(THINK_OPEN, 0, open_at)
    if last_think != -1 and text.find(THINK_CLOSE, last_think, open_at) == -1:
        return None, start, end, f"{ANSWER_OPEN} inside {THINK_OPEN}"
    content = text[start:end]
    if THINK_OPEN in content or THINK_CLOSE in content:
        return None, start, end, f"think tag inside {ANSWER_OPEN}"
    content = content.strip()
    if not content:
        return None, start, end, f"empty {ANSWER_OPEN}"
    return content, start, end, ""


def _layout_reason(text: str, think: tuple[int, int], answer: tuple[int, int], reasoning: str) -> str:
    """Rule 6 given one think block and one answer block: the first layout problem, or ``""``."""
    (t_start, t_end), (a_start, a_end) = think, answer
    a_open = a_start - len(ANSWER_OPEN)
    if not reasoning:
        return f"empty {THINK_OPEN}"
    if a_open < t_end:
        return f"{ANSWER_OPEN} before {THINK_CLOSE}"
    leading = text[: t_start - len(THINK_OPEN)]
    if leading and not leading.isspace():
        return f"text before {THINK_OPEN}"
    between = text[t_end + len(THINK_CLOSE) : a_open]
    if between and not between.isspace():
        return f"text between {THINK_CLOSE} and {ANSWER_OPEN}"
    trailing = text[a_end + len(ANSWER_CLOSE) :]
    if trailing and not trailing.isspace():
        return f"text after {ANSWER_CLOSE}"
    return ""


def parse_completion(completion: str | bytes) -> ParsedCompletion:
    """Parse one completion following the rules of this module's docstring. Never raises.

    :param completion: the model's completion (text after the prompt), as ``str`` or UTF-8 ``bytes``
    :return: the parse: reasoning, answer, whether it is well formed, and why not
    """
    text = completion_text(completion)
    if text is None:
        return ParsedCompletion(None, None, False, f"completion is not text ({type(completion).__name__})")
    if len(text) > MAX_COMPLETION_CHARS:
        reason = f"completion longer than {MAX_COMPLETION_CHARS} characters"
        return ParsedCompletion(None, None, False, reason)
    if not text or text.isspace():
        return ParsedCompletion(None, None, False, "empty completion")

    answer, a_start, a_end, answer_reason = _extract_answer(text)
    t_start, t_end, think_reason = _block(text, THINK_OPEN, THINK_CLOSE)
    reasoning = text[t_start:t_end].strip() if not think_reason else None

    reason = answer_reason or think_reason
    if not reason:
        reason = _layout_reason(text, (t_start, t_end), (a_start, a_end), reasoning or "")
    return ParsedCompletion(reasoning, answer, not reason, reason)
