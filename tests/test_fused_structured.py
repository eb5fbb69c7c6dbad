"""Fused mode (``fuse = true``) through the structured path (rules -> dataflow -> program_op.py.j2): an
elementwise op forced there (scripts/one_pipeline_probe.py's structured_path) gets what the elementwise path's
fused code has. The sigmoid pair from one exp (plan._one_exponential) and its ``_neg_abs``, softplus from an exp
and a log (plan._one_logarithm), erf beside its exponential (plan._erf_beside_exponential), a backward that is one
ATen kernel run eagerly (plan.one_derivative_kernel), and the derived double backward whose Function's forward
is the compiled backward.
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

_PROBE = Path(__file__).resolve().parent.parent / "scripts" / "one_pipeline_probe.py"
_spec = importlib.util.spec_from_file_location("one_pipeline_probe", _PROBE)
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)

SWISH = {"x": {}, "beta": {"shape": [], "learnable": True, "init": 1.0}}
SPECS = {
    "swish": make_spec("swish", "x / (1 + exp(-beta*x))", SWISH, fuse=True),
    "mish": make_spec("mish", "x*tanh(log(1 + exp(x)))", fuse=True),
    "gelu_erf": make_spec("gelu_erf", "x/2*(1 + erf(x/sqrt(2)))", fuse=True),
    "logsigmoid": make_spec("logsigmoid", "-log(1 + exp(-x))", fuse=True),
    "tanh_op": make_spec("tanh_op", "tanh(x)", fuse=True),
}
DIV = make_spec("div", "x/y", {"x": {}, "y": {"shape": [4, 1], "domain": [0.5, 3.0]}}, fuse=True)
#: The calls whose number in _forward and _backward says which fused forms the code computes.
CALLS = ("torch.exp(", "torch.log(", "torch.erf(", "torch.sigmoid(", "torch.tanh(", "_neg_abs(", "softplus", "log1p")


def _both(name: str) -> tuple[str, str]:
    """The op's module through the elementwise path, and forced through the structured path."""
    normal = generate_op(SPECS[name])[f"{name}.py"]
    with probe.structured_path():
        forced = generate_op(SPECS[name])[f"{name}.py"]
    return normal, forced


def _function(text: str, name: str) -> str:
    match = re.search(rf"^def {name}\(.*?(?=^\S)", text, re.S | re.M)
    assert match, name
    return match.group(0)


def _features(text: str) -> dict[str, object]:
    """The calls in _forward and _backward, and which compiled functions and helpers the module defines."""
    features: dict[str, object] = {
        f"{function}: {call}": _function(text, function).count(call)
        for function in ("_forward", "_backward")
        for call in CALLS
    }
    features["aten kernels in _backward"] = re.findall(r"torch\.ops\.aten\.(\w+)", _function(text, "_backward"))
    features["_fused_backward"] = "_fused_backward = _runtime.Fused(_backward" in text
    features["def _neg_abs"] = "def _neg_abs(t):" in text
    features["double backward runs"] = re.findall(r"gradients = staticmethod\((\w+)\)", text)
    return features


@pytest.mark.parametrize("name", list(SPECS))
def test_the_structured_path_computes_what_the_elementwise_path_fuses(name):
    normal, forced = _both(name)
    assert _features(forced) == _features(normal)


def test_structured_fused_swish_takes_its_sigmoid_pair_from_one_exp():
    _, forced = _both("swish")
    backward = _function(forced, "_backward")
    assert "sigmoid" not in backward and backward.count("torch.exp(_neg_abs(") == 1
    assert "def _neg_abs(t):" in forced
    # the derived double backward's Function runs the compiled gradients as its forward
    assert "gradients = staticmethod(_fused_backward)" in forced
    assert "return _gradients(ctx.needs_input_grad, grad_output, x, beta" in forced


def test_a_hidden_outputs_gradient_goes_through_the_derived_double_backward_too():
    # div's 1/y is a hidden output: its gradient (None but in a second derivative) is an argument of
    # _fused_backward, which _DivBackward runs as its forward
    with probe.structured_path():
        text = generate_op(DIV)["div.py"]
    assert "return out, inverse" in _function(text, "_forward")
    assert "gradients = staticmethod(_fused_backward)" in text
    assert re.search(r"return _gradients\(\s*ctx\.needs_input_grad, grad_output, grad_inverse_returned", text)


def test_structured_fused_gelu_squares_erfs_argument_and_logsigmoid_takes_one_log():
    _, gelu = _both("gelu_erf")
    backward = _function(gelu, "_backward")
    assert "gelu_backward" not in backward
    temporary = backward.split("torch.erf(")[1].split(")")[0]
    assert f"torch.exp(-({temporary}**2))" in backward, backward
    _, logsigmoid = _both("logsigmoid")
    forward = _function(logsigmoid, "_forward")
    assert "softplus" not in forward and "log1p" not in forward and forward.count("torch.log(") == 1


def test_a_structured_backward_that_is_one_aten_kernel_runs_eagerly(tmp_path, monkeypatch):
    _, forced = _both("tanh_op")
    assert "grad_x = torch.ops.aten.tanh_backward(grad_output, out)" in _function(forced, "_backward")
    assert "_fused_backward" not in forced and "gradients = staticmethod(_backward)" in forced
    with probe.structured_path():
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
    with probe.structured_path():
        plan = compile_op(make_spec("op", forward, policy=policy)).plan
    assert plan.saved == ("out",) and plan.recomputed == ()


def _forced_fused_ops(folder: Path) -> GeneratedRun:
    # gradcheck, gradgradcheck through the derived double backward, torch.func, the reference, the extremes;
    # div keeps 1/y as a hidden output, whose gradient reaches the derived double backward's Function too
    with probe.structured_path():
        for spec in (SPECS["swish"], SPECS["gelu_erf"], SPECS["tanh_op"], DIV):
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
