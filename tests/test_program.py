"""The program stage: the forward as named values with shapes, and its outputs."""

from __future__ import annotations

import pytest

from scaffold.errors import ExpressionError
from scaffold.expression import parse_forward
from scaffold.program import ELEMENTWISE, SCALAR, TENSOR, build_program

from .conftest import make_spec


def _program(forward, tensors, scalars=None, **extra):
    spec = make_spec("op", forward, tensors, scalars, **extra)
    return build_program(parse_forward(spec), spec)


def test_values_have_kinds_shapes_and_read_what_they_are_written_over():
    program = _program(
        "h = x - w + b\ny = h*sigmoid(h)",
        {"x": {"shape": [3, 4]}, "w": {"shape": [4]}, "b": {"shape": []}},
        {"alpha": {"default": 1.0}},
    )
    kinds = {v.name: (v.kind, v.shape) for v in program.values}
    assert kinds == {
        "x": (TENSOR, (3, 4)),
        "w": (TENSOR, (4,)),
        "b": (TENSOR, ()),
        "alpha": (SCALAR, ()),
        "h": (ELEMENTWISE, (3, 4)),
        "y": (ELEMENTWISE, (3, 4)),
    }
    assert program.value("y").reads == ("h",)  # over the step, not its formula
    assert program.value("h").line == 1 and program.value("y").line == 2
    (output,) = program.outputs
    assert output.name == "" and output.shape == (3, 4) and not program.several_outputs
    assert "h" not in {s.name for s in output.expr.free_symbols}  # substituted
    assert program.formula("y") == output.expr and program.steps == ("h", "y")


def test_outputs_keep_their_own_shapes():
    program = _program("a = 2*w\nb = w*x", {"x": {"shape": [3, 4]}, "w": {"shape": [4]}}, outputs=["b", "a"])
    assert [(o.name, o.shape) for o in program.outputs] == [("b", (3, 4)), ("a", (4,))]
    assert program.several_outputs


def test_the_same_value_twice_is_refused():
    with pytest.raises(ExpressionError, match="outputs 'a', 'b' are the same value"):
        _program("a = x*2\nb = 2*x", {"x": {}}, outputs=["a", "b"])


def test_the_softmax_textbook_form_is_found_whatever_sympy_caches():
    """exp(x) / sum(exp(x), dim=-1, keepdim=True) is softmax(x, dim=-1) also where its two exp(x) are distinct
    objects (sympy's cache full, as late in a long process): the rewrite compares them by equality (by
    identity it returned Softmax(x)*exp(x), inf at x = 1000)."""
    import sympy
    from sympy.core.cache import clear_cache

    from scaffold.structural import ReduceSum, Softmax, stable_forms

    x = sympy.Symbol("x", real=True)
    summed = ReduceSum(sympy.exp(x), sympy.Tuple(-1), sympy.true)
    clear_cache()
    textbook = sympy.exp(x) / summed
    assert all(a is not summed.args[0] for a in textbook.args)
    assert stable_forms(textbook) == Softmax(x, -1)
    assert stable_forms(2 * textbook) == 2 * Softmax(x, -1)
