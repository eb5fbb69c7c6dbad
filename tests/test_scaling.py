"""Large expressions: a long sum is wide, not deep, and its derivation stays linear in its size.

Generation time itself is measured by benchmarks/generation.py, not asserted here.
"""

from __future__ import annotations

import ast
import sys
import types

import pytest
import sympy

from scaffold import expression
from scaffold.api import compile_op, generate_op
from scaffold.errors import ExpressionError
from scaffold.expression import MAX_DEPTH, MAX_LENGTH, parse_expression, parse_steps

from .conftest import make_spec


def tanh_sum(n: int):
    forward = " + ".join(f"a{i}*tanh(w{i}*x + b{i})" for i in range(n))
    tensors = {"x": {}, **{f"{p}{i}": {} for i in range(n) for p in "awb"}}
    return make_spec(f"tanh_sum{n}", forward, tensors)


def test_a_sum_of_many_terms_is_one_level_of_nesting():
    spec = tanh_sum(64)
    op = compile_op(spec)
    (node,) = op.derivation.elementwise
    partials = dict(node.partials)
    a, w, x, b = sympy.symbols("a7 w7 x b7", real=True)
    assert partials["a7"] == sympy.tanh(w * x + b)
    assert len(partials["x"].args) == 64  # one term per tanh, nothing else
    files = generate_op(spec, time_limit=None)
    assert "grad_a63" in files["tanh_sum64.py"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a - b + c - d", "a - b + c - d"),
        ("a / b * c / d", "a*c/(b*d)"),
        ("a - (b - c)", "a - b + c"),
        ("a / (b / c)", "a*c/b"),
        ("-a - b", "-a - b"),
    ],
)
def test_chains_keep_their_meaning(text, expected):
    symbols = {n: sympy.Symbol(n, real=True) for n in "abcd"}
    assert parse_expression(text, symbols, where="forward") == sympy.sympify(expected, locals=symbols)


def test_a_long_product_parses():
    symbols = {"x": sympy.Symbol("x", real=True)}
    assert parse_expression("*".join(["x"] * 200), symbols, where="forward") == symbols["x"] ** 200


def test_deep_nesting_is_still_refused():
    text = "exp(" * (MAX_DEPTH + 5) + "x" + ")" * (MAX_DEPTH + 5)
    with pytest.raises(ExpressionError, match="nested more than"):
        parse_expression(text, {"x": sympy.Symbol("x", real=True)}, where="forward")


@pytest.mark.parametrize("parse", [parse_expression, parse_steps])
def test_text_over_the_length_limit_is_refused_before_it_is_parsed(parse, monkeypatch):
    # An 80 kB sum made Python's parser recurse past its limit before the length was checked.
    parsed = []
    monkeypatch.setattr(
        expression, "ast", types.SimpleNamespace(**{**vars(ast), "parse": lambda *a, **k: parsed.append(a)})
    )
    for text in ["+".join(["x"] * 40000), "x\n" * (MAX_LENGTH // 2) + "x"]:
        with pytest.raises(ExpressionError, match=f"longer than {MAX_LENGTH} characters"):
            parse(text, {"x": sympy.Symbol("x", real=True)}, where="forward")
    assert not parsed


@pytest.mark.parametrize(
    "text",
    ["-" * (MAX_LENGTH - 10) + "x", "Piecewise((x, " + "~" * 4000 + "(x > 0)), (0, True))", "not " * 1200 + "x"],
)
@pytest.mark.parametrize("limit", [None, 100_000])
def test_nesting_too_deep_for_the_parser_is_refused_clearly(text, limit):
    """Also where the recursion limit is raised (torch.compile raises it in the process), and the parser gets
    through: the same refusal, not a count of parts or a crash further on."""
    assert len(text) <= MAX_LENGTH
    original = sys.getrecursionlimit()
    sys.setrecursionlimit(limit or original)
    try:
        for parse in (parse_expression, parse_steps):
            with pytest.raises(ExpressionError, match=f"nested more than {MAX_DEPTH} levels deep"):
                parse(text, {"x": sympy.Symbol("x", real=True)}, where="forward")
    finally:
        sys.setrecursionlimit(original)


def test_steps_nested_too_deep_once_substituted_are_refused():
    # Each line is shallow; substituted, 300 nested sines made sympy's derivative recurse past Python's limit.
    steps = "h0 = sin(x)\n" + "".join(f"h{i} = sin(h{i - 1})\n" for i in range(1, 300)) + "h299"
    with pytest.raises(ExpressionError, match="nested more than 60 levels deep once its steps are substituted"):
        compile_op(make_spec("deep", steps))
    ok = "h0 = sin(x)\n" + "".join(f"h{i} = sin(h{i - 1})\n" for i in range(1, 20)) + "h19"
    spec = make_spec("shallow", ok, gradients={"x": "grad*" + "cos(" * 40 + "h19" + ")" * 40})
    with pytest.raises(ExpressionError, match="the gradient is nested more than 60 levels deep") as info:
        compile_op(spec)
    assert info.value.where == "shallow.toml: gradients.x"


def test_division_by_zero_inside_a_chain_is_refused():
    with pytest.raises(ExpressionError, match="division by zero"):
        parse_expression("x * 2 / 0 * 3", {"x": sympy.Symbol("x", real=True)}, where="forward")
