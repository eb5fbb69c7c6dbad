"""Stage 4: differentiate each output of the forward with respect to every tensor argument.

The forward is first rewritten into numerically stable primitives (:mod:`.stable`: ``log(1 + exp(x))``
becomes ``softplus(x)``), then differentiated, and the derivatives are rewritten too. Derivatives are
taken symbolically by sympy and then brought to one convention at points where the forward is not
differentiable (kinks), the convention PyTorch uses for relu and abs:

* ``DiracDelta`` (the derivative of a step, ``sign`` or ``Heaviside``) is 0;
* a ``Heaviside`` step inside a derivative is 0 at 0, so d/dx Max(x, 0) at x = 0 is 0;
* ``sign(0)`` is 0, so d/dx Abs(x) at x = 0 is 0.

A derivative that sympy leaves unevaluated (``Derivative``, ``Subs``) cannot become torch code: that is
an error naming the sub-expression, raised before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
from sympy.core.logic import fuzzy_and

from .errors import DerivationError
from .expression import ParsedExpression
from .functions import sign_preserving_classes, step_classes
from .stable import accurate_kernels, stabilize

#: Nodes a derivative must not contain: sympy could not evaluate it.
_UNEVALUATED = (sympy.Derivative, sympy.Subs, sympy.Integral)

#: Derivatives larger than this (in sympy operations) are left as sympy's diff returns them.
TIDY_LIMIT = 400

KINK_CONVENTION = (
    "At kinks scaffold follows PyTorch's convention: the derivative of a step (DiracDelta) is 0, "
    "Heaviside steps in derivatives are 0 at 0 and sign(0) = 0, so relu'(0) = 0 and |x|'(0) = 0."
)


@dataclass(frozen=True)
class Partial:
    """d(forward)/d(tensor), with the kink convention applied."""

    name: str
    expr: sympy.Expr


@dataclass(frozen=True)
class OutputDerivation:
    """One output of the op: its forward in stable primitives and its partial derivatives, one per tensor
    argument in declaration order."""

    name: str  # "" for the one unnamed output of a forward
    forward: sympy.Expr
    partials: tuple[Partial, ...]


def _step_argument(arg: sympy.Expr, tensors: frozenset[sympy.Symbol]) -> sympy.Expr:
    """The simplest expression with the sign of ``arg``: ``-alpha*expm1(x/alpha)`` -> ``-x``.

    Heaviside(-alpha*expm1(x/alpha)) (from Min(0, alpha*(exp(x/alpha) - 1))) is the step x < 0 whatever
    the sign of the scalar alpha: printed that way it is cheaper, the printer can keep the input of the
    step's other factors inside its region, and complementary steps can be recognised as such.
    Factors without tensors are stripped only when their product has a known sign.
    """
    scale, core = sympy.S.One, arg
    while True:
        independent, dependent = core.as_independent(*tensors, as_Add=False)
        scale *= independent
        if isinstance(dependent, sign_preserving_classes()):  # a step of f(u) is a step of u
            core = dependent.args[0]
            continue
        break
    sign = sympy.sign(scale)
    return sign * dependent if sign.is_Number and sign != 0 else arg


def apply_kink_convention(expr: sympy.Expr, tensors: frozenset[sympy.Symbol] = frozenset()) -> sympy.Expr:
    """Replace the distributions sympy's derivatives contain by their values under the kink convention.

    Where a sum holds complementary steps, ``A*Heaviside(u) + B*Heaviside(-u)`` (the pieces of a function
    written as Max(0, x) + Min(0, f(x)), as CELU is), the second step is 1 at u = 0: the sum is B there,
    the derivative from below, which is the derivative wherever the pieces join smoothly (CELU'(0) = 1,
    not 0 + 0), and PyTorch's value for leaky_relu at its kink.
    """
    expr = expr.replace(lambda e: isinstance(e, sympy.DiracDelta), lambda e: sympy.S.Zero)
    expr = expr.replace(
        lambda e: isinstance(e, sympy.Heaviside),
        lambda e: sympy.Heaviside(_step_argument(e.args[0], tensors), 0),
    )
    return expr.replace(lambda e: isinstance(e, sympy.Add), _join_complementary_steps)


def _join_complementary_steps(total: sympy.Add) -> sympy.Expr:
    steps = {h.args[0]: h for term in total.args for h in term.atoms(sympy.Heaviside) if h.args[1] == 0}
    lower = {steps[u]: sympy.Heaviside(u, 1) for u in steps if u.could_extract_minus_sign() and -u in steps}
    return total.xreplace(lower) if lower else total


class _Power(sympy.Function):
    """``base**exponent`` while it is differentiated: d/db b**e = e*b**(e - 1), never e*b**e/b.

    sympy differentiates a power with a symbolic exponent to ``n*x**n/x``, which is 0/0 at x = 0 for every
    n (even n = 1), and ``Abs(x)**p`` to ``p*Abs(x)**p*sign(x)/Abs(x)``: a division the forward never did.
    Where the exponent may be 0, the derivative is 0 there (not 0 * x**-1, nan at x = 0).
    Standing in for such powers while sympy applies the chain rule keeps the exponent's arithmetic out
    of the denominator: ``n*x**(n - 1)``, ``p*sign(x)*Abs(x)**(p - 1)``, finite wherever the forward and
    its true derivative are.
    """

    nargs = 2

    def _eval_is_extended_real(self) -> bool | None:
        # Real where the op is defined (its domain keeps the base of a non-integer power >= 0), so that
        # Abs(x**n - t) differentiates to sign(x**n - t) * ..., not to (x**n - t) * ... / Abs(x**n - t).
        base, exponent = self.args
        return fuzzy_and([base.is_extended_real, exponent.is_extended_real])

    def fdiff(self, argindex=1):
        base, exponent = self.args
        if argindex == 1:
            if exponent.is_zero is False:
                return exponent * _Power(base, exponent - 1)
            # b**0 is 1 for every b: its derivative is 0, also at b = 0 where 0 * b**-1 is nan (PyTorch's
            # pow_backward makes the same exception).
            return sympy.Piecewise((0, sympy.Eq(exponent, 0)), (exponent * _Power(base, exponent - 1), True))
        if base.is_zero is False:
            return _Power(base, exponent) * sympy.log(base)
        # At base 0 and exponent >= 0 (0**e is 0, or 1 at e = 0), 0 as PyTorch's pow_backward_exponent
        # has it, not 1 * log(0) = -inf at e = 0.
        zero = sympy.And(sympy.Eq(base, 0), exponent >= 0)
        return sympy.Piecewise((0, zero), (_Power(base, exponent) * sympy.log(base), True))


class _Abs(sympy.Function):
    """``Abs(x)`` while it is differentiated: d/dx Abs(u) = sign(u) * du/dx.

    sympy differentiates Abs of an argument it cannot prove real (``(x - y)/c`` with a scalar ``c`` that
    might be 0) through real and imaginary parts, then rewrites every Abs(v) inside as v/sign(v): 0/0 at
    v = 0. The op is real where it is defined, so the real rule applies.
    """

    nargs = 1

    def _eval_is_extended_real(self) -> bool | None:
        return self.args[0].is_extended_real

    def _eval_is_nonnegative(self) -> bool | None:
        return True if self.args[0].is_extended_real else None

    def fdiff(self, argindex=1):
        return sympy.sign(self.args[0])


class _Sign(sympy.Function):
    """``sign(x)`` while it is differentiated: 0, the kink convention's derivative of a step, also where
    sympy cannot prove the argument real (it leaves ``Derivative(sign((x - y)/c), x)`` unevaluated), as in
    the second derivative of ``Abs((x - y)/c)``."""

    nargs = 1

    def _eval_is_extended_real(self) -> bool | None:
        return True

    def fdiff(self, argindex=1):
        return sympy.S.Zero


def _hold_powers(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with its powers of non-integer or symbolic exponent replaced by :class:`_Power`, its
    absolute values by :class:`_Abs` and its signs by :class:`_Sign`."""
    expr = expr.replace(lambda e: isinstance(e, sympy.Abs), lambda e: _Abs(*e.args))
    expr = expr.replace(lambda e: isinstance(e, sympy.sign), lambda e: _Sign(*e.args))
    return expr.replace(
        lambda e: isinstance(e, sympy.Pow) and not e.exp.is_Integer and e.base is not sympy.E,
        lambda e: _Power(*e.args),
    )


def _release_powers(expr: sympy.Expr) -> sympy.Expr:
    expr = expr.replace(lambda e: isinstance(e, _Sign), lambda e: sympy.sign(*e.args))
    expr = expr.replace(lambda e: isinstance(e, _Power), lambda e: sympy.Pow(*e.args))
    return expr.replace(lambda e: isinstance(e, _Abs), lambda e: sympy.Abs(*e.args))


def _merge_powers(expr: sympy.Expr) -> sympy.Expr:
    """Products of powers of one base with a non-integer exponent as one power: ``s*s**(g - 1)`` -> ``s**g``.

    sympy keeps ``s*s**(g - 1)`` apart (for a base of unknown sign); printed as it is, it is ``0 * inf``
    where s underflows to 0 and g < 1, while ``s**g`` is 0.
    """

    def merge(product: sympy.Mul) -> sympy.Expr:
        cases = [f for f in product.args if isinstance(f, sympy.Piecewise)]
        if len(cases) == 1 and cases[0].has(sympy.Pow):
            # x * Piecewise((0, k == 0), (k*(x/l)**(k - 1), True)): the factors go into the branches where
            # a power there can take them in (only then: the order of a product's factors is the order its
            # printed code multiplies in, and a tiny factor between two huge ones keeps it finite)
            rest = sympy.Mul(*[f for f in product.args if f is not cases[0]])
            branches = [(rest * e, c) for e, c in cases[0].args]
            if any(_absorb_quotient(e) != e for e, _ in branches if e.is_Mul):
                return sympy.Piecewise(*[(_merge_powers(e), c) for e, c in branches])
        product = _absorb_quotient(product)
        if not product.is_Mul:
            return product
        exponents: dict[sympy.Expr, list[sympy.Expr]] = {}
        for factor in product.args:
            if factor.is_Number or isinstance(factor, sympy.exp):
                exponents.setdefault(factor, []).append(sympy.S.One)
            else:
                base, exponent = factor.as_base_exp()
                exponents.setdefault(base, []).append(exponent)
        if not any(len(e) > 1 and not all(x.is_Integer for x in e) for e in exponents.values()):
            return product
        return sympy.Mul(*[sympy.Pow(base, sympy.Add(*e)) for base, e in exponents.items()])

    return expr.replace(lambda e: e.is_Mul, merge)


def _absorb_quotient(product: sympy.Mul) -> sympy.Expr:
    """``(x/l)**e * x * l**-2`` -> ``(x/l)**(e + 1) / l``: a power of a product or quotient ``q`` with a
    non-integer exponent takes in the factors of ``q`` that the product has beside it. The chain rule
    writes d/dl (x/l)**e as ``e*(x/l)**(e - 1) * (-x/l**2)``, which is 0 * inf at x = 0 for e < 1 (the
    Weibull CDF's derivative in its scale), while ``-e*(x/l)**e/l`` is 0."""
    factors = list(product.args)
    for f in factors:
        base, exponent = f.as_base_exp()
        if not base.is_Mul or exponent.is_Integer:
            continue
        have = {}
        for g in factors:
            if g is not f:
                b, e = g.as_base_exp()
                have[b] = have.get(b, 0) + e
        need = base.as_powers_dict()
        if all(e.is_Integer and have.get(b, 0) != 0 and (have[b] / e).is_Integer and have[b] / e >= 1
               for b, e in need.items()):  # fmt: skip
            rest = sympy.Mul(*[g for g in factors if g is not f]) / base
            return sympy.Pow(base, exponent + 1) * rest
    return product


def _diff(expr: sympy.Expr, symbol: sympy.Symbol) -> sympy.Expr:
    """d expr / d symbol; a sum differentiates only its terms that contain ``symbol``.

    sympy's diff visits every term of a sum; for a sum of n terms in 3n + 1 tensors that makes the
    partials cost O(n**2) instead of O(n).
    """
    if isinstance(expr, sympy.Add):
        return sympy.Add(*[_diff(term, symbol) for term in expr.args if symbol in term.free_symbols])
    if expr.has(sympy.Pow, sympy.Abs, sympy.sign):
        return _release_powers(sympy.diff(_hold_powers(expr), symbol))
    return sympy.diff(expr, symbol)


def differentiate(
    expr: sympy.Expr, symbol: sympy.Symbol, tensors: frozenset[sympy.Symbol], *, what: str, where: str
) -> sympy.Expr:
    """d expr / d symbol, with the kink convention applied, in stable primitives (``tensors``: the
    symbols that are tensors; the rewrites leave expressions of the others alone)."""
    derivative = apply_kink_convention(_diff(expr, symbol), tensors)
    if sympy.count_ops(derivative) <= TIDY_LIMIT:
        # Pull out common factors ((2*a - 2*b)/(2*c) -> (a - b)/c); linear in the expression's size,
        # unlike simplify().
        derivative = sympy.factor_terms(derivative)
    derivative = stabilize(accurate_kernels(stabilize(derivative, tensors), tensors), tensors)
    derivative = _merge_powers(derivative)
    for node in sympy.preorder_traversal(derivative):
        if isinstance(node, _UNEVALUATED):
            raise DerivationError(
                f"sympy cannot differentiate {what} with respect to {str(symbol)!r}: "
                f"it leaves {sympy.sstr(node)} unevaluated",
                where=where,
                hint="rewrite that part with functions sympy can differentiate",
            )
    return derivative


def unused_scalar_warnings(parsed: ParsedExpression) -> tuple[str, ...]:
    """A warning for each scalar argument neither the forward nor a custom gradient uses: it stays an
    argument of the op."""
    used = set().union(*(e.free_symbols for e in parsed.exprs), *(e.free_symbols for _, e in parsed.gradients))
    return tuple(
        f"the scalar argument {name!r} is not used in the forward; the op still takes it\n"
        f"  hint: remove it from the spec (or the --scalar flag), or use it in the expression"
        for name in parsed.scalar_names
        if parsed.symbols[name] not in used
    )


def flat_warnings(parsed: ParsedExpression, flat: list[str]) -> tuple[str, ...]:
    """A warning for each tensor the forward uses but whose gradient is identically zero."""
    warnings = []
    step_kinds = step_classes()  # sign, Heaviside: their derivative is zero wherever it exists
    for name in flat:
        symbol = parsed.symbols[name]
        steps = sorted(
            {
                sympy.sstr(n)
                for n in sympy.preorder_traversal(sympy.Tuple(*parsed.exprs))
                if isinstance(n, step_kinds) and n.has(symbol)
            }
        )
        through = f": it enters only through {', '.join(steps)}, flat away from the jump" if steps else ""
        warnings.append(
            f"the gradient with respect to {name!r} is zero everywhere{through}; training will not move {name}\n"
            f'  hint: give it a straight-through gradient, [gradients] {name} = "grad" (--gradient {name}=grad), '
            f"or use a smooth surrogate, e.g. tanh(k*u) for sign(u) or sigmoid(k*u) for Heaviside(u); if {name} "
            "needs no gradient, ignore this"
        )
    return tuple(warnings)
