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

import sympy

from . import stable
from .errors import DerivationError
from .expression import ParsedExpression
from .functions import Kink, by_class, kink_classes, mpmath_functions
from .spec import OpSpec
from .stable import stabilize, to_literal

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
    defaults = {parsed.symbols[s.name]: s.default for s in spec.scalars if s.type != "bool"}
    numbers = {k: sympy.Number(v) for k, v in defaults.items()}
    literal = to_literal(parsed.expr)  # scalars still symbols: an int scalar exponent is an integer power
    tensors = {parsed.symbols[t.name] for t in spec.tensors}
    bounds = {s: _Bounds() for s in tensors}
    for name in removable:  # 0/0 as written at 0 (x/expm1(x)): the op computes the limit there
        bounds[parsed.symbols[name]].special.add(0.0)

    def constrain(
        arg: sympy.Expr,
        low: float | None,
        high: float | None,
        what: str,
        *,
        closed: bool = False,
        sample: tuple[float | None, float | None] | None = None,
    ) -> None:
        """The op needs ``low < arg < high`` (``<=`` where ``closed``); test inputs are drawn from
        ``sample`` (default: the same bounds) when narrower."""
        if _holds(arg, low, high, closed, tensors):
            return  # holds everywhere, e.g. log(x**2 + 1) or log(1/(1 + exp(-x)))
        affine = _affine(arg, tensors)
        if affine is None:
            return  # left to the numeric check
        s, k, c = affine
        sample_low, sample_high = sample or (low, high)
        for bound, sample_bound, is_low in ((low, sample_low, True), (high, sample_high, False)):
            if bound is None or sample_bound is None:
                continue
            x, y = (bound - c) / k + 0.0, (sample_bound - c) / k + 0.0
            if (k > 0) == is_low:  # a lower bound on s
                bounds[s].support &= Support(low=x, low_closed=closed)
                bounds[s].add_low(y, what)
            else:
                bounds[s].support &= Support(high=x, high_closed=closed)
                bounds[s].add_high(y, what)

    def zero_of_base(base: sympy.Expr) -> None:
        """A special point where the base of a power with a non-integer exponent is 0."""
        inner = base.args[0] if isinstance(base, sympy.Abs) else base
        affine = _affine(inner, tensors)
        if affine is not None:
            s, k, c = affine
            bounds[s].special.add(-c / k + 0.0)

    def kink(a: sympy.Expr) -> None:
        for alternative in _without_minmax(a):  # Min(Max(x, 0), 6) switches where x = 0 and x = 6
            affine = _affine(alternative, tensors)
            if affine is not None:
                s, k, c = affine
                bounds[s].avoid.add(-c / k + 0.0)

    def power(node: sympy.Pow) -> None:
        base, exponent = node.base.xreplace(numbers), node.exp
        if not base.free_symbols & tensors:
            return
        text = sympy.sstr(node)
        if exponent.free_symbols & tensors:
            constrain(base, 0.0, None, f"{text} needs a positive base")
        elif exponent.is_integer:  # a number, or an int scalar: defined everywhere but at a pole
            if exponent.xreplace(numbers).is_negative:
                kink(base)
        elif exponent.xreplace(numbers).is_negative:
            constrain(base, 0.0, None, f"{text} needs a positive base")
        else:  # x**2.5, x**n with a float scalar n: defined at 0, where n*x**(n-1) is hard
            constrain(base, 0.0, None, f"{text} needs a base >= 0", closed=True)
            zero_of_base(base)

    for node in sympy.preorder_traversal(literal):
        if isinstance(node, sympy.Pow):
            power(node)
            continue
        node = node.xreplace(numbers)
        text = sympy.sstr(node)
        function = by_class(type(node))
        if function is not None and function.domain is not None:
            d = function.domain
            constrain(node.args[-1], d.low, d.high, f"{text} {d.what}", closed=d.closed, sample=d.sample)
        elif isinstance(node, kink_classes(Kink.AT_ZERO)):  # Abs, sign, Heaviside
            kink(node.args[0])
        elif isinstance(node, kink_classes(Kink.AT_TIES)):  # Max, Min
            for i, a in enumerate(node.args):
                for b in node.args[i + 1 :]:
                    kink(a - b)
        elif isinstance(node, sympy.core.relational.Relational):
            kink(node.lhs - node.rhs)

    domains = {}
    for t in spec.tensors:
        s = parsed.symbols[t.name]
        b = bounds[s]
        if t.domain is not None:
            low, high = t.domain
            reason = "declared in the spec"
            support = Support(low, high, True, True)
            support_reason = "declared in the spec"
        else:
            support = b.support
            support_reason = "; ".join(dict.fromkeys(b.reasons)) if b.reasons else "nothing restricts it"
            if b.low is None and b.high is None:
                low, high = DEFAULT_DOMAIN
                reason = "the default"
            else:
                if b.low is not None and b.high is not None:
                    margin = min(MARGIN, (b.high - b.low) / 8)
                    low, high = b.low + margin, b.high - margin
                elif b.low is not None:
                    low, high = b.low + MARGIN, b.low + WIDTH
                else:
                    low, high = b.high - WIDTH, b.high - MARGIN
                reason = "inferred: " + "; ".join(dict.fromkeys(b.reasons))
        avoid = t.avoid if t.avoid is not None else tuple(sorted(v for v in b.avoid if low < v < high))
        special = tuple(sorted(v for v in {*support.closed_ends, *b.special} if v in support))
        domains[t.name] = InputDomain(
            t.name,
            float(low),
            float(high),
            tuple(float(v) for v in avoid),
            reason,
            support,
            support_reason,
            tuple(float(v) for v in special),
        )
    checked = [stabilize(parsed.expr, tensors).xreplace(numbers), *(p.xreplace(numbers) for p in partials)]
    free = [t.name for t in spec.tensors if t.domain is None]
    repaired = _repair(domains, checked, parsed.symbols, free)
    if repaired is None:
        names = " and ".join(free)
        raise DerivationError(
            f"no test inputs were found where the forward and its derivatives are finite and real "
            f"(tried {names} in {', '.join(f'[{low:g}, {high:g}]' for low, high in CANDIDATES)})",
            where=f"{spec.source}: forward",
            hint=f"declare where the op is defined in the spec file, e.g. [tensors.{free[0]}] domain = [1.0, 2.0]",
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
