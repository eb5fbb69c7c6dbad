"""Stage 3: differentiate the forward with respect to every tensor argument.

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
from sympy.codegen import cfunctions

from .errors import DerivationError
from .expression import ParsedExpression
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
class Derivation:
    """The stable forward and its partial derivatives, one per tensor argument in declaration order."""

    parsed: ParsedExpression  # the forward as written
    forward: sympy.Expr  # the same function, in stable primitives
    partials: tuple[Partial, ...]
    warnings: tuple[str, ...] = ()  # for the user: e.g. a tensor whose gradient is zero everywhere


#: Increasing functions with f(0) = 0: f(u) has the sign of u, so a step of f(u) is a step of u.
_SIGN_PRESERVING = (cfunctions.expm1, cfunctions.log1p, sympy.sinh, sympy.tanh, sympy.atan, sympy.asinh, sympy.erf)


def _step_argument(arg: sympy.Expr) -> sympy.Expr:
    """The simplest expression with the sign of ``arg``: ``-2*expm1(x/2)`` -> ``-x``.

    Heaviside(-2*expm1(x/2)) (from Min(0, 2*(exp(x/2) - 1))) is the step x < 0: printed that way it is
    cheaper, and the printer can keep the input of the step's other factors inside its region.
    """
    while True:
        coefficient, rest = arg.as_coeff_Mul()
        if coefficient.is_Number and coefficient != 0 and (abs(coefficient) != 1 or not rest.is_Add):
            arg = sympy.sign(coefficient) * rest
        if isinstance(rest, _SIGN_PRESERVING):
            arg = sympy.sign(coefficient) * rest.args[0]
            continue
        return arg


def apply_kink_convention(expr: sympy.Expr) -> sympy.Expr:
    """Replace the distributions sympy's derivatives contain by their values under the kink convention."""
    expr = expr.replace(lambda e: isinstance(e, sympy.DiracDelta), lambda e: sympy.S.Zero)
    return expr.replace(
        lambda e: isinstance(e, sympy.Heaviside),
        lambda e: sympy.Heaviside(_step_argument(e.args[0]), 0),
    )


class _Power(sympy.Function):
    """``base**exponent`` while it is differentiated: d/db b**e = e*b**(e - 1), never e*b**e/b.

    sympy differentiates a power with a symbolic exponent to ``n*x**n/x``, which is 0/0 at x = 0 for every
    n (even n = 1), and ``Abs(x)**p`` to ``p*Abs(x)**p*sign(x)/Abs(x)``: a division the forward never did.
    Standing in for such powers while sympy applies the chain rule keeps the exponent's arithmetic out
    of the denominator: ``n*x**(n - 1)``, ``p*sign(x)*Abs(x)**(p - 1)``, finite wherever the forward and
    its true derivative are.
    """

    nargs = 2

    def fdiff(self, argindex=1):
        base, exponent = self.args
        if argindex == 1:
            return exponent * _Power(base, exponent - 1)
        return _Power(base, exponent) * sympy.log(base)


def _hold_powers(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with its powers of non-integer or symbolic exponent replaced by :class:`_Power`."""
    return expr.replace(
        lambda e: isinstance(e, sympy.Pow) and not e.exp.is_Integer and e.base is not sympy.E,
        lambda e: _Power(*e.args),
    )


def _release_powers(expr: sympy.Expr) -> sympy.Expr:
    return expr.replace(lambda e: isinstance(e, _Power), lambda e: sympy.Pow(*e.args))


def _merge_powers(expr: sympy.Expr) -> sympy.Expr:
    """Products of powers of one base with a non-integer exponent as one power: ``s*s**(g - 1)`` -> ``s**g``.

    sympy keeps ``s*s**(g - 1)`` apart (for a base of unknown sign); printed as it is, it is ``0 * inf``
    where s underflows to 0 and g < 1, while ``s**g`` is 0.
    """

    def merge(product: sympy.Mul) -> sympy.Expr:
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


def _diff(expr: sympy.Expr, symbol: sympy.Symbol) -> sympy.Expr:
    """d expr / d symbol; a sum differentiates only its terms that contain ``symbol``.

    sympy's diff visits every term of a sum; for a sum of n terms in 3n + 1 tensors that makes the
    partials cost O(n**2) instead of O(n).
    """
    if isinstance(expr, sympy.Add):
        return sympy.Add(*[_diff(term, symbol) for term in expr.args if symbol in term.free_symbols])
    if expr.has(sympy.Pow):
        return _release_powers(sympy.diff(_hold_powers(expr), symbol))
    return sympy.diff(expr, symbol)


def derive(parsed: ParsedExpression, *, where: str = "forward") -> Derivation:
    """Differentiate the forward with respect to each tensor argument."""
    tensors = {parsed.symbols[name] for name in parsed.tensor_names}
    forward = stabilize(parsed.expr, tensors)
    partials = []
    for name in parsed.tensor_names:
        symbol = parsed.symbols[name]
        derivative = apply_kink_convention(_diff(forward, symbol))
        if sympy.count_ops(derivative) <= TIDY_LIMIT:
            # Pull out common factors ((2*a - 2*b)/(2*c) -> (a - b)/c); linear in the expression's size,
            # unlike simplify().
            derivative = sympy.factor_terms(derivative)
        derivative = stabilize(accurate_kernels(stabilize(derivative, tensors), tensors), tensors)
        derivative = _merge_powers(derivative)
        for node in sympy.preorder_traversal(derivative):
            if isinstance(node, _UNEVALUATED):
                raise DerivationError(
                    f"sympy cannot differentiate the forward with respect to {name!r}: "
                    f"it leaves {sympy.sstr(node)} unevaluated",
                    where=where,
                    hint="rewrite that part with functions sympy can differentiate",
                )
        partials.append(Partial(name=name, expr=derivative))
    flat = [p.name for p in partials if p.expr == 0 and parsed.symbols[p.name] in forward.free_symbols]
    return Derivation(parsed=parsed, forward=forward, partials=tuple(partials), warnings=_flat_warnings(parsed, flat))


#: Functions whose derivative is zero wherever it exists.
_STEPS = (sympy.sign, sympy.Heaviside)


def _flat_warnings(parsed: ParsedExpression, flat: list[str]) -> tuple[str, ...]:
    """A warning for each tensor the forward uses but whose gradient is identically zero."""
    warnings = []
    for name in flat:
        symbol = parsed.symbols[name]
        steps = sorted(
            {sympy.sstr(n) for n in sympy.preorder_traversal(parsed.expr) if isinstance(n, _STEPS) and n.has(symbol)}
        )
        through = f": it enters only through {', '.join(steps)}, flat away from the jump" if steps else ""
        warnings.append(
            f"the gradient with respect to {name!r} is zero everywhere{through}; training will not move {name}\n"
            f"  hint: for a gradient through a step use a smooth surrogate, e.g. tanh(k*u) for sign(u) or "
            f"sigmoid(k*u) for Heaviside(u); if {name} needs no gradient, ignore this"
        )
    return tuple(warnings)
