"""The registry of supported functions: each described once, read by every stage.

An entry says what each stage needs to know about one function: its spellings and arities (the parser,
:mod:`.expression`), its torch and math names (the printer, :mod:`.printing`), where it is defined
(domain inference, :mod:`.domain`), whether a ``Piecewise`` branch must keep its input inside the
branch's region (:mod:`.lowering`, and through it :mod:`.plan`), whether it preserves sign or is a step
(:mod:`.derivation`), and whether it has kinks (:mod:`.render`). Adding a function is one entry here plus
its tests (``tests/test_functions.py``; the README's table of functions lists every spelling).

Entries without spellings are internal: the stable rewrites (:mod:`.stable`) and lowering introduce them
(``silu``, ``finite_at_zero``, the derivative kernels), and the printer must know them.

The registry knows the math and the names it is printed with, nothing of the stages: it imports sympy
and :mod:`.stable`'s function classes only.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass

import mpmath
import sympy
from sympy.codegen import cfunctions

from . import stable


@dataclass(frozen=True)
class Domain:
    """Where a function's input (its last argument) must lie: ``low < u < high`` (``<=`` where ``closed``;
    None: unbounded). The generated tests draw inputs from ``sample`` where that is narrower. ``what``
    completes "log(x) ..." in the reason an inferred domain gives."""

    low: float | None
    high: float | None
    what: str
    closed: bool = False
    sample: tuple[float, float] | None = None


POSITIVE = Domain(0.0, None, "needs a positive input")
ABOVE_MINUS_ONE = Domain(-1.0, None, "needs an input above -1")
AT_LEAST_ONE = Domain(1.0, None, "needs an input >= 1", closed=True)
#: Infinite at -1 and 1.
OPEN_UNIT = Domain(-1.0, 1.0, "needs an input in (-1, 1)")
#: Defined at -1 and 1, with infinite derivatives there.
CLOSED_UNIT = Domain(-1.0, 1.0, "needs an input in [-1, 1]", closed=True, sample=(-1.0, 1.0))
#: Defined between poles, but steep near them: tests stay in one branch, well inside it.
TAN_POLES = Domain(-math.pi / 2, math.pi / 2, "is kept between its poles at -pi/2 and pi/2", sample=(-1.4, 1.4))
COT_POLES = Domain(0.0, math.pi, "is kept between its poles at 0 and pi", sample=(0.15, 3.0))


class Kink(enum.Enum):
    """Where a function is not differentiable (test inputs keep away from there; the generated docstring
    states the kink convention)."""

    AT_ZERO = "where its argument is 0"  # Abs, sign, Heaviside
    AT_TIES = "where two of its arguments are equal"  # Max, Min
    AT_INTEGERS = "where its argument is an integer"  # floor, ceil, trunc
    AT_HALF_INTEGERS = "where its argument is an integer and a half"  # round


@dataclass(frozen=True)
class Function:
    """One supported function."""

    #: The name it is documented by: its first spelling, or its class's name for an internal function.
    name: str
    #: The sympy class its calls become; None where the parser builds something else (sqrt is a power).
    sympy: type | None
    #: Its names in expressions, the first the usual one; () for an internal function.
    spellings: tuple[str, ...] = ()
    #: What the parser calls with the arguments; None: the class.
    build: Callable[..., sympy.Basic] | None = None
    #: The numbers of arguments the parser accepts.
    arity: tuple[int, ...] = (1,)
    #: The torch function computing it on tensors, called with the same arguments.
    torch: str | None = None
    #: The Python function computing it on numbers (``math.exp``, ``abs``); None: there is none.
    math: str | None = None
    #: The torch function takes tensors only: a number beside a tensor is made a tensor of its dtype.
    tensor_only: bool = False
    #: The printer has a ``_print_<class name>`` method of its own for it.
    printer_method: bool = False
    #: Printed as 1 / this function of the same arguments (torch has no cot, sec, csc).
    reciprocal_of: type | None = None
    #: A derivative kernel: the aten op computing ``grad * derivative`` in one pass, ``kernel(grad, arg)``.
    kernel: str | None = None
    #: Where it is defined, if not everywhere (domain inference restricts test inputs to it).
    domain: Domain | None = None
    #: Undefined outside a subset of the reals: inside a Piecewise branch its input is kept in the region.
    restricted: bool = False
    #: Overflows for large inputs: inside a Piecewise branch its input is kept in the region (the untaken
    #: branch's derivative could be inf, and 0 * inf is nan at double backward).
    growing: bool = False
    #: Increasing with f(0) = 0: f(u) has the sign of u, so a step of f(u) is a step of u.
    sign_preserving: bool = False
    #: A step: its derivative is zero wherever it exists.
    step: bool = False
    #: Where it has kinks.
    kink: Kink | None = None
    #: A numerically stable primitive: the generated docstring names it where the rewrites introduced it.
    stable: bool = False
    #: Its value as the op computes it, in mpmath, for the numeric domain check (the textbook formula
    #: cancels at mpmath's default 15 digits: log(1 - sigmoid(164)) is log(0), logsigmoid(-164) is -164).
    mpmath: Callable[..., object] | None = None
    #: The keyword arguments it takes after its operand, with their defaults (None: the keyword may be left
    #: out), as torch.nn.functional names them: ``elu(x, alpha=1.0)``; given by keyword or in order.
    keywords: tuple[tuple[str, float | None], ...] = ()
    #: What it is in torch.nn.functional, where the spelling is a named activation (the math it expands to
    #: is differentiated as written; the printer computes the known forms by torch's kernels).
    activation: str | None = None

    @property
    def internal(self) -> bool:
        """Not spellable in expressions: introduced by scaffold's own rewrites."""
        return not self.spellings

    @property
    def printable(self) -> bool:
        """Whether the printer has a torch translation of it."""
        return bool(self.torch or self.printer_method or self.reciprocal_of or self.kernel)


# -- named activations and clamp: the math each expands to, as torch.nn.functional computes it


def _relu(e: sympy.Expr) -> sympy.Expr:
    return sympy.Max(e, 0)


def _silu(e: sympy.Expr) -> sympy.Expr:
    return e * stable.sigmoid(e)


def _gelu(e: sympy.Expr) -> sympy.Expr:
    return e / 2 * (1 + sympy.erf(e / sympy.sqrt(2)))


def _gelu_tanh(e: sympy.Expr) -> sympy.Expr:
    return e / 2 * (1 + sympy.tanh(sympy.sqrt(2 / sympy.pi) * (e + sympy.Float(0.044715) * e**3)))


def _mish(e: sympy.Expr) -> sympy.Expr:
    return e * sympy.tanh(stable.softplus(e))


def _elu(e: sympy.Expr, alpha: sympy.Expr) -> sympy.Expr:
    return sympy.Piecewise((e, e > 0), (alpha * cfunctions.expm1(e), True))


def _leaky_relu(e: sympy.Expr, negative_slope: sympy.Expr) -> sympy.Expr:
    return sympy.Piecewise((e, e > 0), (negative_slope * e, True))


def _clamp(e: sympy.Expr, low: sympy.Expr | None, high: sympy.Expr | None) -> sympy.Expr:
    """torch.clamp: the lower bound first, then the upper (so an upper bound below the lower one wins)."""
    e = e if low is None else sympy.Max(e, low)
    return e if high is None else sympy.Min(e, high)


def _hardtanh(e: sympy.Expr, min_val: sympy.Expr, max_val: sympy.Expr) -> sympy.Expr:
    return _clamp(e, min_val, max_val)


def _hardsigmoid(e: sympy.Expr) -> sympy.Expr:
    return _clamp(e / 6 + sympy.Rational(1, 2), 0, 1)


def _hardswish(e: sympy.Expr) -> sympy.Expr:
    return e * _hardsigmoid(e)


def _zero_or(f: Callable[[object, object], object]) -> Callable[[object, object], object]:
    """``f(x, y)``, but 0 where x = 0 (xlogy and its kin)."""
    return lambda x, y: 0 if x == 0 else f(x, y)


_F = Function
_MANY = tuple(range(2, 17))

ENTRIES: tuple[Function, ...] = (
    # -- exponentials and logarithms
    _F("exp", sympy.exp, ("exp",), torch="torch.exp", math="math.exp", growing=True),
    _F("log", sympy.log, ("log", "ln"), arity=(1, 2), torch="torch.log", math="math.log", domain=POSITIVE,
       restricted=True),
    _F("log1p", cfunctions.log1p, ("log1p",), torch="torch.log1p", math="math.log1p", domain=ABOVE_MINUS_ONE,
       restricted=True, sign_preserving=True, stable=True),
    _F("expm1", cfunctions.expm1, ("expm1",), torch="torch.expm1", math="math.expm1", growing=True,
       sign_preserving=True, stable=True),
    _F("log2", cfunctions.log2, ("log2",), torch="torch.log2", math="math.log2", domain=POSITIVE, restricted=True),
    _F("log10", cfunctions.log10, ("log10",), torch="torch.log10", math="math.log10", domain=POSITIVE,
       restricted=True),
    _F("exp2", cfunctions.exp2, ("exp2",), torch="torch.exp2", growing=True),
    _F("sqrt", None, ("sqrt",), build=sympy.sqrt),
    _F("cbrt", None, ("cbrt",), build=sympy.cbrt),
    # -- trigonometric and hyperbolic
    _F("sin", sympy.sin, ("sin",), torch="torch.sin", math="math.sin"),
    _F("cos", sympy.cos, ("cos",), torch="torch.cos", math="math.cos"),
    _F("tan", sympy.tan, ("tan",), torch="torch.tan", math="math.tan", domain=TAN_POLES, growing=True),
    _F("cot", sympy.cot, ("cot",), reciprocal_of=sympy.tan, domain=COT_POLES, growing=True),
    _F("sec", sympy.sec, ("sec",), reciprocal_of=sympy.cos, domain=TAN_POLES, growing=True),
    _F("csc", sympy.csc, ("csc",), reciprocal_of=sympy.sin, domain=COT_POLES, growing=True),
    _F("asin", sympy.asin, ("asin",), torch="torch.asin", math="math.asin", domain=CLOSED_UNIT, restricted=True),
    _F("acos", sympy.acos, ("acos",), torch="torch.acos", math="math.acos", domain=CLOSED_UNIT, restricted=True),
    _F("atan", sympy.atan, ("atan",), torch="torch.atan", math="math.atan", sign_preserving=True),
    _F("atan2", sympy.atan2, ("atan2",), arity=(2,), torch="torch.atan2", math="math.atan2", tensor_only=True),
    _F("sinh", sympy.sinh, ("sinh",), torch="torch.sinh", math="math.sinh", growing=True, sign_preserving=True),
    _F("cosh", sympy.cosh, ("cosh",), torch="torch.cosh", math="math.cosh", growing=True),
    _F("tanh", sympy.tanh, ("tanh",), torch="torch.tanh", math="math.tanh", sign_preserving=True),
    _F("asinh", sympy.asinh, ("asinh",), torch="torch.asinh", math="math.asinh", sign_preserving=True),
    _F("acosh", sympy.acosh, ("acosh",), torch="torch.acosh", math="math.acosh", domain=AT_LEAST_ONE,
       restricted=True),
    _F("atanh", sympy.atanh, ("atanh",), torch="torch.atanh", math="math.atanh", domain=OPEN_UNIT, restricted=True),
    _F("hypot", cfunctions.hypot, ("hypot",), arity=(2,), torch="torch.hypot", math="math.hypot", tensor_only=True,
       stable=True),
    # -- special functions
    _F("erf", sympy.erf, ("erf",), torch="torch.erf", math="math.erf", sign_preserving=True),
    _F("erfc", sympy.erfc, ("erfc",), torch="torch.erfc", math="math.erfc"),
    _F("erfinv", sympy.erfinv, ("erfinv",), torch="torch.erfinv", domain=OPEN_UNIT, restricted=True),
    _F("loggamma", sympy.loggamma, ("loggamma", "lgamma"), torch="torch.lgamma", math="math.lgamma",
       domain=POSITIVE, restricted=True),
    _F("digamma", sympy.digamma, ("digamma",), torch="torch.digamma", printer_method=True, domain=POSITIVE,
       restricted=True),
    _F("polygamma", sympy.polygamma, ("polygamma",), arity=(2,), torch="torch.polygamma", printer_method=True,
       domain=POSITIVE, restricted=True),
    # -- kinks and steps
    _F("Abs", sympy.Abs, ("Abs", "abs"), torch="torch.abs", math="abs", kink=Kink.AT_ZERO),
    _F("sign", sympy.sign, ("sign",), torch="torch.sign", step=True, kink=Kink.AT_ZERO),
    _F("Heaviside", sympy.Heaviside, ("Heaviside",), arity=(1, 2), printer_method=True, step=True,
       kink=Kink.AT_ZERO),
    _F("Max", sympy.Max, ("Max", "max"), arity=_MANY, torch="torch.maximum", math="max", printer_method=True,
       kink=Kink.AT_TIES),
    _F("Min", sympy.Min, ("Min", "min"), arity=_MANY, torch="torch.minimum", math="min", printer_method=True,
       kink=Kink.AT_TIES),
    # -- rounding: steps, derivative 0 (a straight-through rule goes in [gradients])
    _F("round", stable.round, ("round",), torch="torch.round", math="round", step=True,
       kink=Kink.AT_HALF_INTEGERS),
    _F("floor", stable.floor, ("floor",), torch="torch.floor", math="math.floor", step=True, kink=Kink.AT_INTEGERS),
    _F("ceil", stable.ceil, ("ceil",), torch="torch.ceil", math="math.ceil", step=True, kink=Kink.AT_INTEGERS),
    _F("trunc", stable.trunc, ("trunc",), torch="torch.trunc", math="math.trunc", step=True,
       kink=Kink.AT_INTEGERS),
    # -- numbers
    _F("Rational", None, ("Rational",), build=sympy.Rational, arity=(1, 2)),
    # -- torch.clamp and the named activations of torch.nn.functional, as the math they compute
    _F("clamp", None, ("clamp",), build=_clamp, arity=(2, 3), keywords=(("min", None), ("max", None)),
       activation="clamp"),
    _F("relu", None, ("relu",), build=_relu, activation="relu"),
    _F("gelu_tanh", None, ("gelu_tanh",), build=_gelu_tanh, activation="gelu(approximate='tanh')"),
    _F("elu", None, ("elu",), build=_elu, arity=(1, 2), keywords=(("alpha", 1.0),), activation="elu"),
    _F("leaky_relu", None, ("leaky_relu",), build=_leaky_relu, arity=(1, 2), keywords=(("negative_slope", 0.01),),
       activation="leaky_relu"),
    _F("hardtanh", None, ("hardtanh",), build=_hardtanh, arity=(1, 2, 3),
       keywords=(("min_val", -1.0), ("max_val", 1.0)), activation="hardtanh"),
    _F("hardsigmoid", None, ("hardsigmoid",), build=_hardsigmoid, activation="hardsigmoid"),
    _F("hardswish", None, ("hardswish",), build=_hardswish, activation="hardswish"),
    # -- PyTorch's numerically stable primitives, also introduced by scaffold's own rewrites (stable.py)
    _F("softplus", stable.softplus, ("softplus",), torch="torch.nn.functional.softplus", stable=True,
       mpmath=lambda x: mpmath.log1p(mpmath.exp(x))),
    _F("sigmoid", stable.sigmoid, ("sigmoid", "expit"), torch="torch.sigmoid", stable=True,
       mpmath=lambda x: 1 / (1 + mpmath.exp(-x))),
    _F("logsigmoid", stable.logsigmoid, ("logsigmoid",), torch="torch.nn.functional.logsigmoid", stable=True,
       mpmath=lambda x: -mpmath.log1p(mpmath.exp(-x))),
    _F("logaddexp", stable.logaddexp, ("logaddexp",), arity=(2,), torch="torch.logaddexp", tensor_only=True,
       stable=True, mpmath=lambda a, b: max(a, b) + mpmath.log1p(mpmath.exp(-abs(a - b)))),
    _F("xlogy", stable.xlogy, ("xlogy",), arity=(2,), torch="torch.xlogy", restricted=True, stable=True,
       mpmath=_zero_or(lambda x, y: x * mpmath.log(y))),
    _F("xlog1py", stable.xlog1py, ("xlog1py",), arity=(2,), torch="torch.special.xlog1py", restricted=True,
       stable=True, mpmath=_zero_or(lambda x, y: x * mpmath.log1p(y))),
    _F("erfcx", stable.erfcx, ("erfcx",), torch="torch.special.erfcx", growing=True, stable=True,
       mpmath=lambda x: mpmath.exp(x**2) * mpmath.erfc(x)),
    _F("ndtr", stable.ndtr, ("ndtr",), torch="torch.special.ndtr", stable=True,
       mpmath=lambda x: mpmath.erfc(-x / mpmath.sqrt(2)) / 2),
    _F("log_ndtr", stable.log_ndtr, ("log_ndtr",), torch="torch.special.log_ndtr", stable=True,
       mpmath=lambda x: mpmath.log(mpmath.erfc(-x / mpmath.sqrt(2)) / 2)),
    _F("logit", stable.logit, ("logit",), torch="torch.logit", restricted=True, stable=True,
       mpmath=lambda p: mpmath.log(p / (1 - p))),
    # -- named activations that the rewrites also introduce (stable.py): spelled, they are the math they
    # compute, which the rewrites find again
    _F("silu", stable.silu, ("silu",), build=_silu, torch="torch.nn.functional.silu", stable=True,
       mpmath=lambda x: x / (1 + mpmath.exp(-x)), activation="silu"),
    _F("mish", stable.mish, ("mish",), build=_mish, torch="torch.nn.functional.mish", stable=True,
       mpmath=lambda x: x * mpmath.tanh(mpmath.log1p(mpmath.exp(x))), activation="mish"),
    _F("gelu", stable.gelu, ("gelu",), build=_gelu, torch="torch.nn.functional.gelu", stable=True,
       mpmath=lambda x: x * mpmath.erfc(-x / mpmath.sqrt(2)) / 2, activation="gelu"),
    # -- internal: introduced by the rewrites (stable.py) and lowering
    _F("xexpy", stable.xexpy, arity=(2,), growing=True, stable=True,  # lowering writes it x * finite_at_zero(...)
       mpmath=_zero_or(lambda x, y: x * mpmath.exp(y))),
    _F("kept", stable.kept, printer_method=True, stable=True, mpmath=lambda w: w),
    _F("tanh_softplus", stable.tanh_softplus, printer_method=True, stable=True,
       mpmath=lambda x: mpmath.tanh(mpmath.log1p(mpmath.exp(x)))),
    _F("log_ndtr_grad", stable.log_ndtr_grad, printer_method=True, stable=True,
       mpmath=lambda x: mpmath.npdf(x) / mpmath.ncdf(x)),
    _F("log_softplus", stable.log_softplus, printer_method=True, stable=True,
       mpmath=lambda x: mpmath.log(mpmath.log1p(mpmath.exp(x)))),
    _F("finite_at_zero", stable.finite_at_zero, arity=(2,), printer_method=True),
    _F("log_argument", stable.log_argument, arity=(4,), printer_method=True),  # xlogy's derivatives read it
    _F("neg_abs", stable.neg_abs, printer_method=True),  # fused code's -|t|: the module's _neg_abs
    _F("sigmoid_grad", stable.sigmoid_grad, kernel="torch.ops.aten.sigmoid_backward"),
    _F("tanh_grad", stable.tanh_grad, kernel="torch.ops.aten.tanh_backward"),
    _F("tanh_grad_beside_tanh", stable.tanh_grad_beside_tanh, kernel="torch.ops.aten.tanh_backward"),
    _F("gelu_grad", stable.gelu_grad, kernel="torch.ops.aten.gelu_backward"),
)  # fmt: skip

_BY_SPELLING: dict[str, Function] = {s: e for e in ENTRIES for s in e.spellings}
_BY_CLASS: dict[type, Function] = {e.sympy: e for e in ENTRIES if e.sympy is not None}


def by_spelling(name: str) -> Function | None:
    """The function spelled ``name`` in expressions, if any."""
    return _BY_SPELLING.get(name)


def by_class(cls: type) -> Function | None:
    """The function whose sympy class is ``cls`` (exactly), if any."""
    return _BY_CLASS.get(cls)


def spellings() -> tuple[str, ...]:
    """Every name a function can be called by in expressions, in registry order."""
    return tuple(_BY_SPELLING)


def _classes(keep: Callable[[Function], object]) -> tuple[type, ...]:
    return tuple(e.sympy for e in ENTRIES if e.sympy is not None and keep(e))


_PRINTABLE = frozenset(_classes(lambda e: e.printable))
_RESTRICTED = _classes(lambda e: e.restricted)
_GROWING = _classes(lambda e: e.growing)
_SIGN_PRESERVING = _classes(lambda e: e.sign_preserving)
_STEPS = _classes(lambda e: e.step)
_KINKED = _classes(lambda e: e.kink is not None)
_KINKED_BY_KIND = {kind: _classes(lambda e, kind=kind: e.kink is kind) for kind in Kink}
_STABLE = _classes(lambda e: e.stable)
_MPMATH = {e.sympy.__name__: e.mpmath for e in ENTRIES if e.sympy is not None and e.mpmath is not None}


def printable_classes() -> frozenset[type]:
    """The function classes the printer has a torch translation of."""
    return _PRINTABLE


def restricted_classes() -> tuple[type, ...]:
    """Functions undefined outside a subset of the reals (log, asin, xlogy, ...)."""
    return _RESTRICTED


def growing_classes() -> tuple[type, ...]:
    """Functions that overflow for large inputs (exp, sinh, tan, ...)."""
    return _GROWING


def sign_preserving_classes() -> tuple[type, ...]:
    """Increasing functions with f(0) = 0 (expm1, tanh, erf, ...)."""
    return _SIGN_PRESERVING


def step_classes() -> tuple[type, ...]:
    """Functions whose derivative is zero wherever it exists (sign, Heaviside)."""
    return _STEPS


def kink_classes(kink: Kink | None = None) -> tuple[type, ...]:
    """Functions with kinks (of the kind ``kink``, or of any kind)."""
    return _KINKED if kink is None else _KINKED_BY_KIND[kink]


def stable_classes() -> tuple[type, ...]:
    """The numerically stable primitives the generated docstring names."""
    return _STABLE


def mpmath_functions() -> dict[str, Callable[..., object]]:
    """mpmath versions of the stable primitives by class name, for ``sympy.lambdify``."""
    return dict(_MPMATH)
