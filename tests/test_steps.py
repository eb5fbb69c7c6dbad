"""Forwards written in steps: ``h = x*w + b`` on one line, ``h*sigmoid(h)`` on the next."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaffold import compile_op, generate_op, load_spec, spec_from_flags, write_files
from scaffold.errors import ExpressionError

from .conftest import GeneratedRun, background_run, make_spec

SILU_OF_AFFINE = "h = x*w + b\nh*sigmoid(h)"


def _parsed(forward: str, tensors=("x", "w", "b"), scalars=()):
    return compile_op(spec_from_flags("op", forward, list(tensors), list(scalars))).parsed


def test_steps_are_substituted_into_the_last_line():
    parsed = _parsed(SILU_OF_AFFINE)
    assert parsed.expr == _parsed("(x*w + b)*sigmoid(x*w + b)").expr
    assert [(s.name, s.text, s.line) for s in parsed.steps] == [("h", "x*w + b", 1)]
    assert parsed.written == "h*sigmoid(h), where h = x*w + b"


def test_semicolons_separate_steps_and_a_last_assignment_is_the_result():
    parsed = _parsed("h = x*w + b; y = h*sigmoid(h)")
    assert parsed.expr == _parsed(SILU_OF_AFFINE).expr
    assert parsed.written == "y, where h = x*w + b; y = h*sigmoid(h)"


def test_one_expression_is_parsed_as_before():
    parsed = _parsed("x*w + b")
    assert parsed.steps == () and parsed.written == ""


@pytest.mark.parametrize(
    ("forward", "message"),
    [
        ("x = w*2\nx + b", r"forward, line 1: 'x' is an argument of the op; a step cannot assign it"),
        ("exp = x*w\nexp + b", r"line 1: 'exp' is the name of a function or constant"),
        ("h = x*w\nh = h + b\nh", r"line 2: 'h' is assigned twice"),
        ("h = x*w\ng = x*b\nh", r"line 2: 'g' is assigned but never used"),
        ("h = x*w + b\nx*w*b", r"line 1: 'h' is assigned but never used"),
        ("x*w\nh = b", r"line 1: only the last line may be a bare expression"),
        ("h = x*w; h += b; h", r"line 1: \+= and the like are not allowed"),
        ("h, g = x, w\nh*g*b", r"line 1: a step assigns one name"),
        ("h = g*x\ng = w*b\nh", r"line 1: unknown name 'g'"),
        ("import os\nx*w*b", r"line 1: a Python import statement is not allowed in a forward"),
        ("h = x*w +\nh*b", r"cannot parse line 1"),
    ],
)
def test_bad_steps_say_which_line_and_why(forward, message):
    with pytest.raises(ExpressionError, match=message):
        _parsed(forward)


def test_steps_that_grow_without_bound_are_refused_quickly():
    # Each line uses the one before twice: written out, 2**40 copies of x.
    lines = ["h0 = x*w + b"] + [f"h{i} = h{i - 1} + exp(h{i - 1})" for i in range(1, 41)] + ["h40"]
    with pytest.raises(ExpressionError, match="once its steps are substituted"):
        _parsed("\n".join(lines))


def _silu_affine(folder: Path) -> GeneratedRun:
    spec_file = folder / "silu_affine.toml"
    spec_file.write_text(
        'name = "silu_affine"\n'
        'forward = """\n'
        "h = x*w + b  \n"
        "h*sigmoid(h)\n"
        '"""\n\n'
        "[tensors.x]\nshape = [4, 5]\n\n[tensors.w]\nshape = [5]\nlearnable = true\n\n"
        "[tensors.b]\nshape = [5]\nlearnable = true\ninit = 0.0\n"
    )
    files = generate_op(load_spec(spec_file))
    assert "silu_affine(x, w, b) = h*sigmoid(h), where h = x*w + b" in files["silu_affine.py"]
    write_files(files, folder / "out")
    return GeneratedRun(folder / "out")


@background_run(_silu_affine)
def test_a_forward_in_steps_generates_an_op_that_passes_its_tests(background_results):
    result = background_results
    assert result.returncode == 0, result.stdout[-3000:]


def test_steps_and_the_same_forward_in_one_line_generate_the_same_code():
    # (x*y is no intermediate the plan keeps: x - y would be, named u where the step names it, see
    # test_saved_intermediates.py)
    stepped = generate_op(make_spec("op", "u = x*y\nsqrt(u**2 + 1) - 1", {"x": {}, "y": {}}))
    inline = generate_op(make_spec("op", "sqrt((x*y)**2 + 1) - 1", {"x": {}, "y": {}}))

    # the code after the module's docstring (which lists the steps), but for the functional's docstring
    def code(text, formula):
        body = text[text.index('"""\n\nfrom __future__') :]
        return [line for line in body.splitlines() if formula not in line]

    assert code(stepped["op.py"], "where u = x*y") == code(inline["op.py"], "sqrt((x*y)**2 + 1) - 1")
    assert "The forward in steps:\n\n    u = x*y\n    return sqrt(u**2 + 1) - 1\n" in stepped["op.py"]
