"""The safe expression evaluator: exact values, literals, steps, and rejection of everything else."""

from __future__ import annotations

import builtins
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_gym.tasks.safe_expr import (
    MAX_DEPTH,
    ExprError,
    evaluate,
    format_number,
    try_evaluate,
)
from tests.guards import nothing_executes


@pytest.mark.parametrize(
    ("text", "value", "literals"),
    [
        ("7", Fraction(7), (7,)),
        ("37+48*2", Fraction(133), (37, 48, 2)),
        ("2+3*4", Fraction(14), (2, 3, 4)),
        ("(2+3)*4", Fraction(20), (2, 3, 4)),
        ("8-3-2", Fraction(3), (8, 3, 2)),
        ("16/4/2", Fraction(2), (16, 4, 2)),
        ("1/3+1/6", Fraction(1, 2), (1, 3, 1, 6)),
        ("6/4*8", Fraction(12), (6, 4, 8)),
        (" 25 * 4\t-\n3 ", Fraction(97), (25, 4, 3)),
        ("-3+5", Fraction(2), (3, 5)),
        ("-(2+3)", Fraction(-5), (2, 3)),
        ("2*-3", Fraction(-6), (2, 3)),
        ("0", Fraction(0), (0,)),
        ("007", Fraction(7), (7,)),
        ("999999999999*999999999999", Fraction(999999999999**2), (999999999999, 999999999999)),
    ],
)
def test_valid_expressions(text: str, value: Fraction, literals: tuple[int, ...]) -> None:
    result = evaluate(text)
    assert result.value == value
    assert result.literals == literals
    assert result.steps == ()
    assert try_evaluate(text) == (result, "")


def test_steps_follow_evaluation_order() -> None:
    assert evaluate("37+48*2", record_steps=True).steps == ("48*2=96", "37+96=133")
    assert evaluate("25*4-3", record_steps=True).steps == ("25*4=100", "100-3=97")
    assert evaluate("(1+2)*(9-3)", record_steps=True).steps == ("1+2=3", "9-3=6", "3*6=18")
    assert evaluate("3*(2-9)", record_steps=True).steps == ("2-9=-7", "3*(-7)=-21")
    assert evaluate("1/3+1/6", record_steps=True).steps == ("1/3=1/3", "1/6=1/6", "1/3+1/6=1/2")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("__import__('os')", "names are not allowed"),
        ("__import__('os').system('echo hi')", "names are not allowed"),
        ("9**9**9", "'**'"),
        ("2**10", "'**'"),
        ("1//2", "'//'"),
        ("7%3", "'%'"),
        ("(((", "a number was expected"),
        ("(1+2", "missing ')'"),
        ("1+2)", "unexpected ')'"),
        (")(", "expected a number"),
        ("()", "expected a number"),
        ("1/0", "division by zero"),
        ("5/(3-3)", "division by zero"),
        ("1" * 13, "longer than 12 digits"),
        ("1+" * 200 + "1", "longer than 256 characters"),
        ("1" * 1_000_000, "longer than 256 characters"),
        ("", "empty expression"),
        ("   ", "empty expression"),
        ("1 2", "after a complete expression"),
        ("2+", "a number was expected"),
        ("+1", "expected a number"),
        ("1.5", "no decimals"),
        ("1e5", "names are not allowed"),
        ("0x10", "names are not allowed"),
        ("25*4-3=97", "'='"),
        ("lambda: 0", "names are not allowed"),
        ("[1]", "unexpected character"),
        ("1;2", "unexpected character"),
        ("\x00", "unexpected character"),
        ("\uff11+1", "unexpected character"),  # a fullwidth digit
        ("\u0663", "unexpected character"),  # an Arabic-Indic digit
    ],
)
def test_rejected_with_reason(text: str, reason: str) -> None:
    with pytest.raises(ExprError, match=r"."):
        evaluate(text)
    result, why = try_evaluate(text)
    assert result is None
    assert reason in why


def test_non_string_input_is_rejected() -> None:
    for value in (None, 12, b"1+2", ["1"]):
        result, why = try_evaluate(value)  # type: ignore[arg-type]
        assert result is None
        assert "must be a string" in why


def test_expr_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="division by zero"):
        evaluate("1/0")


def test_nesting_limit() -> None:
    inside = "(" * MAX_DEPTH + "1" + ")" * MAX_DEPTH
    assert evaluate(inside).value == 1
    too_deep = "(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1)
    assert "nested deeper than 32" in try_evaluate(too_deep)[1]
    assert "nested deeper" in try_evaluate("-" * 40 + "1")[1]
    assert evaluate("-" * 4 + "1").value == 1
    # deep nesting inside the length limit never reaches Python's recursion limit
    assert try_evaluate("(" * 255)[0] is None


def test_unary_minus_can_be_disabled() -> None:
    assert "unary minus" in try_evaluate("-1+2", allow_unary_minus=False)[1]
    assert evaluate("3-1", allow_unary_minus=False).value == 2


def test_limits_are_configurable() -> None:
    assert try_evaluate("12345", max_digits=4)[0] is None
    assert evaluate("1+2+3", max_length=5).value == 6
    assert try_evaluate("1+2+3", max_length=4)[0] is None


def test_never_executes(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the evaluator must not call eval/exec/compile")

    for name in ("eval", "exec", "compile"):
        monkeypatch.setattr(builtins, name, forbidden)
    marker = tmp_path / "pwned"
    attack = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    assert try_evaluate(attack)[0] is None
    assert evaluate("(1+2)*3").value == 9
    assert not marker.exists()


def test_random_text_never_raises() -> None:
    rng = random.Random(0)
    alphabet = "0123456789+-*/() ().x_=%."
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        result, reason = try_evaluate(text)
        assert (result is None) == bool(reason)


def test_format_number() -> None:
    assert format_number(Fraction(6, 2)) == "3"
    assert format_number(Fraction(-3)) == "-3"
    assert format_number(Fraction(3, 4)) == "3/4"
    assert format_number(5) == "5"


# ---------------------------------------------------------------- property-based fuzzing (hypothesis)


def test_the_guard_catches_execution() -> None:
    with nothing_executes():
        for attempt in (lambda: eval("1"), lambda: exec("x = 1"), lambda: __import__("antigravity")):
            with pytest.raises(AssertionError, match="something tried to"):
                attempt()
        assert __import__("math").sqrt(4) == 2  # a loaded module is returned, nothing runs


TOKENS = ["0", "1", "7", "12", "999999999999", "1234567890123", "+", "-", "*", "/", "(", ")", " ", "\n", "**",
          "//", "%", "=", ".", "x", "_", "__import__('os')", "é", "\x00", "()", "((", "))", "-("]  # fmt: skip
_CODES = "".join(chr(ord("A") + i) for i in range(len(TOKENS)))
# a string over one letter per token, mapped to the tokens (text is the cheapest thing hypothesis draws)
_TABLE = dict(zip(map(ord, _CODES), TOKENS, strict=True))
expressions = st.text(alphabet=_CODES, max_size=60).map(lambda s: s.translate(_TABLE))


def check_outcome(text: str) -> None:
    with nothing_executes():
        result, reason = try_evaluate(text)
    assert (result is None) == bool(reason)
    if result is None:
        return
    assert isinstance(result.value, Fraction) and len(text) <= 256
    digits = "".join(c if c.isdigit() else " " for c in text).split()
    assert list(result.literals) == [int(d) for d in digits]  # every literal read, in order, nothing else
    assert set(text) <= set("0123456789+-*/() \t\r\n")


@settings(max_examples=1500, deadline=None)
@given(expressions)
def test_fuzz_grammar_pieces_never_raise_or_execute(text: str) -> None:
    check_outcome(text)


@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_any_text_never_raises_or_executes(text: str) -> None:
    check_outcome(text)


def _binary(parts: tuple[tuple[str, Fraction | None], str, tuple[str, Fraction | None]]) -> tuple[str, Fraction | None]:
    (a, x), op, (b, y) = parts
    if x is None or y is None or (op == "/" and y == 0):
        return f"({a}{op}{b})", None  # None: a division by zero somewhere inside
    value = {"+": x + y, "-": x - y, "*": x * y, "/": x / y if y else None}[op]
    return f"({a}{op}{b})", value


# (text, exact value) pairs of valid expressions, built together so the value needs no evaluator
valid_expressions = st.recursive(
    st.integers(0, 10**6).map(lambda n: (str(n), Fraction(n))),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from("+-*/"), inner).map(_binary),
        inner.map(lambda e: (f"-{e[0]}", None if e[1] is None else -e[1])),
    ),
    max_leaves=10,
)


@settings(max_examples=600, deadline=None)
@given(valid_expressions)
def test_fuzz_valid_expressions_evaluate_exactly(expression: tuple[str, Fraction | None]) -> None:
    text, value = expression
    check_outcome(text)
    result, reason = try_evaluate(text)
    if value is None:
        assert reason == "division by zero"
    else:
        assert result is not None and result.value == value, reason
