"""The sympy -> torch printer, checked numerically against sympy (not only as strings)."""

from __future__ import annotations

import math

import pytest
import sympy
import torch
from sympy import Abs, Heaviside, Max, Min, Piecewise, Rational, sign, sqrt
from sympy.codegen.cfunctions import expm1, hypot, log1p

from scaffold import stable
from scaffold.errors import DerivationError
from scaffold.printing import TorchPrinter, print_torch
from scaffold.stable import kept, to_literal

x, y = sympy.symbols("x y", real=True)
alpha = sympy.Symbol("alpha", real=True)
ALPHA = 0.75
TENSORS = {"x", "y"}


def evaluate(
    expr: sympy.Expr, xs: torch.Tensor, ys: torch.Tensor, finite: frozenset[str] = frozenset()
) -> torch.Tensor:
    code = print_torch(expr, TENSORS, where="test", finite=finite).text
    value = eval(code, {"torch": torch, "math": math}, {"x": xs, "y": ys, "alpha": ALPHA})  # our own output
    return torch.as_tensor(value, dtype=xs.dtype).expand(torch.broadcast_shapes(xs.shape, ys.shape))


def reference(expr: sympy.Expr, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    f = sympy.lambdify((x, y), to_literal(expr).subs(alpha, ALPHA), modules="mpmath")
    values = [float(sympy.re(sympy.N(f(a, b), 20))) for a, b in zip(xs.tolist(), ys.tolist())]
    return torch.tensor(values, dtype=torch.float64)


# (expression, x values, y values): grids include kinks (0, alpha) on purpose
GRID = torch.tensor([-2.5, -1.0, -0.25, 0.0, 0.5, 0.75, 1.0, 2.0], dtype=torch.float64)
POSITIVE = torch.tensor([0.1, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0], dtype=torch.float64)
UNIT = torch.tensor([-0.9, -0.5, -0.1, 0.0, 0.2, 0.5, 0.75, 0.95], dtype=torch.float64)
CASES = [
    (Max(x, 0), GRID, GRID),
    (Max(x, alpha), GRID, GRID),
    (Max(x, y, 1), GRID, GRID.flip(0)),
    (Min(x, 2, alpha), GRID, GRID),
    (Min(Max(x, -1), 1), GRID, GRID),
    (Max(alpha, 2) * x, GRID, GRID),
    (Heaviside(x), GRID, GRID),
    (Heaviside(x, 0), GRID, GRID),
    (Heaviside(x, 1), GRID, GRID),
    (Heaviside(x - alpha, Rational(1, 4)), GRID, GRID),
    (Heaviside(x) * y, GRID, GRID.flip(0)),
    (sign(x) + Abs(x), GRID, GRID),
    (sign(alpha) * x + Abs(alpha - 2) * x, GRID, GRID),
    (Piecewise((sqrt(x), x > 0), (0, True)), GRID, GRID),
    (Piecewise((1, x > 0), (Rational(1, 4), True)), GRID, GRID),
    (Piecewise((x, x < -1), (x**2, x < 1), (2 * x - 1, True)), GRID, GRID),
    (Piecewise((x, alpha > 0), (-x, True)), GRID, GRID),
    (Piecewise((x, (x > 0) & (y > 0)), (y, True)), GRID, GRID.flip(0)),
    (sympy.polygamma(0, x) + sympy.polygamma(2, x), POSITIVE, POSITIVE),
    (sympy.loggamma(x) * sympy.exp(alpha), POSITIVE, POSITIVE),
    (x ** Rational(1, 3) + 1 / sqrt(x) + x ** Rational(-3, 2), POSITIVE, POSITIVE),
    (x**y, POSITIVE, GRID),
    # a value kept whole prints in parentheses where Python would regroup it: (x**y)**2, not x**y**2
    (kept(x**y) ** 2 + x * kept(x * y) ** 3 - 1 / kept(x + y) + 2 ** kept(x**y), POSITIVE, POSITIVE),
    (2**x + sympy.E**x + sympy.pi * x, GRID, GRID),
    (log1p(x) + expm1(x), POSITIVE, POSITIVE),
    (hypot(x, y) + sympy.atan2(y, x), GRID, GRID.flip(0)),
    (sympy.erfinv(x) + sympy.atanh(x) + sympy.asin(x), UNIT, UNIT),
    (sympy.erf(x) + sympy.erfc(x * alpha), GRID, GRID),
    (sympy.log(x, 2) + sympy.acosh(x + 1), POSITIVE, POSITIVE),
    (x / (1 + sympy.exp(-alpha * x)), GRID, GRID),
    (-x / 3 + Rational(3, 2) * x * y, GRID, GRID),
    (
        sympy.cot(x) + sympy.sec(x) * sympy.csc(x) + sympy.cot(alpha) * x + x / sympy.cot(x) + sympy.sec(x) ** 2,
        POSITIVE,
        POSITIVE,
    ),
]


@pytest.mark.parametrize(("expr", "xs", "ys"), CASES, ids=[sympy.sstr(c[0]) for c in CASES])
def test_printed_code_matches_sympy(expr, xs, ys):
    torch.testing.assert_close(evaluate(expr, xs, ys), reference(expr, xs, ys))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_steps_and_cases_keep_the_input_dtype(dtype):
    xs = GRID.to(dtype)
    for expr in (Heaviside(x), Heaviside(x, 0), Piecewise((1, x > 0), (Rational(1, 10), True)), sign(x)):
        assert evaluate(expr, xs, xs).dtype == dtype, expr


def test_piecewise_gradient_has_no_nan_from_the_untaken_branch():
    for expr in (
        Piecewise((sympy.log(x), x > 0), (0, True)),
        Piecewise((0, x <= 0), (sqrt(x), True)),
        Piecewise((x, x < 2), (sympy.acosh(x), True)),
    ):
        xs = GRID.clone().requires_grad_()
        out = evaluate(expr, xs, xs)
        (grad,) = torch.autograd.grad(out.sum(), xs, create_graph=True)
        (grad2,) = torch.autograd.grad(grad.sum(), xs)
        assert torch.isfinite(grad).all() and torch.isfinite(grad2).all(), expr


def test_step_selects_where_what_it_multiplies_may_overflow():
    # y may be anything (not known finite): where(), never inf * 0
    code = print_torch(Heaviside(x, 0) * y, TENSORS, where="test").text
    assert code == "torch.where(x > 0, y, 0)"
    code = print_torch(Heaviside(1 - x, 0) * Heaviside(x + 2, 1) * y, TENSORS, where="test").text
    assert code == "torch.where((x < 1) & (x >= -2), y, 0)"
    # exp(x) * step(-x) at x = 100 in float32: inf * 0 would be nan, even with x itself finite
    code = print_torch(sympy.exp(x) * Heaviside(-x, 0), TENSORS, where="test", finite=TENSORS).text
    assert code.startswith("torch.where(x < 0, ")
    xs = torch.tensor([-1.0, 100.0])
    expected = torch.tensor([math.exp(-1), 0.0])
    torch.testing.assert_close(evaluate(sympy.exp(x) * Heaviside(-x, 0), xs, xs, finite=TENSORS), expected)
    code = print_torch(Max(x, 0) + Max(x, y) + Min(x, alpha), TENSORS, where="test").text
    assert code == "torch.clamp(x, min=0) + torch.maximum(x, y) + torch.clamp(x, max=alpha)"


def test_step_multiplies_as_a_mask_where_what_it_multiplies_is_finite():
    # a hand-written Function's grad_output * (x > 0): one multiply, not a where() (twice as slow on a CPU)
    code = print_torch(Heaviside(x, 0) * y, TENSORS, where="test", finite=TENSORS).text
    assert code == "y * (x > 0)"
    code = print_torch(Heaviside(1 - x, 0) * Heaviside(x + 2, 1) * y, TENSORS, where="test", finite=TENSORS).text
    assert code == "y * ((x < 1) & (x >= -2))"
    # bounded factors are finite: tanh(x) * step
    expr = sympy.tanh(x) * y * Heaviside(x - 1, 0)
    assert print_torch(expr, TENSORS, where="test", finite=TENSORS).text == "y * torch.tanh(x) * (x > 1)"
    # a saved bool mask (an indicator) multiplies too
    mask = sympy.Symbol("mask")
    code = print_torch(
        Piecewise((1, mask), (0, True)) * y, TENSORS | {"mask"}, where="test", bools={"mask"}, finite={"y"}
    )
    assert code.text == "y * mask"
    xs, ys = GRID, GRID.flip(0)
    for expr in (Heaviside(x, 0) * y, Heaviside(-x, 1) * y * x, Heaviside(1 - x, 0) * Heaviside(x + 2, 1) * y):
        torch.testing.assert_close(evaluate(expr, xs, ys, finite=TENSORS), reference(expr, xs, ys))


def test_heaviside_prints_as_a_comparison_with_its_value_at_zero():
    # not sign arithmetic ((1 + torch.sign(x)) / 2): the step as the comparison it is
    assert print_torch(Heaviside(x, 0), TENSORS, where="test").text == "(x > 0).to(x.dtype)"
    assert print_torch(Heaviside(x, 1), TENSORS, where="test").text == "(x >= 0).to(x.dtype)"
    code = print_torch(Heaviside(1 - Abs(x)), TENSORS, where="test").text
    assert code == "torch.where(torch.abs(x) == 1, 0.5, (torch.abs(x) < 1).to(x.dtype))"
    xs = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(evaluate(Heaviside(1 - Abs(x)), xs, xs), reference(Heaviside(1 - Abs(x)), xs, xs))
    assert evaluate(Heaviside(1 - Abs(x)), xs, xs).tolist() == [0.0, 0.5, 1.0, 0.5, 0.0]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        (sympy.gamma(x), "gamma(x) has no torch translation"),
        (sympy.Derivative(sympy.Function("f")(x), x), "sympy leaves Derivative(f(x), x) unevaluated"),
        (sympy.DiracDelta(x), "DiracDelta(x) has no torch translation"),
        (x + sympy.I, "not a finite real number"),
        (sympy.zeta(x), "zeta(x) has no torch translation"),
    ],
)
def test_untranslatable_nodes_are_named(expr, message):
    with pytest.raises(DerivationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        print_torch(expr, TENSORS, where="test")


def test_the_printers_errors_are_reported_where_the_caller_says():
    # The printer knows the sub-expression, not the formula: print_torch's error context supplies it.
    incomplete = sympy.Piecewise((x, x > 0), (y, x < -1))
    with pytest.raises(DerivationError) as raised:
        TorchPrinter(TENSORS).doprint(incomplete)
    assert raised.value.where is None
    with pytest.raises(DerivationError, match=r"^the forward: Piecewise\(.*has no value where none of its conditions"):
        print_torch(incomplete, TENSORS, where="the forward")


def test_a_number_where_a_condition_holds_is_selected_by_where_not_a_cloning_masked_fill():
    # t.masked_fill(c, 0) clones t, then fills it: two passes where torch.where makes one (4M float32
    # elements, one CPU thread: 6.2 ms against 3.0 ms); stage 6b (inplace) fills a fresh t in place instead
    guard = Piecewise((0, sympy.And(sympy.Eq(x, 0), sympy.Eq(y, 0))), (sympy.log(x), True))
    assert print_torch(guard, TENSORS, where="test").text == "torch.where((x == 0) & (y == 0), 0, torch.log(x))"
    fill = Piecewise((1, x > 0), (alpha * y, True))
    assert print_torch(fill, TENSORS, where="test").text == "torch.where(x > 0, 1, alpha * y)"
    xs = torch.tensor([0.0, 0.0, 0.5, 2.0], dtype=torch.float64)
    ys = torch.tensor([0.0, 1.0, 0.0, -1.0], dtype=torch.float64)
    expected = torch.tensor([0.0, -math.inf, math.log(0.5), math.log(2.0)], dtype=torch.float64)
    torch.testing.assert_close(evaluate(guard, xs, ys), expected)
    torch.testing.assert_close(evaluate(fill, xs, ys), torch.tensor([0.0, ALPHA, 1.0, 1.0], dtype=torch.float64))
    # the number takes the tensor's dtype, as masked_fill gave it
    code = print_torch(guard, TENSORS, where="test").text
    assert eval(code, {"torch": torch}, {"x": xs.float(), "y": ys.float()}).dtype == torch.float32  # our own output


def test_the_derivatives_of_xlogy_share_one_guarded_argument():
    # Each derivative guarded on its own was a torch.where per derivative: binary cross-entropy's backward was
    # 1.76x plain autograd's time, 1.59x with one guarded argument per logarithm (4M float32, one CPU thread).
    for kind, pole, safe in ((stable.xlogy, 0, 1), (stable.xlog1py, -1, 0)):
        expr = kind(x, y)
        partials = [sympy.diff(expr, x), sympy.diff(expr, y)]
        argument = stable.log_argument(pole, safe, y, x)
        assert all(p.has(argument) and not p.has(Piecewise) for p in partials), partials
        # a pole at 0 is tested by logical_or, one kernel where (x == 0) & (y == 0) is three
        printed = "torch.where((x == 0) & (y == -1), 0, y)"
        if pole == 0:
            printed = "torch.where(torch.logical_or(y, x), y, 1)"
        assert print_torch(argument, TENSORS, where="test").text == printed
        # exact: 0 where x = 0 and y is the pole (the convention); the log's pole where only y is at it
        xs = torch.tensor([0.0, 0.0, 0.5, 2.0], dtype=torch.float64)
        ys = torch.tensor([pole, 0.5, pole, 3.0], dtype=torch.float64)
        log = torch.log if pole == 0 else torch.log1p
        d_x = torch.where((xs == 0) & (ys == pole), 0, log(ys))
        d_y = torch.where(xs == 0, 0, xs / (ys - pole))
        for partial, expected in zip(partials, (d_x, d_y)):
            torch.testing.assert_close(evaluate(partial, xs, ys), expected)


def test_xlogy_is_computed_with_vectorized_kernels():
    # torch.xlogy has no vectorized CPU kernel: 3x torch.log's time (binary cross-entropy's fwd+bwd 1.72x plain
    # autograd's with it, 1.64x without)
    expr = stable.xlogy(1 - y, x)
    assert print_torch(expr, TENSORS, where="test").text == "torch.where(y == 1, 0, (1 - y) * torch.log(x))"
    xs = torch.tensor([0.0, 0.5, 0.0, 0.0, 2.0], dtype=torch.float64)
    ys = torch.tensor([0.5, 0.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(evaluate(expr, xs, ys), torch.xlogy(1 - ys, xs))
    assert evaluate(expr, xs, ys)[2] == 0  # 0 * log(0): 0, as xlogy gives, not nan
    # where log(y) is finite the product is 0 where x is: no guard
    assert print_torch(stable.xlogy(y, 1 + x**2), TENSORS, where="test").text == "y * torch.log(x**2 + 1)"
    # a weight compared with 0 is printed twice: only a tensor, or one plus a number
    assert print_torch(stable.xlogy(x * y, x), TENSORS, where="test").text == "torch.xlogy(x * y, x)"


def test_xlog1py_is_computed_with_vectorized_kernels():
    # torch.special.xlog1py has no vectorized CPU kernel: binary cross-entropy's forward was 2.4x plain autograd's
    expr = stable.xlog1py(1 - y, -x)
    assert print_torch(expr, TENSORS, where="test").text == "torch.where(y == 1, 0, (1 - y) * torch.log1p(-x))"
    xs = torch.tensor([0.0, 0.5, 1.0, 1.0, 0.25], dtype=torch.float64)
    ys = torch.tensor([0.5, 0.0, 1.0, 0.5, 1.0], dtype=torch.float64)
    torch.testing.assert_close(evaluate(expr, xs, ys), torch.special.xlog1py(1 - ys, -xs))
    assert evaluate(expr, xs, ys)[2] == 0  # 0 * log1p(-1): 0, as xlog1py gives, not nan
    # where log1p(y) is finite the product is 0 where x is: no guard
    assert print_torch(stable.xlog1py(y, Abs(x)), TENSORS, where="test").text == "y * torch.log1p(torch.abs(x))"
