"""Fused mode (``fuse = true``) of elementwise ops, as the one pipeline (rules -> dataflow -> program_op.py.j2)
writes it: the sigmoid pair from one exp (plan._one_exponential) and its ``_neg_abs``, softplus from an exp and a
log (plan._one_logarithm), erf beside its exponential (plan._erf_beside_exponential), a backward that is one ATen
kernel run eagerly (ProgramPlan.one_kernel), and the derived double backward whose Function's forward is the
compiled backward.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

from scaffold import compile_op, generate_op, write_files

from .conftest import GeneratedRun, background_run, make_spec

SWISH = {"x": {}, "beta": {"shape": [], "learnable": True, "init": 1.0}}
SPECS = {
    "swish": make_spec("swish", "x / (1 + exp(-beta*x))", SWISH, fuse=True),
    "mish": make_spec("mish", "x*tanh(log(1 + exp(x)))", fuse=True),
    "gelu_erf": make_spec("gelu_erf", "x/2*(1 + erf(x/sqrt(2)))", fuse=True),
    "logsigmoid": make_spec("logsigmoid", "-log(1 + exp(-x))", fuse=True),
    "tanh_op": make_spec("tanh_op", "tanh(x)", fuse=True),
}
DIV = make_spec("div", "x/y", {"x": {}, "y": {"shape": [4, 1], "domain": [0.5, 3.0]}}, fuse=True)


def _module(name: str) -> str:
    return generate_op(SPECS[name])[f"{name}.py"]


def _function(text: str, name: str) -> str:
    match = re.search(rf"^def {name}\(.*?(?=^\S)", text, re.S | re.M)
    assert match, name
    return match.group(0)


def test_structured_fused_swish_takes_its_sigmoid_pair_from_one_exp():
    module = _module("swish")
    backward = _function(module, "_backward")
    assert "sigmoid" not in backward and backward.count("torch.exp(_neg_abs(") == 1
    assert "def _neg_abs(t):" in module
    # the derived double backward's Function runs the compiled gradients as its forward
    assert "gradients = staticmethod(_fused_backward)" in module
    assert "return _gradients(ctx.needs_input_grad, grad_output, x, beta" in module


def test_a_hidden_outputs_gradient_goes_through_the_derived_double_backward_too():
    # div's 1/y is a hidden output: its gradient (None but in a second derivative) is an argument of
    # _fused_backward, which _DivBackward runs as its forward
    text = generate_op(DIV)["div.py"]
    assert "return out, inverse" in _function(text, "_forward")
    assert "gradients = staticmethod(_fused_backward)" in text
    assert re.search(r"return _gradients\(\s*ctx\.needs_input_grad, grad_output, grad_inverse_returned", text)


def test_structured_fused_gelu_squares_erfs_argument_and_logsigmoid_takes_one_log():
    gelu = _module("gelu_erf")
    backward = _function(gelu, "_backward")
    assert "gelu_backward" not in backward
    temporary = backward.split("torch.erf(")[1].split(")")[0]
    assert f"torch.exp(-({temporary}**2))" in backward, backward
    logsigmoid = _module("logsigmoid")
    forward = _function(logsigmoid, "_forward")
    assert "softplus" not in forward and "log1p" not in forward and forward.count("torch.log(") == 1


def test_a_structured_backward_that_is_one_aten_kernel_runs_eagerly(tmp_path, monkeypatch):
    module = _module("tanh_op")
    assert "grad_x = torch.ops.aten.tanh_backward(grad_output, out)" in _function(module, "_backward")
    assert "_fused_backward" not in module and "gradients = staticmethod(_backward)" in module
    write_files(generate_op(SPECS["tanh_op"]), tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("tanh_op")
    try:
        x = torch.randn(3, 4, requires_grad=True)
        out = module.tanh_op(x)
        (grad,) = torch.autograd.grad(out, x, torch.ones_like(out))
        assert len(module._fused_forward.compiled) == 1 and None not in module._fused_forward.compiled.values()
        torch.testing.assert_close(out, torch.tanh(x))
        torch.testing.assert_close(grad, 1 - torch.tanh(x) ** 2)
    finally:
        sys.modules.pop("tanh_op", None)


@pytest.mark.parametrize("forward", ["tanh(x)", "1 / (1 + exp(-x))", "exp(x)"])
@pytest.mark.parametrize("policy", ["memory", "time"])
def test_the_structured_path_saves_the_output_its_derivative_is_written_in(forward, policy):
    # as the elementwise plan does and a hand-written Function would: tanh's backward reads out, not x and
    # tanh(x) computed again
    plan = compile_op(make_spec("op", forward, policy=policy)).plan
    assert plan.saved == ("out",) and plan.recomputed == ()


def _forced_fused_ops(folder: Path) -> GeneratedRun:
    # gradcheck, gradgradcheck through the derived double backward, torch.func, the reference, the extremes;
    # div keeps 1/y as a hidden output, whose gradient reaches the derived double backward's Function too
    for spec in (SPECS["swish"], SPECS["tanh_op"], DIV):
        write_files(generate_op(spec), folder)
    return GeneratedRun(folder)


@background_run(_forced_fused_ops)
def test_generated_tests_of_structured_fused_ops_pass(background_results):
    result = background_results
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


@pytest.mark.parametrize(("policy", "saved"), [("memory", ("w", "x")), ("time", ("w", "x", "out"))])
def test_an_output_read_in_place_of_a_product_only_under_time(policy, saved):
    # tanh(w @ x): under "memory" w @ x is computed again in backward and nothing of its size kept; under "time"
    # backward reads the output, tanh_backward(grad, out), not the product kept and tanh of it computed again
    spec = make_spec("matvec", "tanh(w @ x)", {"w": {"shape": [8, 16]}, "x": {"shape": [16]}}, policy=policy)
    plan = compile_op(spec).plan
    assert plan.saved == saved and plan.hidden == ()
