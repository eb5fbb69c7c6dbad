"""scaffold.testing, the generated tests' library, where its behaviour is its own (the checks themselves are
exercised by running generated tests, tests/test_broken.py breaking them)."""

from __future__ import annotations

import pytest
import torch

from scaffold import testing
from scaffold.testing import Input, OpTests


def _double(x):
    return 2 * x


def _op_tests(*inputs: Input) -> OpTests:
    return OpTests(torch.autograd.Function, _double, torch.nn.Identity, _double, inputs=list(inputs))


OP = _op_tests(Input("x", (3,)))


def test_a_backend_that_cannot_compile_skips_the_compile_check_saying_why(monkeypatch):
    # Inductor without a C++ compiler says nothing about the op: a skip with the reason, not a red test.
    monkeypatch.setattr(testing, "COMPILE_BACKEND", "no_such_backend")
    with pytest.raises(pytest.skip.Exception, match="no_such_backend backend does not work here .*Invalid"):
        OP.check_compile("cpu")


def test_a_working_backend_compiles_the_op():
    assert testing._backend_unavailable("aot_eager", "cpu") == ""
    OP.check_compile("cpu")


def test_extreme_columns_take_each_value_of_each_input():
    op = _op_tests(Input("x", (3,), extremes=(-1.0, 2.0)), Input("y", (), typical=0.5, extremes=(3.0,)))
    rows = {tuple(row) for row in torch.stack(op.extreme_columns()).T.tolist()}
    assert {(-1.0, 0.5), (2.0, 0.5), (1.0, 3.0)} <= rows


class _HalfIntermediate(torch.autograd.Function):
    """x**-6 / 1000 in float32, its backward through x**-7 in float16: inf wherever x**-7 is past 65504 (x <
    0.206), though the gradient itself fits float16 down to x = 0.097."""

    @staticmethod
    def forward(x):
        return x.float() ** -6 / 1000

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return (grad.half() * x.half() ** -7 * -0.006).to(x.dtype)


def _steep(x):
    with torch.autocast(x.device.type, enabled=False):
        return x.float() ** -6 / 1000


def test_autocast_allows_a_gradient_past_the_dtypes_range_and_only_that(monkeypatch):
    # Lennard-Jones' gradient in r is past float16's 65504 for small r: inf there, as autograd's own would be.
    # An op whose gradient is inf where the true one fits (a float16 intermediate) still fails.
    monkeypatch.setattr(testing, "AUTOCAST_DTYPES", {"cpu": torch.float16})
    x = Input("x", (40,), low=0.05, high=1.0)
    reference = lambda x: x**-6 / 1000  # noqa: E731 - the reference's form
    OpTests(torch.autograd.Function, _steep, torch.nn.Identity, reference, inputs=[x]).check_autocast("cpu")
    broken = OpTests(torch.autograd.Function, _HalfIntermediate.apply, torch.nn.Identity, reference, inputs=[x])
    with pytest.raises(AssertionError, match="gradient of x under autocast is not finite where it fits"):
        broken.check_autocast("cpu")


def _entropy_as_written(p):
    return -(p * torch.log(p)).sum(-1)


def _entropy(p):
    return -torch.special.xlogy(p, p).sum(-1)


def test_a_structured_op_is_checked_at_its_special_points():
    # Entropy's p log p is 0 at p = 0, where the formula as written is 0 * -inf = nan: the reference's limit
    # is finite there, so an op that returns nan fails; one that takes the limit passes.
    p = Input("p", (3, 4), low=0.0, high=1.0, typical=0.5, special=(0.0, 1.0))
    testing.ProgramTests(
        torch.autograd.Function, _entropy, torch.nn.Identity, _entropy, inputs=[p]
    ).check_special_points("cpu")
    naive = testing.ProgramTests(torch.autograd.Function, _entropy_as_written, torch.nn.Identity, _entropy, inputs=[p])
    with pytest.raises(AssertionError, match=r"value at p = 0.0 at every element is not finite where the reference is"):
        naive.check_special_points("cpu")


def _sinc_rows(x):
    return torch.sinc(x / torch.pi).sum(-1)


def _sinc_rows_as_written(x):
    return (torch.sin(x) / x).sum(-1)


def test_a_structured_op_is_compared_with_the_references_limit_where_that_is_0_over_0():
    # sin(x)/x in a row sum is 0/0 at x = 0 as written, and so is the reference: there it is compared with its
    # limit (1 an element, derivative 0), so an op that computes it as written (nan) fails, and one that takes
    # the limit passes, with every element at 0 and with every other one.
    x = Input("x", (3, 4), special=(0.0,))
    OpTests(
        torch.autograd.Function, _sinc_rows, torch.nn.Identity, _sinc_rows_as_written, inputs=[x], elementwise=False
    ).check_special_points("cpu")
    naive = OpTests(
        torch.autograd.Function,
        _sinc_rows_as_written,
        torch.nn.Identity,
        _sinc_rows_as_written,
        inputs=[x],
        elementwise=False,
    )
    with pytest.raises(AssertionError, match=r"value at x = 0.0 at every element is not finite where the reference is"):
        naive.check_special_points("cpu")


def _relu_near_the_top(x):
    return torch.relu(x - 2.83)


def test_inputs_are_drawn_again_where_a_gradient_would_be_zero_everywhere():
    # An elementwise op's inputs, as a structured op's: with 8 elements drawn from [-3, 3], the first draw
    # (seed 0) keeps every x below 2.83, where this relu is off and a test of its gradient proves nothing;
    # another seed is drawn until some x is above it.
    x = Input("x", (8,))
    op = OpTests(torch.autograd.Function, _relu_near_the_top, torch.nn.Identity, _relu_near_the_top, inputs=[x])
    (drawn,) = op.make_inputs("cpu")
    assert bool((drawn > 2.83).any()), drawn
