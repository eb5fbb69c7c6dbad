"""The derived double backward (scaffold/double_backward.py): a program whose nodes are all elementwise (every
elementwise op) gets _XBackward, a GradientsFunction whose backward is derived; programs that reduce, normalize
or multiply matrices keep autograd of backward's code."""

from __future__ import annotations

import importlib
import sys
import warnings

import sympy
import torch

from scaffold import compile_op, generate_op, spec_from_mapping, write_files
from scaffold.double_backward import Node, composed_gradients

try:
    from .catalogue import OPS
    from .conftest import run_pytest
    from .structured_catalogue import STRUCTURED
except ImportError:  # tests/ run as a plain folder, not a package
    from catalogue import OPS
    from conftest import run_pytest
    from structured_catalogue import STRUCTURED

SECOND_ORDER = "gradgradcheck or hessian or jacrev"

# swish; div, whose 1/y the structured path keeps as a hidden output (its gradient arrives in a second
# derivative); two outputs, each with a hidden part of its own
ELEMENTWISE = {
    "swish": next(op.mapping() for op in OPS if op.name == "swish"),
    "div": next(op.mapping() for op in OPS if op.name == "div"),
    "two_out": {
        "name": "two_out",
        "forward": "a = x * sigmoid(y)\nb = a * y**2",
        "outputs": ["a", "b"],
        "tensors": {"x": {"shape": [3, 4]}, "y": {"shape": [4]}},
    },
}


def _generate(mapping: dict, folder) -> str:
    """Generate the op of ``mapping`` into ``folder``; its module."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = spec_from_mapping(mapping, source=f"{mapping['name']}.toml")
        write_files(generate_op(spec, time_limit=None), folder, force=True)
    return (folder / f"{mapping['name']}.py").read_text(encoding="utf-8")


def test_elementwise_ops_through_the_structured_path_derive_their_double_backward(tmp_path):
    for name, mapping in ELEMENTWISE.items():
        camel = "".join(part.capitalize() for part in name.split("_"))
        module = _generate(mapping, tmp_path)
        assert "def _backward(" in module and f"class {camel}Function(torch.autograd.Function)" in module
        assert f"class _{camel}Backward(_runtime.GradientsFunction):" in module, name
        assert f"_gradients = _runtime.gradients(_{camel}Backward" in module, name
        assert "return _gradients(\n" in module or "return _gradients(ctx.needs_input_grad, " in module, name
        assert "so a second derivative differentiates it" not in module, name
    result = run_pytest(tmp_path, "-k", SECOND_ORDER)
    assert result.returncode == 0, result.stdout[-3000:]
    assert " passed" in result.stdout and "failed" not in result.stdout


def test_a_wrong_derived_double_backward_fails_the_generated_gradgradcheck(tmp_path):
    module = _generate(ELEMENTWISE["swish"], tmp_path)
    derived = "grad_x = sum(terms).sum_to_size(x.shape) if terms else None"
    assert module.count(derived) == 1
    (tmp_path / "swish.py").write_text(module.replace(derived, derived.replace("sum(terms)", "2 * sum(terms)")))
    result = run_pytest(tmp_path, "-k", "gradgradcheck")
    assert result.returncode != 0 and "failed" in result.stdout, result.stdout[-3000:]


def test_the_derived_double_backward_is_finite_where_autograd_of_backward_is_not(tmp_path):
    # x*tanh(exp(x)) at x = 100 in float32: exp(x) overflows, and autograd of backward's code multiplies that
    # inf by the 0 that 1 - tanh(exp(x))**2 is there: nan, where the second derivative is 0
    _generate({"name": "tanh_of_exp", "forward": "x*tanh(exp(x))", "tensors": {"x": {}}}, tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        op = importlib.import_module("tanh_of_exp").tanh_of_exp
    finally:
        sys.path.remove(str(tmp_path))
    x = torch.tensor([100.0, 1.0, -3.0], requires_grad=True)
    (grad,) = torch.autograd.grad(op(x).sum(), x, create_graph=True)
    (second,) = torch.autograd.grad(grad.sum(), x)
    expected = torch.func.grad(torch.func.grad(lambda t: t * torch.tanh(torch.exp(t))))
    assert torch.isfinite(second).all(), second
    torch.testing.assert_close(second[1:], torch.stack([expected(t) for t in x.detach()[1:]]))
    assert second[0] == 0


def test_a_structured_op_with_a_reduction_keeps_autograd_of_its_backward(tmp_path):
    mapping = next(op.mapping() for op in STRUCTURED if op.name == "logsumexp_textbook")
    spec = spec_from_mapping(mapping, source="logsumexp_textbook.toml")
    assert compile_op(spec).plan.double_backward is None
    module = _generate(mapping, tmp_path)
    assert "so a second derivative differentiates it" in module
    assert "GradientsFunction" not in module and "return _backward(ctx.needs_input_grad, " in module


def test_the_chain_rule_composes_the_partials_in_what_backward_reads():
    x, y, u, g = (sympy.Symbol(n, real=True) for n in ("x", "y", "u", "grad_output"))
    nodes = [Node("u", x * y, (("x", y), ("y", x))), Node("out", sympy.sin(u), (("u", sympy.cos(u)),))]
    # u is not kept: written as its formula x*y
    assert composed_gradients(nodes, {"out": [g]}, ["x", "y"], {"x", "y"}) == [
        [g * sympy.cos(x * y) * y],
        [g * sympy.cos(x * y) * x],
    ]
    # u kept (a hidden output), with a gradient of its own (a second derivative's)
    h = sympy.Symbol("grad_u_returned", real=True)
    assert composed_gradients(nodes, {"out": [g], "u": [h]}, ["x"], {"x", "y", "u"}) == [[g * sympy.cos(u) * y, h * y]]
