"""A safe arithmetic expression evaluator for model-written answers: never ``eval``, never ``ast``.

The grammar (a hand-written tokenizer and recursive-descent parser, O(length))::

    expr    := term (("+" | "-") term)*
    term    := unary (("*" | "/") unary)*
    unary   := "-" unary | primary          (unary minus only when ``allow_unary_minus``)
    primary := INTEGER | "(" expr ")"

Rules:

- literals are non-negative decimal integers of ASCII digits, at most ``max_digits`` (12) long;
  no decimals, exponents, underscores or signs inside a literal;
- the operators are ``+ - * /`` with the usual precedence, left-associative, and parentheses;
  ``**``, ``//``, ``%``, ``=``, names, calls and any other character are rejected;
- spaces, tabs and newlines between tokens are ignored;
- the whole text is at most ``max_length`` (256) characters; parentheses and unary minus nest at most
  ``max_depth`` (32) deep;
- arithmetic is exact (Python ints, and :class:`fractions.Fraction` once a division is inexact);
  division by zero is rejected.

Every rejection raises :class:`ExprError` (a ``ValueError``) with a short reason; :func:`try_evaluate`
returns the reason instead of raising. Nothing in the text is ever executed.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import NamedTuple

MAX_LENGTH = 256
MAX_DIGITS = 12
MAX_DEPTH = 32

_WHITESPACE = frozenset(" \t\r\n")
_DIGITS = frozenset("0123456789")
_OPERATORS = frozenset("+-*/()")
_DOUBLED = {"**": "'**' (power) is not allowed", "//": "'//' (floor division) is not allowed"}
_SPECIAL = {
    "%": "'%' is not allowed",
    "=": "'=' is not allowed: write only the expression",
    ".": "only integers are allowed (no decimals)",
}


Number = int | Fraction


class ExprError(ValueError):
    """The expression was rejected; the message is the reason."""


class ExprResult(NamedTuple):
    """A parsed expression.

    :param value: its exact value
    :param literals: the integer literals it uses, in order of appearance
    :param steps: one ``"a op b=c"`` string per binary operation, in evaluation order
        (empty unless ``record_steps``)
    """

    value: Fraction
    literals: tuple[int, ...]
    steps: tuple[str, ...]


def format_number(value: Number) -> str:
    """Write an exact number compactly: ``"7"``, ``"-3"`` or ``"3/4"``."""
    if isinstance(value, Fraction) and value.denominator == 1:
        return str(value.numerator)
    return str(value)


def _tokenize(text: str, max_digits: int) -> list[int | str]:
    """Split ``text`` into integer literals (``int``) and one-character operators (``str``)."""
    tokens: list[int | str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _WHITESPACE:
            i += 1
        elif c in _DIGITS:
            j = i + 1
            while j < n and text[j] in _DIGITS:
                j += 1
            if j - i > max_digits:
                raise ExprError(f"number literal longer than {max_digits} digits")
            tokens.append(int(text[i:j]))
            i = j
        elif c in _OPERATORS:
            pair = text[i : i + 2]
            if pair in _DOUBLED:
                raise ExprError(_DOUBLED[pair])
            tokens.append(c)
            i += 1
        elif c in _SPECIAL:
            raise ExprError(_SPECIAL[c])
        elif c.isalpha() or c == "_":
            raise ExprError("names are not allowed, only numbers, + - * / and parentheses")
        else:
            raise ExprError(f"unexpected character {c!r}")
    return tokens


class _Parser:
    """Recursive-descent parser over a token list; evaluates as it parses."""

    __slots__ = ("allow_unary_minus", "depth", "literals", "max_depth", "pos", "steps", "tokens")

    def __init__(self, tokens: list[int | str], allow_unary_minus: bool, max_depth: int, record: bool):
        self.tokens = tokens
        self.pos = 0
        self.depth = 0
        self.max_depth = max_depth
        self.allow_unary_minus = allow_unary_minus
        self.literals: list[int] = []
        self.steps: list[str] | None = [] if record else None

    def peek(self) -> int | str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def expr(self) -> Number:
        return self.chain(self.term, ("+", "-"))

    def term(self) -> Number:
        return self.chain(self.unary, ("*", "/"))

    def chain(self, operand: Callable[[], Number], operators: tuple[str, str]) -> Number:
        """``operand (op operand)*`` for ``op`` in ``operators``, applied left to right (one precedence level)."""
        value = operand()
        while (op := self.peek()) in operators:
            self.pos += 1
            right = operand()
            value = self.apply(value, op, right)
        return value

    def unary(self) -> Number:
        if self.peek() != "-":
            return self.primary()
        if not self.allow_unary_minus:
            raise ExprError("unary minus is not allowed")
        self.enter()
        self.pos += 1
        value = -self.unary()
        self.depth -= 1
        return value

    def primary(self) -> Number:
        token = self.peek()
        if isinstance(token, int):
            self.pos += 1
            self.literals.append(token)
            return token
        if token == "(":
            self.enter()
            self.pos += 1
            value = self.expr()
            if self.peek() != ")":
                raise ExprError("unbalanced parentheses: missing ')'")
            self.pos += 1
            self.depth -= 1
            return value
        if token is None:
            raise ExprError("expression ends where a number was expected")
        raise ExprError(f"expected a number, got {token!r}")

    def enter(self) -> None:
        self.depth += 1
        if self.depth > self.max_depth:
            raise ExprError(f"nested deeper than {self.max_depth} levels")

    def apply(self, left: Number, op: str, right: Number) -> Number:
        if op == "+":
            result = left + right
        elif op == "-":
            result = left - right
        elif op == "*":
            result = left * right
        elif right == 0:
            raise ExprError("division by zero")
        elif isinstance(left, int) and isinstance(right, int):
            result = left // right if left % right == 0 else Fraction(left, right)
        else:
            result = left / right
        if self.steps is not None:
            shown = format_number(right)
            if right < 0:
                shown = f"({shown})"
            self.steps.append(f"{format_number(left)}{op}{shown}={format_number(result)}")
        return result


def evaluate(
    text: str,
    *,
    allow_unary_minus: bool = True,
    record_steps: bool = False,
    max_length: int = MAX_LENGTH,
    max_digits: int = MAX_DIGITS,
    max_depth: int = MAX_DEPTH,
) -> ExprResult:
    """Parse and evaluate ``text`` exactly, following the module's rules.

    :param text: the expression
    :param allow_unary_minus: accept a leading ``-`` before a number or parenthesis
    :param record_steps: also return one ``"a op b=c"`` string per binary operation
    :param max_length: the longest accepted text, in characters
    :param max_digits: the longest accepted integer literal, in digits
    :param max_depth: the deepest accepted nesting of parentheses and unary minus
    :return: the value, the literals used and the steps
    :raises ExprError: with the reason, for any text that breaks a rule
    """
    if not isinstance(text, str):
        raise ExprError(f"expression must be a string, got {type(text).__name__}")
    if len(text) > max_length:
        raise ExprError(f"expression longer than {max_length} characters")
    tokens = _tokenize(text, max_digits)
    if not tokens:
        raise ExprError("empty expression")
    parser = _Parser(tokens, allow_unary_minus, max_depth, record_steps)
    value = parser.expr()
    if parser.pos < len(tokens):
        token = tokens[parser.pos]
        if token == ")":
            raise ExprError("unbalanced parentheses: unexpected ')'")
        raise ExprError(f"unexpected {token!r} after a complete expression")
    return ExprResult(Fraction(value), tuple(parser.literals), tuple(parser.steps or ()))


def try_evaluate(text: str, **kwargs: object) -> tuple[ExprResult | None, str]:
    """Like :func:`evaluate`, but return ``(result, "")`` or ``(None, reason)``; never raises on any text."""
    try:
        return evaluate(text, **kwargs), ""  # type: ignore[arg-type]
    except ExprError as error:
        return None, str(error)
