"""A catalogue of ops for scaffold, each with PyTorch's own implementation to check the generated code against.

Every entry is a spec mapping (what :func:`scaffold.spec_from_mapping` takes, minus ``name``) and ``native``:
a callable taking the op's arguments in call order (tensors in declaration order, then scalars) and
computing the op with torch / torch.nn.functional / torch.special, or None where PyTorch has no such op.
Losses use ``reduction="none"`` so that they are elementwise, like the generated op.

Some entries give no ``domain`` on purpose, so that scaffold has to infer it (log, sqrt, acosh, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the usual name


@dataclass(frozen=True)
class CatalogueOp:
    name: str
    spec: dict[str, Any]
    native: Callable[..., torch.Tensor] | None

    def mapping(self) -> dict[str, Any]:
        """The full mapping for :func:`scaffold.spec_from_mapping`."""
        return {"name": self.name, **self.spec}


def _op(name: str, forward: str, tensors: dict, native, scalars: dict | None = None) -> CatalogueOp:
    spec: dict[str, Any] = {"forward": forward, "tensors": tensors}
    if scalars:
        spec["scalars"] = scalars
    return CatalogueOp(name, spec, native)


X = {"x": {}}  # one tensor x of the default shape and domain
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946

OPS: list[CatalogueOp] = [
    # --- the reference documents' examples --------------------------------------------------------------
    _op(
        "swish",
        "x / (1 + exp(-beta*x))",
        {"x": {}, "beta": {"shape": [], "learnable": True, "init": 1.0, "domain": [0.5, 2.0]}},
        lambda x, beta: x * torch.sigmoid(beta * x),
    ),
    _op(
        "clipped_relu",
        "Min(Max(x, 0), clip)",
        X,
        lambda x, clip: torch.clamp(x, 0.0, clip),
        {"clip": {"type": "float", "default": 2.0}},
    ),
    _op(
        "smooth_l1",
        "Piecewise((0.5*(input - target)**2/beta, Abs(input - target) < beta), (Abs(input - target) - 0.5*beta, True))",
        {"input": {}, "target": {}},
        lambda i, t, beta: F.smooth_l1_loss(i, t, reduction="none", beta=beta),
        {"beta": {"type": "float", "default": 1.0}},
    ),
    _op(
        "huber",
        "Piecewise((0.5*(input - target)**2, Abs(input - target) <= delta), "
        "(delta*(Abs(input - target) - 0.5*delta), True))",
        {"input": {}, "target": {}},
        lambda i, t, delta: F.huber_loss(i, t, reduction="none", delta=delta),
        {"delta": {"type": "float", "default": 1.5}},
    ),
    _op(
        "quadratic",
        "a*x**2 + b*x + c",
        {"x": {"shape": [4, 5]}, "a": {"shape": [5]}, "b": {"shape": [4, 1]}, "c": {"shape": []}},
        lambda x, a, b, c: torch.addcmul(b * x + c, a, x * x),
    ),
    _op("power", "x**n", X, torch.pow, {"n": {"type": "int", "default": 3}}),
    _op("sigmoid", "1 / (1 + exp(-x))", X, torch.sigmoid),
    _op("tanh_op", "tanh(x)", X, torch.tanh),
    # --- activations --------------------------------------------------------------------------------------
    _op("relu", "Max(x, 0)", X, F.relu),
    _op(
        "leaky_relu",
        "Piecewise((x, x > 0), (alpha*x, True))",
        X,
        lambda x, alpha: F.leaky_relu(x, alpha),
        {"alpha": {"type": "float", "default": 0.01}},
    ),
    _op(
        "elu",
        "Piecewise((x, x > 0), (alpha*(exp(x) - 1), True))",
        X,
        lambda x, alpha: F.elu(x, alpha),
        {"alpha": {"type": "float", "default": 1.3}},
    ),
    _op("selu", f"{SELU_SCALE}*Piecewise((x, x > 0), ({SELU_ALPHA}*(exp(x) - 1), True))", X, F.selu),
    _op(
        "celu",
        "Max(0, x) + Min(0, alpha*(exp(x/alpha) - 1))",
        X,
        lambda x, alpha: F.celu(x, alpha),
        {"alpha": {"type": "float", "default": 0.5}},
    ),
    _op("gelu", "x/2*(1 + erf(x/sqrt(2)))", X, F.gelu),
    _op(
        "gelu_tanh",
        "0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x**3)))",
        X,
        lambda x: F.gelu(x, approximate="tanh"),
    ),
    # F.softplus is linear above beta*x = threshold (20): the default domain [-3, 3] stays below it.
    _op(
        "softplus",
        "log(1 + exp(beta*x))/beta",
        X,
        lambda x, beta: F.softplus(x, beta=beta),
        {"beta": {"type": "float", "default": 2.0}},
    ),
    _op("mish", "x*tanh(log(1 + exp(x)))", X, F.mish),
    _op("silu", "x / (1 + exp(-x))", X, F.silu),
    _op(
        "hardtanh",
        "Max(Min(x, max_val), min_val)",
        X,
        lambda x, lo, hi: F.hardtanh(x, lo, hi),
        {"min_val": {"type": "float", "default": -1.0}, "max_val": {"type": "float", "default": 1.5}},
    ),
    _op("softsign", "x / (1 + Abs(x))", X, F.softsign),
    _op("tanhshrink", "x - tanh(x)", X, F.tanhshrink),
    _op("logsigmoid", "-log(1 + exp(-x))", X, F.logsigmoid),
    _op("hardsigmoid", "Max(0, Min(1, x/6 + Rational(1, 2)))", {"x": {"domain": [-5.0, 5.0]}}, F.hardsigmoid),
    _op("hardswish", "x*Min(Max(x + 3, 0), 6)/6", {"x": {"domain": [-5.0, 5.0]}}, F.hardswish),
    _op("relu6", "Min(Max(x, 0), 6)", {"x": {"domain": [-2.0, 8.0]}}, F.relu6),
    _op("abs_op", "Abs(x)", X, torch.abs),
    _op(
        "softshrink",
        "Piecewise((x - lambd, x > lambd), (x + lambd, x < -lambd), (0, True))",
        X,
        lambda x, lambd: F.softshrink(x, lambd),
        {"lambd": {"type": "float", "default": 0.5}},
    ),
    _op(
        "hardshrink",
        "Piecewise((x, Abs(x) > lambd), (0, True))",
        X,
        lambda x, lambd: F.hardshrink(x, lambd),
        {"lambd": {"type": "float", "default": 0.5}},
    ),
    _op(
        "threshold_op",
        "Piecewise((x, x > threshold), (value, True))",
        X,
        lambda x, threshold, value: F.threshold(x, threshold, value),
        {"threshold": {"type": "float", "default": 0.5}, "value": {"type": "float", "default": -1.0}},
    ),
    _op("symlog", "sign(x)*log(1 + Abs(x))", X, lambda x: torch.sign(x) * torch.log1p(torch.abs(x))),
    _op(
        "prelu",
        "Piecewise((x, x > 0), (weight*x, True))",
        {"x": {"shape": [4, 5]}, "weight": {"shape": [5], "learnable": True, "init": 0.25}},
        F.prelu,
    ),
    _op("heaviside_relu", "x*Heaviside(x)", X, F.relu),
    _op(
        "softshrink_sign",
        "sign(x)*Max(Abs(x) - lambd, 0)",
        X,
        lambda x, lambd: F.softshrink(x, lambd),
        {"lambd": {"type": "float", "default": 0.75}},
    ),
    _op("max3", "Max(x, y, 0)", {"x": {}, "y": {}}, lambda x, y: torch.clamp(torch.maximum(x, y), min=0.0)),
    _op(
        "abs_pow",
        "Abs(x)**p",
        X,
        lambda x, p: torch.pow(torch.abs(x), p),
        {"p": {"type": "float", "default": 1.5}},
    ),
    # A bool scalar chooses the branch: the condition is a Python bool, not a tensor.
    _op(
        "flip_sign",
        "Piecewise((x, flag), (-x, True))",
        X,
        lambda x, flag: torch.where(torch.tensor(flag), x, -x),
        {"flag": {"type": "bool", "default": True}},
    ),
    # --- losses (elementwise) -----------------------------------------------------------------------------
    _op("mse", "(input - target)**2", {"input": {}, "target": {}}, lambda i, t: F.mse_loss(i, t, reduction="none")),
    _op("l1", "Abs(input - target)", {"input": {}, "target": {}}, lambda i, t: F.l1_loss(i, t, reduction="none")),
    _op(
        "bce_with_logits",
        "Max(z, 0) - z*y + log(1 + exp(-Abs(z)))",
        {"z": {}, "y": {"domain": [0.0, 1.0]}},
        lambda z, y: F.binary_cross_entropy_with_logits(z, y, reduction="none"),
    ),
    _op(
        "bce",
        "-(y*log(p) + (1 - y)*log(1 - p))",
        {"p": {}, "y": {"domain": [0.0, 1.0]}},
        lambda p, y: F.binary_cross_entropy(p, y, reduction="none"),
    ),
    _op(
        "poisson_nll",
        "exp(input) - target*input",
        {"input": {}, "target": {"domain": [0.0, 5.0]}},
        lambda i, t: F.poisson_nll_loss(i, t, log_input=True, full=False, reduction="none"),
    ),
    _op(
        "kl_div",
        "target*(log(target) - input)",
        {"input": {}, "target": {}},
        lambda i, t: F.kl_div(i, t, reduction="none"),
    ),
    _op("log_cosh", "log(cosh(input - target))", {"input": {}, "target": {}}, None),
    # soft_margin_loss is not differentiable in its target: the label is a scalar here.
    _op(
        "soft_margin",
        "log(1 + exp(-label*x))",
        X,
        lambda x, label: F.soft_margin_loss(x, torch.full_like(x, label), reduction="none"),
        {"label": {"type": "float", "default": -1.0}},
    ),
    _op(
        "gaussian_nll",
        "0.5*(log(var) + (input - target)**2/var)",
        {"input": {}, "target": {}, "var": {"domain": [0.2, 3.0]}},
        lambda i, t, v: F.gaussian_nll_loss(i, t, v, full=False, reduction="none"),
    ),
    # --- special functions --------------------------------------------------------------------------------
    _op("erf_op", "erf(x)", X, torch.special.erf),
    _op("erfc_op", "erfc(x)", X, torch.special.erfc),
    _op("erfinv_op", "erfinv(x)", {"x": {"domain": [-0.9, 0.9]}}, torch.special.erfinv),
    _op("lgamma_op", "lgamma(x)", X, torch.lgamma),
    _op("loggamma_op", "loggamma(x)", {"x": {"domain": [0.5, 6.0]}}, torch.special.gammaln),
    _op("digamma_op", "digamma(x)", X, torch.special.digamma),
    _op("trigamma", "polygamma(1, x)", X, lambda x: torch.special.polygamma(1, x)),
    _op("exp_op", "exp(x)", X, torch.exp),
    _op("log_op", "log(x)", X, torch.log),
    _op("log1p_op", "log1p(x)", X, torch.log1p),
    _op("expm1_op", "expm1(x)", X, torch.special.expm1),
    _op("sqrt_op", "sqrt(x)", X, torch.sqrt),
    _op("rsqrt", "1/sqrt(x)", {"x": {"domain": [0.5, 3.0]}}, torch.rsqrt),
    _op("atan2_op", "atan2(y, x)", {"y": {}, "x": {}}, torch.atan2),
    _op("hypot_op", "hypot(x, y)", {"x": {}, "y": {}}, torch.hypot),
    # A number next to a tensor in a function torch takes tensors for: a 0-dim tensor of the input's dtype.
    _op(
        "atan2_scalar",
        "atan2(y, alpha) + logaddexp(y, alpha)",
        {"y": {}},
        lambda y, alpha: torch.atan2(y, y.new_tensor(alpha)) + torch.logaddexp(y, y.new_tensor(alpha)),
        {"alpha": {"type": "float", "default": 0.5}},
    ),
    # sqrt(x**2 + eps**2) as hypot(x, eps): x**2 overflows in float32 long before the result does.
    _op(
        "charbonnier",
        "sqrt(x**2 + eps**2)",
        X,
        lambda x, eps: torch.hypot(x, x.new_tensor(eps)),
        {"eps": {"type": "float", "default": 0.1}},
    ),
    _op("sinh_op", "sinh(x)", X, torch.sinh),
    _op("cosh_op", "cosh(x)", X, torch.cosh),
    _op("asinh_op", "asinh(x)", X, torch.asinh),
    _op("acosh_op", "acosh(x)", X, torch.acosh),
    _op("atanh_op", "atanh(x)", X, torch.atanh),
    _op("logit", "log(p/(1 - p))", {"p": {}}, torch.logit),
    _op("logit_difference", "log(p) - log(1 - p)", {"p": {}}, torch.logit),
    _op("sinc_op", "sin(pi*x)/(pi*x)", X, torch.special.sinc),
    _op("log2_op", "log2(x)", X, torch.log2),
    _op("xlogy", "x*log(y)", {"x": {}, "y": {}}, torch.special.xlogy),
    _op("log_ndtr", "log(erfc(-x/sqrt(2))/2)", X, torch.special.log_ndtr),
    _op("exp2_op", "exp2(x)", X, torch.exp2),
    _op("log10_op", "log10(x)", X, torch.log10),
    _op("log_base2", "log(x, 2)", X, torch.log2),
    _op("pow_three_halves", "x**Rational(3, 2)", X, lambda x: torch.pow(x, 1.5)),
    _op("sin_op", "sin(x)", X, torch.sin),
    _op("cos_op", "cos(x)", X, torch.cos),
    _op("tan_op", "tan(x)", {"x": {"domain": [-1.4, 1.4]}}, torch.tan),
    _op("asin_op", "asin(x)", X, torch.asin),
    _op("acos_op", "acos(x)", X, torch.acos),
    _op("atan_op", "atan(x)", X, torch.atan),
    _op("sign_op", "sign(x)", X, torch.sign),
    _op("tetragamma", "polygamma(2, x)", X, lambda x: torch.special.polygamma(2, x)),
    _op("log_log", "log(log(x))", X, lambda x: torch.log(torch.log(x))),
    # --- broadcasting binary ops, learnable parameters ----------------------------------------------------
    _op(
        "affine",
        "w*x + b",
        {
            "x": {"shape": [4, 5]},
            "w": {"shape": [5], "learnable": True},
            "b": {"shape": [5], "learnable": True, "init": 0.0},
        },
        lambda x, w, b: torch.addcmul(b, w, x),
    ),
    _op("mul", "x*y", {"x": {}, "y": {"shape": [5]}}, torch.mul),
    _op("div", "x/y", {"x": {}, "y": {"shape": [4, 1], "domain": [0.5, 3.0]}}, torch.div),
    _op("maximum", "Max(x, y)", {"x": {}, "y": {}}, torch.maximum),
    _op("minimum", "Min(x, y)", {"x": {}, "y": {"shape": [5]}}, torch.minimum),
    _op("pow_tensor", "x**y", {"x": {}, "y": {}}, torch.pow),
    _op(
        "lerp",
        "x + weight*(y - x)",
        {"x": {}, "y": {}, "weight": {"shape": [], "domain": [0.0, 1.0]}},
        torch.lerp,
    ),
    _op(
        "addcdiv",
        "c + value*x/y",
        {"c": {"shape": [5]}, "x": {}, "y": {"domain": [0.5, 3.0]}},
        lambda c, x, y, value: torch.addcdiv(c, x, y, value=value),
        {"value": {"type": "float", "default": 0.7}},
    ),
    _op(
        "add_alpha",
        "y + alpha*x",
        {"y": {}, "x": {}},
        lambda y, x, alpha: torch.add(y, x, alpha=alpha),
        {"alpha": {"type": "float", "default": -2.5}},
    ),
    _op(
        "clamp_tensor",
        "Min(Max(x, lo), hi)",
        {"x": {}, "lo": {"shape": [5], "domain": [-2.0, -0.5]}, "hi": {"shape": [4, 1], "domain": [0.5, 2.0]}},
        torch.clamp,
    ),
    _op("zero_dim_mul", "x*y", {"x": {"shape": []}, "y": {"shape": []}}, torch.mul),
    _op("outer_add", "x + y", {"x": {"shape": [4, 1]}, "y": {"shape": [1, 5]}}, torch.add),
    _op(
        "scalar_base_pow",
        "alpha**x",
        X,
        lambda x, alpha: torch.pow(alpha, x),
        {"alpha": {"type": "float", "default": 2.5}},
    ),
    _op(
        "clamp_min",
        "Max(x, alpha)",
        X,
        lambda x, alpha: torch.clamp(x, min=alpha),
        {"alpha": {"type": "float", "default": 0.3}},
    ),
    _op("logaddexp", "log(exp(x) + exp(y))", {"x": {}, "y": {}}, torch.logaddexp),
    _op(
        "scaled_tanh",
        "alpha*tanh(beta*x)",
        {
            "x": {},
            "alpha": {"shape": [], "learnable": True, "init": 1.7159},
            "beta": {"shape": [], "learnable": True, "init": 0.6667},
        },
        lambda x, alpha, beta: alpha * torch.tanh(beta * x),
    ),
]

__all__ = ["OPS", "CatalogueOp"]
