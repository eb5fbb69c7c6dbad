"""Generated ops written as textbook formulas are as robust as PyTorch's own ops at extreme inputs.

Each case is a forward as a user would write it from a paper (``log(1 + exp(x))``), and the native op
(``F.softplus``). On a grid of float32 inputs from -1e4 to 1e4 (and tiny and huge positives where the
domain is positive), wherever the native op's value or gradient is finite, the generated op's must be
finite too and agree with the native op computed in float64. The literal formulas fail this:
``log(1 + exp(x))`` is inf at x = 100 and its gradient nan.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from scaffold import generate_op, write_files

from .conftest import make_spec

REAL = (-1e4, -1000.0, -100.0, -88.0, -30.0, -10.0, -2.5, -1.0, -0.3, -1e-3, 1e-3, 0.3, 1.0, 2.5, 10.0, 30.0)
REAL += (88.0, 100.0, 1000.0, 1e4)
POSITIVE = (1e-30, 1e-6, 1e-3, 0.3, 1.0, 2.5, 10.0, 100.0, 1e4, 1e30)
UNIT = (1e-6, 1e-3, 0.1, 0.5, 0.9, 1 - 1e-3, 1 - 2**-20)
UNIT_EXPONENTS = (0.0, 0.5, 1.0, 1.5, 3.0)
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
_ELU = "Piecewise((x, x > 0), (exp(x) - 1, True))"


@dataclass(frozen=True)
class Case:
    name: str
    forward: str
    native: Callable[..., torch.Tensor]
    values: dict[str, tuple[float, ...]]  # candidate values of each tensor
    scalars: dict = field(default_factory=dict)
    # Values are compared by relative error, down to 1e-12 (below which the native ops' own float64
    # results are not exact: F.binary_cross_entropy_with_logits(-30., 0.) is 9.24e-14, not 9.36e-14).
    value_atol: float = 1e-12


def _log_cosh(x):
    return x + F.softplus(-2 * x) - math.log(2)


def _log_softplus(x):
    # log(softplus(x)) = x + log(1 - exp(x)/2 + ...) below -30, where softplus(x) is exp(x) to 1e-13
    low = x.clamp(max=-30)
    return torch.where(x < -30, low + torch.log1p(-torch.exp(low) / 2), torch.log(F.softplus(x.clamp(min=-30))))


CASES = [
    Case("softplus", "log(1 + exp(x))", F.softplus, {"x": REAL}),
    Case("softplus_log1p", "log1p(exp(x))", F.softplus, {"x": REAL}),
    Case(
        "softplus_beta",
        "log(1 + exp(beta * x)) / beta",
        lambda x: F.softplus(x, beta=2.0),
        {"x": REAL},
        scalars={"beta": {"default": 2.0}},
    ),
    Case("sigmoid", "1 / (1 + exp(-x))", torch.sigmoid, {"x": REAL}),
    Case("sigmoid_exp_ratio", "exp(x) / (1 + exp(x))", torch.sigmoid, {"x": REAL}),
    Case("silu", "x / (1 + exp(-x))", F.silu, {"x": REAL}),
    Case("logsigmoid", "log(1 / (1 + exp(-x)))", F.logsigmoid, {"x": REAL}),
    Case("logsigmoid_neg_softplus", "-log(1 + exp(-x))", F.logsigmoid, {"x": REAL}),
    Case("log_one_minus_sigmoid", "log(1 - 1 / (1 + exp(-x)))", lambda x: F.logsigmoid(-x), {"x": REAL}),
    Case("logaddexp", "log(exp(a) + exp(b))", torch.logaddexp, {"a": REAL, "b": REAL}),
    Case(
        "logsumexp3",
        "log(exp(a) + exp(b) + exp(c))",
        lambda a, b, c: torch.logsumexp(torch.stack([a, b, c]), dim=0),
        {"a": REAL[::3], "b": REAL[1::3], "c": REAL[2::3]},
    ),
    Case(
        "two_class_cross_entropy",
        "-log(exp(a) / (exp(a) + exp(b)))",
        lambda a, b: F.softplus(b - a),
        {"a": REAL, "b": REAL},
    ),
    Case("softmax_weight", "exp(a) / (exp(a) + exp(b))", lambda a, b: torch.sigmoid(a - b), {"a": REAL, "b": REAL}),
    Case(
        "bce_with_logits",
        "-(y * log(1 / (1 + exp(-x))) + (1 - y) * log(1 - 1 / (1 + exp(-x))))",
        lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction="none"),
        {"x": REAL, "y": (0.0, 0.25, 1.0)},
    ),
    Case(
        "bce_with_logits_pos_weight",
        "-(w * y * log(1 / (1 + exp(-x))) + (1 - y) * log(1 - 1 / (1 + exp(-x))))",
        lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction="none", pos_weight=torch.tensor(3.0)),
        {"x": REAL, "y": (0.0, 0.25, 1.0)},
        scalars={"w": {"default": 3.0}},
    ),
    Case("logistic_loss", "log(1 + exp(-y * x))", lambda x, y: F.softplus(-y * x), {"x": REAL, "y": (-1.0, 1.0)}),
    Case(
        "focal_term",
        "-(1 - 1 / (1 + exp(-x)))**2 * log(1 / (1 + exp(-x)))",
        lambda x: -((1 - torch.sigmoid(x)) ** 2) * F.logsigmoid(x),
        {"x": REAL},
    ),
    Case("log1p", "log(1 + x)", torch.log1p, {"x": (-1 + 1e-6, -0.5, -1e-3, -1e-7, 1e-7, 1e-3, 1.0, 1e4, 1e30)}),
    Case("expm1", "exp(x) - 1", torch.expm1, {"x": (-100.0, -1.0, -1e-3, -1e-7, 1e-7, 1e-3, 1.0, 80.0)}),
    Case("one_minus_exp", "1 - exp(-x)", lambda x: -torch.expm1(-x), {"x": (-80.0, -1e-7, 1e-7, 1e-3, 100.0)}),
    Case("xlogy", "x * log(y)", torch.xlogy, {"x": (0.0, 1e-30, 0.5, 1e4), "y": (0.0, *POSITIVE)}),
    Case("entropy", "-p * log(p)", torch.special.entr, {"p": (1e-30, 1e-6, 0.5, 1.0, 10.0)}),
    Case("hypot", "sqrt(x**2 + y**2)", torch.hypot, {"x": REAL + (1e20, -1e25), "y": (-1e20, -3.0, 1e-3, 4.0, 1e25)}),
    Case("erfcx", "exp(x**2) * erfc(x)", torch.special.erfcx, {"x": (-5.0, -1.0, 0.5, 3.0, 10.0, 100.0, 1e4)}),
    Case(
        "log_ndtr",
        "log(erfc(-x / sqrt(2)) / 2)",
        torch.special.log_ndtr,
        {"x": (-100.0, -30.0, -10.0, -1.0, 0.5, 3.0, 10.0, 100.0)},
    ),
    Case("log_ndtr_erf", "log((1 + erf(x / sqrt(2))) / 2)", torch.special.log_ndtr, {"x": (-30.0, -5.0, 0.5, 30.0)}),
    Case("ndtr", "(1 + erf(x / sqrt(2))) / 2", torch.special.ndtr, {"x": (-30.0, -8.0, -1.0, 0.5, 8.0, 30.0)}),
    Case("gelu", "x * (1 + erf(x / sqrt(2))) / 2", F.gelu, {"x": REAL}),
    # Near x = 0 these are logarithms of numbers near 1: float32 gives them to about 1e-7, not relatively.
    Case(
        "log_erfc",
        "log(erfc(x))",
        lambda x: torch.special.log_ndtr(-math.sqrt(2) * x) + math.log(2),
        {"x": REAL},
        value_atol=1e-7,
    ),
    Case("logit", "log(p / (1 - p))", torch.logit, {"p": UNIT}),
    Case("mish", "x * tanh(log(1 + exp(x)))", F.mish, {"x": REAL}),
    Case("log_cosh", "log(cosh(x))", _log_cosh, {"x": REAL}, value_atol=1e-7),
    Case(
        "poisson_nll_log_input",
        "exp(x) - y * x",
        lambda x, y: F.poisson_nll_loss(x, y, log_input=True, full=False, reduction="none"),
        {"x": (-100.0, -10.0, 0.5, 10.0, 80.0), "y": (0.0, 1.0, 100.0)},
    ),
    # Derivative kernels multiplied by another tensor keep their relative accuracy in the tails: the
    # gradient of a learnable slope is x**2 * sigmoid'(u), and s * (1 - s) is 0 in float32 for u > 17.
    Case(
        "swish_slope",
        "x / (1 + exp(-2*beta*x))",
        lambda x, beta: x * torch.sigmoid(2 * beta * x),
        {"x": REAL, "beta": (-1.0, 1e-3, 0.5, 1.0, 10.0)},
    ),
    Case(
        "mish_slope",
        "x * tanh(log(1 + exp(beta*x)))",
        lambda x, beta: x * torch.tanh(F.softplus(beta * x)),
        {"x": REAL, "beta": (1e-3, 0.5, 1.0, 10.0)},
    ),
    Case("tanh_scaled", "tanh(w * x)", lambda w, x: torch.tanh(w * x), {"w": (-3.0, 1e-3, 0.5, 10.0), "x": REAL}),
    # 1 - sigmoid(x) is sigmoid(-x), also inside a power: the focal term divided 0 by 0 for |x| > 17.
    *(
        Case(
            f"focal_{name}",
            "(1 - 1/(1 + exp(-x)))**gamma * log(1/(1 + exp(-x)))",
            lambda x, gamma=gamma: torch.sigmoid(-x) ** gamma * F.logsigmoid(x),
            {"x": REAL},
            scalars={"gamma": {"default": gamma}},
        )
        for name, gamma in (("gamma2", 2.0), ("gamma_half", 0.5))
    ),
    Case(
        "focal_binary",
        "-y*(1 - 1/(1 + exp(-x)))**gamma*log(1/(1 + exp(-x)))"
        " - (1 - y)*(1/(1 + exp(-x)))**gamma*log(1 - 1/(1 + exp(-x)))",
        lambda x, y: (
            -y * torch.sigmoid(-x) ** 2.0 * F.logsigmoid(x) - (1 - y) * torch.sigmoid(x) ** 2.0 * F.logsigmoid(-x)
        ),
        {"x": REAL, "y": (0.0, 0.25, 1.0)},
        scalars={"gamma": {"default": 2.0}},
    ),
    # Powers with a symbolic exponent differentiate to n*x**(n - 1), finite at 0 (not n*x**n/x).
    *(
        Case(f"power_{name}", "x**n", lambda x, n=n: x**n, {"x": (0.0, *POSITIVE)}, scalars={"n": {"default": n}})
        for name, n in (("one", 1.0), ("three_halves", 1.5), ("five_halves", 2.5))
    ),
    Case(
        "abs_power",
        "Abs(x)**p",
        lambda x: x.abs() ** 1.5,
        {"x": (0.0, *REAL)},
        scalars={"p": {"default": 1.5}},
    ),
    # A power with a tensor exponent: at base 0, d/db is 0 for b >= 0 (PyTorch's convention, not
    # 1 * log(0) at b = 0), and (1 - x)**b * log(1 - x) is 0 at x = 1 (xlog1py), not 0 * -inf.
    Case(
        "tensor_exponent",
        "(1 - x)**b",
        lambda x, b: (1 - x) ** b,
        {"x": (0.0, 0.5, 1 - 1e-3, 1.0), "b": UNIT_EXPONENTS},
    ),
    # Pieces that join smoothly: CELU written as Max + Min has derivative 1 at 0, not 0 + 0; leaky ReLU
    # written the same way has PyTorch's slope at 0.
    Case(
        "celu_max_min",
        "Max(0, x) + Min(0, alpha*(exp(x/alpha) - 1))",
        lambda x: F.celu(x, alpha=1.5),
        {"x": (0.0, *REAL)},
        scalars={"alpha": {"default": 1.5}},
    ),
    Case("leaky_max_min", "Max(x, 0) + 0.01*Min(x, 0)", lambda x: F.leaky_relu(x, 0.01), {"x": (0.0, *REAL)}),
    # A power of a quotient: sympy expands (sigma/r)**12 into sigma**12 * r**-12, inf * 0 in float32.
    Case(
        "power_of_quotient",
        "(sigma/r)**12 - (sigma/r)**6",
        lambda r, sigma: (sigma / r) ** 12 - (sigma / r) ** 6,
        {"r": POSITIVE, "sigma": POSITIVE},
    ),
    # Zero times an overflowing exponential: Gaussian NLL with a log variance at y = mu, log_var = -100.
    Case(
        "gaussian_nll_log_var",
        "0.5*(log_var + (y - mu)**2*exp(-log_var))",
        lambda y, mu, log_var: 0.5 * (log_var + ((y - mu) * torch.exp(-log_var / 2)) ** 2),
        {"y": (-100.0, 0.0, 1.0, 1e4), "mu": (-100.0, 0.0, 1.0), "log_var": REAL},
    ),
    # softplus written the stable way by hand: two kinks at 0 that cancel; apart, each takes PyTorch's
    # convention (sign(0) = 0, relu'(0) = 0) and the gradient at 0 is 0, not 1/2.
    Case("softplus_by_hand", "log(1 + exp(-Abs(x))) + Max(x, 0)", F.softplus, {"x": (0.0, *REAL)}),
    Case(
        "bce_with_logits_by_hand",
        "Max(x, 0) - x*y + log(1 + exp(-Abs(x)))",
        lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction="none"),
        # not y = 1: there the value is x - x + softplus(-x), and sympy's order of terms (-x*y + softplus(x))
        # cancels in float32 (4.58e-5 at x = 10, truth 4.54e-5) where the native op does not
        {"x": (0.0, *REAL), "y": (0.0, 0.3)},
    ),
    # The log of a quotient of two (1 + exp(...)): split into two softplus, not inf/inf at x = 30.
    Case(
        "soft_clip",
        "log((1 + exp(a*x))/(1 + exp(a*(x - 1))))/a",
        lambda x: (F.softplus(5.0 * x) - F.softplus(5.0 * (x - 1))) / 5.0,
        {"x": REAL},
        scalars={"a": {"default": 5.0}},
    ),
    # Planck's law: the derivative's exp(x)/expm1(x)**2 is inf/inf at x = 100 in float32, 1/(expm1(x) *
    # -expm1(-x)) is 0. (At x = 0 the forward is 0/0, as the native formula's: not compared.)
    Case(
        "planck",
        "x**3/(exp(x) - 1)",
        lambda x: torch.where(
            x > 0,
            x.clamp(min=1e-30) ** 3 * torch.exp(-x.clamp(min=1e-30)) / -torch.expm1(-x.clamp(min=1e-30)),
            x.clamp(max=-1e-30) ** 3 / torch.expm1(x.clamp(max=-1e-30)),
        ),
        {"x": REAL},
    ),
    # The inverse softplus: log(expm1(x)) is inf at x = 100 in float32, x + log(-expm1(-x)) is not.
    Case("softplus_inverse", "log(exp(x) - 1)", lambda x: x + torch.log(-torch.expm1(-x)), {"x": POSITIVE}),
    # softplus underflows to 0 at x = -104 in float32 (-745 in float64): the derivative of sqrt(softplus(x)),
    # sigmoid(x)/(2*sqrt(softplus(x))), and of log(softplus(x)) was 0/0 there, log(softplus(x)) itself -inf.
    Case("sqrt_softplus", "sqrt(log(1 + exp(x)))", lambda x: torch.exp(_log_softplus(x) / 2), {"x": REAL}),
    Case("log_softplus", "log(log(1 + exp(x)))", _log_softplus, {"x": REAL}),
    Case(
        "softplus_ratio",
        "log(1 + exp(x))/log(1 + exp(y))",
        lambda x, y: torch.exp(_log_softplus(x) - _log_softplus(y)),
        {"x": REAL, "y": REAL},
    ),
    # A discount factor times a normal probability: exp(a) * ndtr(b) as exp(a + log_ndtr(b)).
    Case(
        "discounted_ndtr",
        "exp(-a)*(1 + erf(b/sqrt(2)))/2",
        lambda a, b: torch.exp(-a + torch.special.log_ndtr(b)),
        {"a": REAL, "b": (-100.0, -30.0, -1.0, 0.0, 1.0, 30.0)},
    ),
]


def _grid(case: Case) -> list[torch.Tensor]:
    """One float32 vector per tensor: every combination of the candidate values."""
    rows = list(itertools.product(*case.values.values()))
    return [torch.tensor(column, dtype=torch.float32) for column in zip(*rows)]


def _load(case: Case, tmp_path):
    tensors = {name: {"shape": []} for name in case.values}
    spec = make_spec(case.name, case.forward, tensors, {k: {"type": "float", **v} for k, v in case.scalars.items()})
    path = tmp_path / f"{case.name}.py"
    path.write_text(generate_op(spec)[f"{case.name}.py"], encoding="utf-8")
    module_spec = importlib.util.spec_from_file_location(f"_stability_{case.name}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return getattr(module, case.name)


def _check(what: str, ours, native, exact, inputs, rtol: float, atol: float) -> None:
    """Where the native float32 op is finite, ours is finite and close to the native op in float64."""
    finite = torch.isfinite(native)
    bad = finite & ~torch.isfinite(ours)
    assert not bad.any(), f"{what} is not finite where the native op's is, at {_points(inputs, bad)}"
    exact = exact.to(ours.dtype).double()  # rounded as a float32 result at best can be
    close = (ours.double() - exact).abs() <= atol + rtol * exact.abs()
    wrong = finite & ~close
    assert not wrong.any(), (
        f"{what} differs from the native op at {_points(inputs, wrong)}: "
        f"{ours[wrong][:3].tolist()} vs {exact[wrong][:3].tolist()}"
    )


def _points(inputs, mask) -> str:
    return str([tuple(float(x[i]) for x in inputs) for i in mask.nonzero().flatten()[:3].tolist()])


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_extreme_float32_inputs_match_native(case, tmp_path):
    op = _load(case, tmp_path)
    scalars = [v["default"] for v in case.scalars.values()]
    inputs = [x.requires_grad_() for x in _grid(case)]
    out = op(*inputs, *scalars)
    assert out.dtype == torch.float32
    grads = torch.autograd.grad(out.sum(), inputs)
    native, native_grads = _native(case, inputs, torch.float32)
    exact, exact_grads = _native(case, inputs, torch.float64)
    _check("value", out.detach(), native, exact, inputs, rtol=1e-5, atol=case.value_atol)
    for name, grad, native_grad, exact_grad in zip(case.values, grads, native_grads, exact_grads):
        _check(f"gradient of {name}", grad, native_grad, exact_grad, inputs, rtol=1e-4, atol=1e-6)


def _native(case: Case, inputs, dtype):
    xs = [x.detach().to(dtype).requires_grad_() for x in inputs]
    out = case.native(*xs)
    return out.detach(), torch.autograd.grad(out.sum(), xs)


def test_literal_formula_is_not_stable():
    """The check above can fail: the textbook softplus overflows where F.softplus does not."""
    x = torch.tensor([100.0], requires_grad=True)
    literal, native = torch.log(1 + torch.exp(x)).detach(), F.softplus(x).detach()
    with pytest.raises(AssertionError, match="not finite"):
        _check("value", literal, native, native.double(), [x.detach()], rtol=1e-5, atol=1e-6)


SECOND_ORDER = [
    Case("elu", "Piecewise((x, x > 0), (exp(x) - 1, True))", F.elu, {"x": REAL}),
    Case("selu", f"{SELU_SCALE}*Piecewise((x, x > 0), ({SELU_ALPHA}*(exp(x) - 1), True))", F.selu, {"x": REAL}),
    Case("celu", "Max(x, 0) + Min(0, 2*(exp(x/2) - 1))", lambda x: F.celu(x, alpha=2.0), {"x": REAL}),
    # x**-6, not 1 / x**6: the reciprocal's double backward squares 1e18 (inf in float32) at x = 1e-3.
    Case("inverse_power", "1/x**6", lambda x: x**-6, {"x": POSITIVE}),
    # ELU inside a Huber loss: its exp(x) is needed in both branches of the loss, and shared, it must stay
    # inside ELU's where() (exp(1e4) * 0 otherwise; found_10 in test_realistic is the loss's own branch).
    Case("huber_of_elu", f"Piecewise((({_ELU} - 1)**2/2, Abs({_ELU} - 1) <= 1), (Abs({_ELU} - 1) - 1/2, True))",
         lambda x: F.huber_loss(F.elu(x), torch.ones_like(x), reduction="none"), {"x": REAL}),
    # The double backward is derived, not autograd of backward's code: that multiplies exp(x) = inf by the
    # 0 the rest of the gradient makes of it (tanh'(exp(x)) = 0 at x = 100 in float32; 1/expm1(x)**2).
    Case("tanh_exp", "x*tanh(exp(x))", lambda x: x * torch.tanh(torch.exp(x)), {"x": REAL}),
    Case("inverse_expm1", "1/(exp(x) - 1)", lambda x: 1 / torch.expm1(x), {"x": POSITIVE}),
    # mish' keeps 1 - t**2 beside t (cheap, and exact enough there); its derivative's terms need the
    # accurate sech**2 (t' alone, 4*sigmoid(-x)**2/(2 - n)**2 * sigmoid(x), is e**-2x where t rounds to 1).
    Case("mish", "x*tanh(log(1 + exp(x)))", lambda x: x * torch.tanh(F.softplus(x)), {"x": REAL}),
]  # fmt: skip


@pytest.mark.parametrize("case", SECOND_ORDER, ids=[c.name for c in SECOND_ORDER])
def test_untaken_branches_are_safe_at_second_order(case, tmp_path):
    """Double backward through a torch.where: the untaken branch gets a zero gradient, and 0 * exp(100) is
    nan in float32 unless the branch's input is kept inside its region."""
    op = _load(case, tmp_path)
    scalars = [v["default"] for v in case.scalars.values()]
    (x,) = (x.requires_grad_() for x in _grid(case))
    (grad,) = torch.autograd.grad(op(x, *scalars).sum(), x, create_graph=True)
    (second,) = torch.autograd.grad(grad.sum(), x)
    exact = x.detach().double().requires_grad_()
    (exact_grad,) = torch.autograd.grad(case.native(exact).sum(), exact, create_graph=True)
    (exact_second,) = torch.autograd.grad(exact_grad.sum(), exact)
    _check("second derivative", second, exact_second.float(), exact_second, [x.detach()], rtol=1e-4, atol=1e-6)


def test_log_of_one_plus_a_square_that_overflows(tmp_path):
    """A Cauchy loss of a cube: u**2 is inf in float32 at u = x**3/c = 2e21, log(1 + u**2) is 98.5; the
    op switches to 2*log|u| + log1p(u**-2) beyond |u| = 1 (and stays log1p(u**2) inside, accurate at 0)."""
    case = Case("cauchy_cube", "log(1 + (x**3/c)**2)", None, {"x": ()}, scalars={"c": {"default": 0.5}})
    op = _load(case, tmp_path)
    x32 = torch.tensor([-1e7, -30.0, -1.0, -1e-3, 0.0, 1e-3, 0.5, 1.0, 30.0, 1e7], requires_grad=True)
    x64 = x32.detach().double().requires_grad_()
    for x in (x32, x64):
        x.grad = None
        op(x, 0.5).sum().backward()
    exact = torch.log1p((x64.detach() ** 3 / 0.5) ** 2)  # float64 holds u**2 = 4e42
    exact_grad = 6 * x64.detach() ** 5 / 0.25 / (1 + (x64.detach() ** 3 / 0.5) ** 2)
    torch.testing.assert_close(op(x32, 0.5).detach().double(), exact, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(x32.grad.double(), exact_grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(x64.grad, exact_grad, rtol=1e-12, atol=1e-15)
    # The far branch's 1/x**6 is inf at x = 0, where the near branch is taken: kept out of the second
    # derivative (2 * 3 * 2 * x**4 / c**2 ... is 0 there).
    x = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(op(x, 0.5).sum(), x, create_graph=True)
    (second,) = torch.autograd.grad(grad.sum(), x)
    assert torch.equal(second, torch.zeros(3, dtype=torch.float64)), second


def test_the_bipolar_sigmoid_is_tanh_of_half_and_finite_in_its_tails(tmp_path):
    """(1 - exp(-x)) / (1 + exp(-x)) was rewritten -expm1(-x) * sigmoid(x): inf * 0 = nan at x = -100 in
    float32, in value and gradient. It is tanh(x/2), and passes its own tests of extreme inputs."""
    import sympy

    from scaffold.stable import stabilize

    from .conftest import run_pytest

    x = sympy.Symbol("x", real=True)
    assert stabilize((1 - sympy.exp(-x)) / (1 + sympy.exp(-x)), {x}) == sympy.tanh(x / 2)
    assert stabilize((sympy.exp(3 * x) - 1) / (sympy.exp(3 * x) + 1), {x}) == sympy.tanh(3 * x / 2)
    files = generate_op(make_spec("bipolar_sigmoid", "(1 - exp(-x))/(1 + exp(-x))"))
    assert "tanh" in files["bipolar_sigmoid.py"] and "expm1" not in files["bipolar_sigmoid.py"]
    (tmp_path / "bipolar_sigmoid.py").write_text(files["bipolar_sigmoid.py"])
    (tmp_path / "test_bipolar_sigmoid.py").write_text(files["test_bipolar_sigmoid.py"])
    (tmp_path / "_scaffold_runtime.py").write_text(files["_scaffold_runtime.py"])
    result = run_pytest(tmp_path, "-k", "extreme_inputs or matches_reference or gradgradcheck")
    assert result.returncode == 0, result.stdout[-3000:]


def test_a_rewrite_that_overflows_where_the_written_form_is_finite_is_not_taken(monkeypatch):
    """Each rewrite is evaluated in float32 at its inputs' tails before it is taken: one that is nan where
    the written form is finite gives way to the node as its children were rewritten (or the written form)."""
    import sympy

    from scaffold import stable

    x = sympy.Symbol("x", real=True)
    overflowing = x * sympy.exp(x) / (1 + sympy.exp(x))  # x * sigmoid(x) as inf / inf at x = 100
    monkeypatch.setattr(
        stable._Rewriter, "_mul", lambda self, node: overflowing if node == x * stable.sigmoid(x) else None
    )
    assert stable.stabilize(x / (1 + sympy.exp(-x)), {x}) == x * stable.sigmoid(x)
    check = stable._Float32Check(frozenset({x}))
    assert not check.holds(sympy.tanh(x), (sympy.exp(2 * x) - 1) / (sympy.exp(2 * x) + 1))
    assert check.holds(sympy.log(1 + sympy.exp(x)), stable.softplus(x))
    # where the written form overflows too, a rewrite is free (that is what rewrites are for)
    assert check.holds(sympy.exp(x) / (1 + sympy.exp(x)), stable.sigmoid(x))


def test_a_log_with_zero_weight_at_its_pole_has_the_gradient_of_what_remains(tmp_path):
    """Binary cross-entropy at a prediction of 0 for a target of 0 is -log(1 - p): its gradient in p is 1
    there, not (1 - y)/(1 - p) - 0/0 = nan, which PyTorch's xlogy gives (a sigmoid saturated in float32
    outputs exactly 0); likewise at p = 1 for y = 1, -1. Where the log's weight is not 0, its pole stays."""
    case = Case("bce", "-(y*log(p) + (1 - y)*log(1 - p))", None, {"p": (), "y": ()})
    op = _load(case, tmp_path)
    for dtype in (torch.float32, torch.float64):
        p = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.25], dtype=dtype, requires_grad=True)
        y = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.5], dtype=dtype, requires_grad=True)
        grad_p, grad_y = torch.autograd.grad(op(p, y).sum(), (p, y))
        expected = torch.tensor([1.0, -1.0, -math.inf, math.inf, (1 - 0.5) / 0.75 - 0.5 / 0.25], dtype=dtype)
        torch.testing.assert_close(grad_p, expected)
        assert torch.isfinite(grad_y[[0, 1, 4]]).all(), grad_y


def test_a_log_odds_is_one_logarithm_exact_to_the_ends_of_its_support(tmp_path):
    """Binary cross-entropy's gradient in its target, -log(p) + log(1 - p), is computed as one logarithm of
    the odds, -log(p / (1 - p)) (:func:`scaffold.lowering.one_logarithm_of_odds`), not as two: 0 at the
    corners where each log's weight is 0, inf at the other ends of p's support, and as close to float64's
    as one logarithm is elsewhere, a subnormal p and the largest p below 1 included (the quotient cannot
    overflow there)."""
    case = Case("bce", "-(y*log(p) + (1 - y)*log(1 - p))", None, {"p": (), "y": ()})
    op = _load(case, tmp_path)
    backward = (tmp_path / "bce.py").read_text().split("def _backward(", 1)[1].split("\nclass ", 1)[0]
    assert len(re.findall(r"\blog(?:1p)?_?\(", backward)) == 1, backward
    for dtype, tolerance in ((torch.float32, 2e-7), (torch.float64, 1e-15)):
        p = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1e-30, 1e-6, 0.3, 0.5, 0.75, 0.0], dtype=dtype)
        p[4] = torch.finfo(dtype).tiny / 4  # subnormal
        p[-1] = 1 - torch.finfo(dtype).eps / 2  # the largest p below 1
        y = torch.tensor([0.0, 1.0, 1.0, 0.0, *[0.25] * 7], dtype=dtype)
        _, grad_y = torch.autograd.grad(op(p.requires_grad_(), y.requires_grad_()).sum(), (p, y))
        exact = torch.log1p(-p.detach().double()) - torch.log(p.detach().double())
        exact[:4] = torch.tensor([0.0, 0.0, math.inf, -math.inf])
        torch.testing.assert_close(grad_y.double(), exact, rtol=4 * tolerance, atol=tolerance)


def test_bce_tests_each_guarded_argument_once_and_divides_by_it(tmp_path):
    """Binary cross-entropy's backward guards p where p = y = 0 and 1 - p where p = y = 1 (the xlogy
    convention) with one ``logical_or`` each, not two comparisons and an ``&``; divides by them, not
    multiplying by a reciprocal; its forward negates no product (``(y - 1) * log1p(-p)``). 4M float32
    elements, one CPU thread: fwd+bwd 84 ms, now 66 ms. The values at the corners kept, and plain autograd's
    elsewhere."""
    spec = make_spec("bce", "-(y*log(p) + (1 - y)*log(1 - p))", {"p": {"shape": []}, "y": {"shape": []}})
    files = generate_op(spec, time_limit=None)
    source = files["bce.py"]
    backward = source.split("def _backward(", 1)[1].split("\nclass ", 1)[0]
    assert backward.count("torch.logical_or(") == 2 and backward.count("torch.where(") == 2, backward
    assert "==" not in backward and not re.search(r"\b1 / |\* tmp", backward), backward
    forward = source.split("def forward(p, y):", 1)[1].split("\n\n", 1)[0]
    assert "(y - 1) * " in forward and "neg" not in forward, forward
    write_files(files, tmp_path)
    module_spec = importlib.util.spec_from_file_location("_bce_guarded", tmp_path / "bce.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    inf = math.inf
    for dtype in (torch.float32, torch.float64):
        p = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.25, 0.6], dtype=dtype, requires_grad=True)
        y = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.0], dtype=dtype, requires_grad=True)
        out = module.bce(p, y)
        grad_p, grad_y = torch.autograd.grad(out.sum(), (p, y))
        corners = {
            "out": (out[:6], [0.0, 0.0, inf, inf, inf, inf]),
            "grad_p": (grad_p[:6], [1.0, -1.0, -inf, inf, -inf, inf]),
            "grad_y": (grad_y[:6], [0.0, 0.0, inf, -inf, inf, -inf]),
        }
        for name, (ours, expected) in corners.items():
            torch.testing.assert_close(ours, torch.tensor(expected, dtype=dtype), msg=name)
        plain_p, plain_y = p.detach()[6:].requires_grad_(), y.detach()[6:].requires_grad_()
        plain = -(plain_y * torch.log(plain_p) + (1 - plain_y) * torch.log(1 - plain_p))
        torch.testing.assert_close(out[6:], plain)
        expected_grads = torch.autograd.grad(plain.sum(), (plain_p, plain_y))
        torch.testing.assert_close((grad_p[6:], grad_y[6:]), expected_grads)
