"""Saved intermediates: backward reads a value of the forward instead of recomputing it, returned by forward as
a hidden output (so that a second derivative reaches it through the Function's own backward)."""

from __future__ import annotations

from pathlib import Path

import torch

from scaffold import compile_op, generate_op, write_files

from .conftest import GeneratedRun, background_run, import_generated, make_spec

TWO = {"input": {"shape": [3, 4]}, "target": {"shape": [3, 4]}}


def test_a_difference_is_saved_instead_of_both_inputs():
    plan = compile_op(make_spec("mse", "(input - target)**2", TWO)).plan
    # one tensor of the inputs' shape kept instead of two: half the bytes
    assert plan.forward[0] == "tmp0 = input - target" and plan.saved == ("tmp0",) and plan.hidden == ("tmp0",)
    # its own gradient: +1 into input, -1 into target
    backward = [line.text for line in plan.backward]
    assert "grad_input = grad_tmp0.sum_to_size(input_shape)" in backward, backward
    assert "grad_target = (-grad_tmp0).sum_to_size(target_shape)" in backward, backward


def test_fused_recomputes_a_difference_rather_than_write_and_read_it():
    # Fused forward and backward are two compiled kernels: a hidden output is written by one and read by the
    # other (three passes), where reading both inputs again is two; the plan minimizes what they move.
    plan = compile_op(make_spec("mse", "(input - target)**2", TWO, fuse=True)).plan
    assert plan.saved == ("input", "target") and plan.hidden == ()
    assert "tmp0 = input - target" not in plan.forward
    # a difference of three inputs moves as much kept as recomputed: kept, it saves backward's work
    three = {n: {"shape": [3, 4]} for n in "xyz"}
    assert compile_op(make_spec("sum3", "(x - y + z)**2", three, fuse=True)).plan.saved == ("tmp0",)


def test_no_intermediate_where_it_saves_nothing():
    assert compile_op(make_spec("sq", "x**2")).plan.hidden == ()
    assert compile_op(make_spec("ex", "exp(x)")).plan.hidden == ()  # the output itself is cheaper


def test_the_functional_and_module_return_the_output_alone(tmp_path):
    module = import_generated(tmp_path, make_spec("log_cosh_h", "log(cosh(input - target))", TWO))
    x, y = (torch.randn(3, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out = module.log_cosh_h(x, y)
    assert isinstance(out, torch.Tensor) and out.shape == (3, 4)
    assert isinstance(module.LogCoshH()(x, y), torch.Tensor)
    # first and second derivatives match autograd of the formula, through the saved intermediate
    expected = torch.log(torch.cosh(x - y))
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    (ex,) = torch.autograd.grad(expected.sum(), x, create_graph=True)
    torch.testing.assert_close(gx, ex)
    torch.testing.assert_close(torch.autograd.grad(gx.sum(), (x, y)), torch.autograd.grad(ex.sum(), (x, y)))


def _saved_intermediates_ops(folder: Path) -> GeneratedRun:
    ops = [
        make_spec("mse", "(input - target)**2", TWO),
        make_spec("lerp_op", "x + w*(y - x)", {"x": {"shape": [3, 4]}, "y": {"shape": [3, 4]}, "w": {"shape": [4]}}),
        make_spec("log_cosh", "log(cosh(input - target))", TWO),
        make_spec("sum3_fused", "(x - y + z)**2", {n: {"shape": [3, 4]} for n in "xyz"}, fuse=True),
        make_spec("scaled_mse", "a*(input - target)**2", {**TWO, "a": {"shape": [], "learnable": True}}),
    ]
    for spec in ops:
        assert compile_op(spec).plan.hidden, spec.name
        write_files(generate_op(spec), folder)
    return GeneratedRun(folder)


@background_run(_saved_intermediates_ops)
def test_generated_tests_of_ops_with_saved_intermediates_pass(background_results):
    result = background_results
    assert result.returncode == 0, result.stdout[-4000:]


def test_a_kept_step_keeps_the_users_name():
    plan = compile_op(make_spec("mse_d", "d = input - target\nd**2", TWO)).plan
    assert plan.forward[0] == "d = input - target" and plan.saved == ("d",) and plan.hidden == ("d",)
    assert "grad_d = 2 * d * grad_output" in [line.text for line in plan.backward]
    source = generate_op(make_spec("mse_d", "d = input - target\nd**2", TWO))["mse_d.py"]
    assert "def backward(ctx, grad_output, grad_d_returned):" in source and "out, d = output" in source
