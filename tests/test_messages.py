"""Messages that suggest the fix: the full list of functions, hints for Python forms the language refuses
(``%``, ``.T``, methods, ``if ... else``), did-you-mean for spec keys and flags, and ``--domain``."""

from __future__ import annotations

import ast
import inspect
import keyword

import pytest

from scaffold import expression, functions, structural
from scaffold.errors import ExpressionError
from scaffold.expression import parse_forward

from .conftest import make_spec


def _refusal(forward: str, **scalars) -> str:
    with pytest.raises(ExpressionError) as raised:
        parse_forward(make_spec("m", forward, {"x": {}, "y": {}}, scalars or None))
    return str(raised.value)


def _hinted_functions() -> set[str]:
    return set(_refusal("nope(x)").split("supported: ")[1].split(", "))


def _taken_as_a_call(name: str) -> bool:
    try:
        parse_forward(make_spec("m", f"{name}(x)"))
    except ExpressionError as exc:
        return "unknown function" not in str(exc)
    return True


def test_the_hint_names_every_function_the_registries_and_the_parser_take():
    hinted = _hinted_functions()
    registries = {*functions.spellings(), *structural.SPELLINGS, "Piecewise", "where"}
    assert registries <= hinted, sorted(registries - hinted)
    # Every name the parser's source spells that it takes as a call is hinted: a spelling dispatched on
    # there (``if name == "foo"``) cannot be left out of the list.
    source = ast.parse(inspect.getsource(expression))
    spelt = {
        n.value
        for n in ast.walk(source)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier()
    }
    taken = {name for name in spelt - {"x"} if not keyword.iskeyword(name) and _taken_as_a_call(name)}
    assert taken <= hinted, sorted(taken - hinted)
    # and every hinted name is one the parser takes as a call
    assert {name for name in hinted if not _taken_as_a_call(name)} == set()


@pytest.mark.parametrize(
    ("forward", "message", "hint"),
    [
        (
            "x % 2",
            "the operator '%' is not allowed",
            "write x - 2*floor(x/2) for the remainder; floor's derivative is 0",
        ),
        ("(x + 1) // y", "the operator '//' is not allowed", "write floor((x + 1)/y); floor's derivative is 0"),
        ("x.T", "attribute access ('.') is not allowed", "write transpose(x, -2, -1)"),
        ("x.t()", "only functions can be called", "write transpose(x, -2, -1)"),
        ("x.transpose(0, 1)", "only functions can be called", "write transpose(x, 0, 1)"),
        ("x.exp()", "only functions can be called", "write exp(x)"),
        ("x.sum(-1)", "only functions can be called", "write sum(x, dim=-1)"),
        ("(x * y).sum(-1, keepdim=True)", "only functions can be called", "write sum(x * y, dim=-1, keepdim=True)"),
        ("x.clamp(min=0)", "only functions can be called", "write clamp(x, min=0)"),
        ("x.pow(2)", "only functions can be called", "write x**2"),
        ("torch.exp(x)", "only functions can be called", "write exp(x), without 'torch.'"),
        ("F.softmax(x, dim=-1)", "only functions can be called", "write softmax(x, dim=-1), without 'F.'"),
        ("x.grad", "attribute access ('.') is not allowed", "use numbers, argument names"),
    ],
)
def test_refused_python_forms_hint_what_to_write(forward, message, hint):
    text = _refusal(forward)
    assert message in text
    assert f"hint: {hint}" in text


def test_if_else_hints_piecewise_with_a_bool_scalar_and_where():
    text = _refusal("x if flag else -x", flag={"default": True})
    assert "an 'if ... else' expression is not allowed" in text
    assert "Piecewise((x, flag), (-x, True))" in text
    assert "--scalar flag=true" in text
    assert "where(flag, x, -x)" in text
    # the form the hint names is one the parser takes
    parse_forward(make_spec("m", "Piecewise((x, flag), (-x, True))", scalars={"flag": {"default": True}}))


def test_the_readme_writes_no_if_else_the_parser_refuses():
    readme = (expression.__file__.rsplit("/scaffold/", 1)[0]) + "/README.md"
    assert "x if flag else -x" not in open(readme, encoding="utf-8").read()
