"""Where the generated tests draw their inputs from, and where the op is defined.

For each tensor argument:

* its **support**, where the op is defined in that tensor: an interval whose ends may be infinite, each
  open or closed. Declared in the spec (``domain = [a, b]`` is the closed support [a, b]), or inferred
  from what the forward applies to the tensor: log needs a positive input, ``x**2.5`` or ``x**n`` with a
  float scalar ``n`` a base >= 0, atanh an input in (-1, 1), acosh one >= 1, tan stays between its poles.
  Only what needs restricting is restricted: an argument that is provably in range (``log(1 + exp(x))``,
  ``Abs(x)**p``, ``log(sigmoid(x))``) restricts nothing, and an integer power (a number or an int scalar
  exponent) is defined everywhere but at a pole of a negative exponent.
* its **special points**: the closed ends of the support and the zeros of the base of a power with a
  non-integer or symbolic exponent (0 for ``x**n`` or ``Abs(x)**p``, 1 for ``(x - 1)**1.5``), where
  derivatives written as ``n*x**n/x`` turn into 0/0, and 0 where the forward as written is 0/0
  (``x/expm1(x)``: a removable singularity, which the op computes from a Taylor polynomial).
* an **interval** the random test inputs are drawn from (inside the support, away from its ends) and
  **points to avoid** (declared, or inferred from the kinks of Abs, sign, Heaviside, Max, Min and
  Piecewise conditions and the poles of divisions), where finite differences are meaningless.

Inference handles arguments that are affine in one tensor (``log(2*x - 1)``). An argument that is
neither affine nor provably in range (``log(p / (1 - p))``) is left to a numeric check (:func:`_repair`),
which samples the forward and its derivatives and tries other intervals where they are not finite and
real; the spec can always say better.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sympy

from . import stable, structural
from .errors import DerivationError
from .expression import ParsedExpression
from .functions import Kink, by_class, kink_classes, mpmath_functions
from .program import Program
from .spec import OpSpec, TensorArg
from .stable import stabilize, to_literal

if TYPE_CHECKING:
    from .rules import ProgramDerivation

DEFAULT_DOMAIN = (-3.0, 3.0)
WIDTH = 3.0  # width of an inferred interval bounded on one side only
MARGIN = 0.25  # distance kept from an inferred bound


@dataclass(frozen=True)
class Support:
    """Where the op is defined in one tensor: from ``low`` to ``high`` (possibly infinite), each end open
    or closed."""

    low: float = -math.inf
    high: float = math.inf
    low_closed: bool = False
    high_closed: bool = False

    def __contains__(self, value: float) -> bool:
        above = self.low < value or (self.low_closed and value == self.low)
        below = value < self.high or (self.high_closed and value == self.high)
        return above and below

    def __and__(self, other: Support) -> Support:
        """The intersection: where both hold (an end shared by both is closed only if closed in both)."""
        if other.low > self.low or (other.low == self.low and not other.low_closed):
            low, low_closed = other.low, other.low_closed
        else:
            low, low_closed = self.low, self.low_closed
        if other.high < self.high or (other.high == self.high and not other.high_closed):
            high, high_closed = other.high, other.high_closed
        else:
            high, high_closed = self.high, self.high_closed
        return Support(low, high, low_closed, high_closed)

    @property
    def closed_ends(self) -> tuple[float, ...]:
        return tuple(v for v, closed in ((self.low, self.low_closed), (self.high, self.high_closed)) if closed)

    def __str__(self) -> str:
        return (
            f"{'[' if self.low_closed else '('}{_number(self.low)}, "
            f"{_number(self.high)}{']' if self.high_closed else ')'}"
        )


def _number(value: float) -> str:
    return "inf" if value == math.inf else "-inf" if value == -math.inf else f"{value:g}"


@dataclass(frozen=True)
class InputDomain:
    """The interval test inputs of one tensor are drawn from, the points they keep away from, and where
    the op is defined in that tensor (its support) with the points of it where the op is hardest."""

    name: str
    low: float
    high: float
    avoid: tuple[float, ...]
    reason: str
    support: Support = Support()
    support_reason: str = "nothing restricts it"
    special: tuple[float, ...] = ()  # closed ends of the support, zeros of the base of a non-integer power
    init: float | None = None  # a learnable tensor's initial value in the Module (None: not learnable)


@dataclass
class _Bounds:
    low: float | None = None
    high: float | None = None
    avoid: set[float] = field(default_factory=set)
    reasons: list[str] = field(default_factory=list)  # why the interval is what it is
    support: Support = Support()
    special: set[float] = field(default_factory=set)

    def add_low(self, value: float, reason: str) -> None:
        self.low = value if self.low is None else max(self.low, value)
        self.reasons.append(reason)

    def add_high(self, value: float, reason: str) -> None:
        self.high = value if self.high is None else min(self.high, value)
        self.reasons.append(reason)


def _affine(arg: sympy.Expr, tensors: set[sympy.Symbol]) -> tuple[sympy.Symbol, float, float] | None:
    """``arg == k*s + c`` for one tensor ``s`` and numbers ``k != 0``, ``c``; else None."""
    symbols = arg.free_symbols & tensors
    if len(symbols) != 1 or arg.free_symbols - tensors or arg.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
        return None
    (s,) = symbols
    poly = sympy.Poly(arg, s) if arg.is_polynomial(s) else None
    if poly is None or poly.degree() != 1:
        return None
    k, c = (float(v) for v in poly.all_coeffs())
    return s, k, c


def _holds(arg: sympy.Expr, low: float | None, high: float | None, closed: bool, tensors: set[sympy.Symbol]) -> bool:
    """Whether sympy proves ``low < arg < high`` (``<=`` where ``closed``) for every real input, on the
    expression as written or on its stable form (sigmoid, softplus and ndtr know they are positive)."""

    def proved(a: sympy.Expr) -> bool:
        for bound, sign in ((low, 1), (high, -1)):
            if bound is None:
                continue
            gap = sign * (a - bound)
            if not (gap.is_nonnegative if closed else gap.is_positive):
                return False
        return True

    if proved(arg):
        return True
    stable = stabilize(arg, tensors)
    return stable != arg and proved(stable)


def infer_domains(
    spec: OpSpec, parsed: ParsedExpression, partials: tuple[sympy.Expr, ...] = (), removable: tuple[str, ...] = ()
) -> tuple[InputDomain, ...]:
    """Each tensor's :class:`InputDomain`, in the spec's order: declared in the spec or inferred from the
    forward (see the module doc), then checked numerically on the forward and its ``partials``.

    ``removable`` names the tensors where the forward as written is 0/0 at 0 (``x/expm1(x)``).
    """
    numbers = _scalar_values(spec, parsed)
    tensors = {parsed.symbols[t.name] for t in spec.tensors}
    # The walk keeps scalars as symbols where it needs to know an int scalar exponent is an integer power.
    needs = _needs(to_literal(sympy.Tuple(*parsed.exprs)), tensors, numbers)
    bounds = _bounds(needs, tensors, [parsed.symbols[name] for name in removable])
    domains = {t.name: _input_domain(t, bounds[parsed.symbols[t.name]]) for t in spec.tensors}
    checked = [stabilize(e, tensors).xreplace(numbers) for e in parsed.exprs] + [p.xreplace(numbers) for p in partials]
    domains = _checked(spec, domains, checked, parsed.symbols)
    return tuple(_with_init(t, d) for t, d in zip(spec.tensors, domains))


def infer_program_domains(spec: OpSpec, derivation: ProgramDerivation) -> tuple[InputDomain, ...]:
    """:func:`infer_domains` for a structured forward, from an elementwise stand-in of it: a reduction
    stands for its operand (the sum of positive terms is positive: log(sum(x)) needs x > 0), softmax for a
    sigmoid of it, log_softmax for a log-sigmoid, a product for the product of its operands and a
    transpose for its operand. What the stand-in cannot see (a sum of terms of mixed sign under a log)
    the spec declares with ``domain``.

    The numeric check reads every elementwise node's partial derivatives, each value it reads replaced by
    its stand-in over the arguments, as an elementwise op's reads its partials; a node that is 0/0 at a
    tensor's 0 as written (``x/expm1(x)``) makes 0 a special point of that tensor."""
    parsed = derivation.program.parsed
    exprs = tuple(_elementwise_stand_in(e) for e in parsed.exprs)
    forms = _stand_in_forms(derivation.program)
    partials = tuple(_in_arguments(p, forms) for node in derivation.elementwise for _, p in node.partials)
    return infer_domains(spec, dataclasses.replace(parsed, exprs=exprs), partials, derivation.removable)


def _stand_in_forms(program: Program) -> dict[str, sympy.Expr]:
    """Each step of ``program``, by name: its elementwise stand-in over the arguments (every step it reads
    substituted)."""
    forms: dict[str, sympy.Expr] = {}
    for value in program.values:
        if value.expr is not None:
            forms[value.name] = _elementwise_stand_in(_in_arguments(value.expr, forms))
    return forms


def _in_arguments(expr: sympy.Expr, forms: dict[str, sympy.Expr]) -> sympy.Expr:
    return expr.xreplace({s: forms[s.name] for s in expr.free_symbols if s.name in forms})


def _elementwise_stand_in(expr: sympy.Basic) -> sympy.Basic:
    if isinstance(expr, structural.Structural):
        operands = [_elementwise_stand_in(o) for o in expr.operand_exprs]
        if isinstance(expr, structural.LogSoftmax):
            return -sympy.log(1 + sympy.exp(-operands[0]))
        if isinstance(expr, structural.Softmax):
            return 1 / (1 + sympy.exp(-operands[0]))
        if isinstance(expr, (structural.Transposed, structural.Sliced, structural.Reshaping)):
            return operands[0]
        return sympy.Mul(*operands)
    if not expr.args or not expr.has(structural.Structural):
        return expr
    return expr.func(*[_elementwise_stand_in(a) for a in expr.args])


def _with_init(tensor: TensorArg, domain: InputDomain) -> InputDomain:
    """A learnable tensor's domain with its initial value in the Module (:func:`learnable_init`): its constant
    init, or where it has none the default (a random scheme does not read it)."""
    if not tensor.learnable:
        return domain
    constant = tensor.scheme.constant if tensor.scheme is not None else None
    return dataclasses.replace(domain, init=learnable_init(constant, domain))


def _scalar_values(spec: OpSpec, parsed: ParsedExpression) -> dict[sympy.Symbol, sympy.Number]:
    """The default of every numeric scalar, by its symbol (a bool scalar is no number)."""
    return {parsed.symbols[s.name]: sympy.Number(s.default) for s in spec.scalars if s.type != "bool"}


@dataclass(frozen=True)
class _Restriction:
    """The op needs ``low < arg < high`` (``<=`` where ``closed``; None: unbounded) because of ``what``;
    test inputs are drawn from ``sample`` (default: the same bounds) where narrower."""

    arg: sympy.Expr
    low: float | None
    high: float | None
    what: str
    closed: bool = False
    sample: tuple[float | None, float | None] | None = None


@dataclass(frozen=True)
class _Needs:
    """What the forward needs of the expressions in it, each kind in the order they appear."""

    restrictions: tuple[_Restriction, ...] = ()
    kinks: tuple[sympy.Expr, ...] = ()  # expressions where the op has a kink or a pole at their zeros
    bases: tuple[sympy.Expr, ...] = ()  # bases of powers with a non-integer exponent, hard at their zeros

    def __add__(self, other: _Needs) -> _Needs:
        return _Needs(self.restrictions + other.restrictions, self.kinks + other.kinks, self.bases + other.bases)


def _needs(literal: sympy.Expr, tensors: set[sympy.Symbol], numbers: dict[sympy.Symbol, sympy.Number]) -> _Needs:
    """What every power and function of the forward (its textbook formula, scalars as symbols) needs."""
    needs = _Needs()
    for node in sympy.preorder_traversal(literal):
        if isinstance(node, sympy.Pow):
            needs += _power_needs(node, tensors, numbers)
        else:
            needs += _function_needs(node.xreplace(numbers))
    return needs


def _power_needs(node: sympy.Pow, tensors: set[sympy.Symbol], numbers: dict[sympy.Symbol, sympy.Number]) -> _Needs:
    """What a power needs of a base that holds a tensor: positive under a tensor or a negative non-integer
    exponent, >= 0 under another non-integer one; an integer power is defined everywhere but at a pole."""
    base, exponent = node.base.xreplace(numbers), node.exp
    if not base.free_symbols & tensors:
        return _Needs()
    text = sympy.sstr(node)
    if exponent.free_symbols & tensors:
        return _Needs(restrictions=(_Restriction(base, 0.0, None, f"{text} needs a positive base"),))
    if exponent.is_integer:  # a number, or an int scalar: defined everywhere but at a pole
        return _Needs(kinks=(base,)) if exponent.xreplace(numbers).is_negative else _Needs()
    if exponent.xreplace(numbers).is_negative:
        return _Needs(restrictions=(_Restriction(base, 0.0, None, f"{text} needs a positive base"),))
    # x**2.5, x**n with a float scalar n: defined at 0, where n*x**(n-1) is hard
    return _Needs(
        restrictions=(_Restriction(base, 0.0, None, f"{text} needs a base >= 0", closed=True),), bases=(base,)
    )


#: The jumps of a rounding function test inputs keep away from: those of arguments in [-JUMPS, JUMPS] (inputs are
#: drawn from a few units around 0; a scaled argument, round(x/s), spreads them wider).
JUMPS = 64


def _function_needs(node: sympy.Basic) -> _Needs:
    """What any other node (scalars replaced by their defaults) needs: the domain of a function of the
    registry, the kinks of Abs, sign, Heaviside (at 0), Max and Min (at ties) and of a condition."""
    function = by_class(type(node))
    if function is not None and function.domain is not None:
        d = function.domain
        what = f"{sympy.sstr(node)} {d.what}"
        return _Needs(restrictions=(_Restriction(node.args[-1], d.low, d.high, what, d.closed, d.sample),))
    if isinstance(node, kink_classes(Kink.AT_ZERO)):  # Abs, sign, Heaviside
        return _Needs(kinks=(node.args[0],))
    if isinstance(node, kink_classes(Kink.AT_TIES)):  # Max, Min
        return _Needs(kinks=tuple(a - b for i, a in enumerate(node.args) for b in node.args[i + 1 :]))
    if isinstance(node, kink_classes(Kink.AT_INTEGERS)):  # floor, ceil, trunc jump at each integer
        return _Needs(kinks=tuple(node.args[0] - k for k in range(-JUMPS, JUMPS + 1)))
    if isinstance(node, kink_classes(Kink.AT_HALF_INTEGERS)):  # round jumps halfway between integers
        return _Needs(kinks=tuple(node.args[0] - sympy.Rational(2 * k + 1, 2) for k in range(-JUMPS, JUMPS)))
    if isinstance(node, sympy.core.relational.Relational):
        return _Needs(kinks=(node.lhs - node.rhs,))
    return _Needs()


def _bounds(needs: _Needs, tensors: set[sympy.Symbol], removable: list[sympy.Symbol]) -> dict[sympy.Symbol, _Bounds]:
    """Per tensor: its support and sampling bounds from the restrictions, the points to avoid from the kinks,
    special points from the bases' zeros and 0 for a tensor in ``removable``. Only what is affine in one
    tensor is placed; the rest is left to the numeric check."""
    bounds = {s: _Bounds() for s in tensors}
    for s in removable:  # 0/0 as written at 0 (x/expm1(x)): the op computes the limit there
        bounds[s].special.add(0.0)
    for restriction in needs.restrictions:
        _restrict(bounds, restriction, tensors)
    for kink in needs.kinks:
        for alternative in _without_minmax(kink):  # Min(Max(x, 0), 6) switches where x = 0 and x = 6
            zero = _zero(alternative, tensors)
            if zero is not None:
                bounds[zero[0]].avoid.add(zero[1])
    for base in needs.bases:
        zero = _zero(base.args[0] if isinstance(base, sympy.Abs) else base, tensors)
        if zero is not None:
            bounds[zero[0]].special.add(zero[1])
    return bounds


def _restrict(bounds: dict[sympy.Symbol, _Bounds], restriction: _Restriction, tensors: set[sympy.Symbol]) -> None:
    """Narrow the bounds of the tensor the restricted argument is affine in; nothing where sympy proves
    the restriction holds everywhere (``log(x**2 + 1)``, ``log(1/(1 + exp(-x)))``) or the argument is not
    affine (left to the numeric check)."""
    low, high, closed = restriction.low, restriction.high, restriction.closed
    if _holds(restriction.arg, low, high, closed, tensors):
        return
    affine = _affine(restriction.arg, tensors)
    if affine is None:
        return
    s, k, c = affine
    sample_low, sample_high = restriction.sample or (low, high)
    for bound, sample_bound, is_low in ((low, sample_low, True), (high, sample_high, False)):
        if bound is None or sample_bound is None:
            continue
        x, y = (bound - c) / k + 0.0, (sample_bound - c) / k + 0.0
        if (k > 0) == is_low:  # a lower bound on s
            bounds[s].support &= Support(low=x, low_closed=closed)
            bounds[s].add_low(y, restriction.what)
        else:
            bounds[s].support &= Support(high=x, high_closed=closed)
            bounds[s].add_high(y, restriction.what)


def _zero(arg: sympy.Expr, tensors: set[sympy.Symbol]) -> tuple[sympy.Symbol, float] | None:
    """The tensor ``arg`` is affine in and where ``arg`` is 0; None if it is not affine in one tensor."""
    affine = _affine(arg, tensors)
    if affine is None:
        return None
    s, k, c = affine
    return s, -c / k + 0.0


def _input_domain(tensor: TensorArg, bounds: _Bounds) -> InputDomain:
    """The tensor's domain from its spec and its inferred bounds."""
    low, high, reason = _interval(tensor, bounds)
    support, support_reason = _support(tensor, bounds)
    return InputDomain(
        tensor.name,
        float(low),
        float(high),
        tuple(float(v) for v in _avoid(tensor, bounds, low, high)),
        reason,
        support,
        support_reason,
        tuple(float(v) for v in _special(support, bounds)),
    )


def _interval(tensor: TensorArg, bounds: _Bounds) -> tuple[float, float, str]:
    """Where test inputs are drawn from, and why: the declared domain, else inside the inferred bounds
    (:data:`MARGIN` from each, :data:`WIDTH` wide where bounded on one side), else the default."""
    if tensor.domain is not None:
        low, high = tensor.domain
        return low, high, "declared in the spec"
    if bounds.low is None and bounds.high is None:
        low, high = DEFAULT_DOMAIN
        return low, high, "the default"
    if bounds.low is not None and bounds.high is not None:
        margin = min(MARGIN, (bounds.high - bounds.low) / 8)
        low, high = bounds.low + margin, bounds.high - margin
    elif bounds.low is not None:
        low, high = bounds.low + MARGIN, bounds.low + WIDTH
    else:
        low, high = bounds.high - WIDTH, bounds.high - MARGIN
    return low, high, "inferred: " + "; ".join(dict.fromkeys(bounds.reasons))


def _support(tensor: TensorArg, bounds: _Bounds) -> tuple[Support, str]:
    """Where the op is defined in the tensor, and why: the declared domain (closed), else the inferred support."""
    if tensor.domain is not None:
        low, high = tensor.domain
        return Support(low, high, True, True), "declared in the spec"
    return bounds.support, "; ".join(dict.fromkeys(bounds.reasons)) if bounds.reasons else "nothing restricts it"


def _avoid(tensor: TensorArg, bounds: _Bounds, low: float, high: float) -> tuple[float, ...]:
    """The points test inputs keep away from: declared, else the inferred kinks and poles inside the interval."""
    if tensor.avoid is not None:
        return tensor.avoid
    return tuple(sorted(v for v in bounds.avoid if low < v < high))


def _special(support: Support, bounds: _Bounds) -> tuple[float, ...]:
    """The points of the support where the op is hardest: its closed ends and the inferred special points."""
    return tuple(sorted(v for v in {*support.closed_ends, *bounds.special} if v in support))


def _checked(
    spec: OpSpec, domains: dict[str, InputDomain], exprs: list[sympy.Expr], symbols: dict[str, sympy.Symbol]
) -> tuple[InputDomain, ...]:
    """The domains, those of undeclared tensors repaired where ``exprs`` are not finite and real there
    (:func:`_repair`); a :class:`DerivationError` if no interval tried works."""
    free = [t.name for t in spec.tensors if t.domain is None]
    repaired = _repair(domains, exprs, symbols, free)
    if repaired is None:
        names = " and ".join(free)
        raise DerivationError(
            f"no test inputs were found where the forward and its derivatives are finite and real "
            f"(tried {names} in {', '.join(f'[{low:g}, {high:g}]' for low, high in CANDIDATES)})",
            where=f"{spec.source}: forward",
            hint=f"declare where the op is defined: domain = [1.0, 2.0] in the spec's [tensors.{free[0]}], or "
            f"--domain {free[0]}=1.0,2.0 on the command line",
        )
    return tuple(repaired.values())


UNKNOWN_SUPPORT = "not inferred: the forward is not real everywhere, the tests skip points where it is not"
# Intervals tried, in order, for a tensor whose inferred interval gives a non-real or infinite value.
CANDIDATES = ((0.25, 3.0), (0.1, 0.9), (1.25, 4.0), (3.0, 6.0), (-0.9, -0.1), (-3.0, -0.25))
_SAMPLES = 24
FLOAT64_SAFE = 1e100  # values beyond this are treated as overflowing


def _repair(
    domains: dict[str, InputDomain], exprs: list[sympy.Expr], symbols: dict[str, sympy.Symbol], free: list[str]
) -> dict[str, InputDomain] | None:
    """Check the domains numerically; where the forward or a derivative is not finite and real, try others
    (None: nothing tried works).

    Structural inference cannot see that log(p / (1 - p)) needs 0 < p < 1; evaluating it can. Only
    tensors without a declared domain are changed.
    """
    valid = _evaluates(exprs, symbols, domains)
    if valid is not False or not free:  # declared domains are the user's word
        return domains
    reason = "inferred: the forward and its derivatives are finite and real there"
    # One tensor at a time first (the others keep their inferred intervals), then all together
    # (log(cos(x * y)) needs both small).
    for names in [[name] for name in free] + ([free] if len(free) > 1 else []):
        for low, high in CANDIDATES:
            trial = dict(domains)
            for name in names:
                avoid = tuple(v for v in domains[name].avoid if low < v < high)
                trial[name] = dataclasses.replace(domains[name], low=low, high=high, avoid=avoid, reason=reason)
                if trial[name].support == Support():
                    trial[name] = dataclasses.replace(trial[name], support_reason=UNKNOWN_SUPPORT)
            if _evaluates(exprs, symbols, trial):
                return trial
    return None


def _evaluates(
    exprs: list[sympy.Expr], symbols: dict[str, sympy.Symbol], domains: dict[str, InputDomain]
) -> bool | None:
    """Whether every expression is finite and real at sample points of the domains; None if unknown."""
    import mpmath

    names = list(domains)
    arguments = [symbols[n] for n in names]
    exprs = [stable.expand_kernels(e) for e in exprs]
    # The stable primitives as the op computes them, not as the textbook formula, which cancels at mpmath's
    # default 15 digits (log(1 - sigmoid(164)) is log(0) there, though the op's logsigmoid(-164) is -164).
    modules = [mpmath_functions(), "mpmath"]
    try:  # all at once: lambdify's cost grows with the number of arguments, per call
        functions = [sympy.lambdify(arguments, list(exprs), modules=modules)]
    except Exception:
        functions = []
        for expr in exprs:  # each on its own: one that lambdify cannot translate leaves the others checked
            try:
                functions.append(sympy.lambdify(arguments, [expr], modules=modules))
            except Exception:  # no opinion on this one
                continue
    if not functions:
        return None

    def f(*point):
        return [value for function in functions for value in function(*point)]

    for unit in _sample_points(len(names)):
        point = []
        for name, u in zip(names, unit):
            d = domains[name]
            value = d.low + (d.high - d.low) * u
            if any(abs(value - a) < 0.05 for a in d.avoid):
                value += 0.1
            point.append(mpmath.mpf(value))
        try:
            values = f(*point)
        except (ZeroDivisionError, ValueError, OverflowError):
            return False
        except TypeError as exc:  # a case distinction on a complex value (log of a negative) is not real
            if "complex" in str(exc) or "mpc" in str(exc):
                return False
            return None
        except Exception:
            return None
        for v in values:
            if isinstance(v, mpmath.mpc) and abs(v.imag) > 1e-12:
                return False
            try:
                real = mpmath.mpf(v.real if isinstance(v, mpmath.mpc) else v)
            except (TypeError, ValueError):
                return None
            if not mpmath.isfinite(real) or abs(real) > FLOAT64_SAFE:  # mpmath never overflows; float64 does
                return False
    return True


def _sample_points(dimensions: int) -> list[tuple[float, ...]]:
    """Points of the unit cube: its corners (up to 16), then a Kronecker sequence, which, unlike one
    sequence shifted per dimension, does not put every point on one line."""
    steps = [math.sqrt(p) % 1.0 for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)]
    corners = list(itertools.islice(itertools.product((0.001, 0.999), repeat=dimensions), 16))
    inner = [tuple((0.5 + k * steps[i % len(steps)]) % 1.0 for i in range(dimensions)) for k in range(_SAMPLES)]
    return corners + inner


def _without_minmax(expr: sympy.Expr, limit: int = 16) -> list[sympy.Expr]:
    """``expr`` with each Max/Min replaced by each of its arguments in turn (at most ``limit`` results)."""
    node = next((n for n in sympy.preorder_traversal(expr) if isinstance(n, (sympy.Max, sympy.Min))), None)
    if node is None:
        return [expr]
    results: list[sympy.Expr] = []
    for arg in node.args:
        results += _without_minmax(expr.xreplace({node: arg}), limit)
        if len(results) >= limit:
            break
    return results[:limit]


def learnable_init(tensor_init: float | None, domain: InputDomain) -> float:
    """The init of a learnable tensor: the spec's, else 1.0 if inside its domain, else the midpoint."""
    if tensor_init is not None:
        return tensor_init
    if domain.low < 1.0 < domain.high and all(abs(1.0 - a) > 0.1 for a in domain.avoid):
        return 1.0
    return round((domain.low + domain.high) / 2, 6)
