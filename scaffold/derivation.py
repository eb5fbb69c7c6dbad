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

from .errors import DerivationError
from .expression import ParsedExpression
from .stable import stabilize

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


def apply_kink_convention(expr: sympy.Expr) -> sympy.Expr:
    """Replace the distributions sympy's derivatives contain by their values under the kink convention."""
    expr = expr.replace(lambda e: isinstance(e, sympy.DiracDelta), lambda e: sympy.S.Zero)
    return expr.replace(
        lambda e: isinstance(e, sympy.Heaviside) and e.args[1:] != (sympy.S.Zero,),
        lambda e: sympy.Heaviside(e.args[0], 0),
    )


def _diff(expr: sympy.Expr, symbol: sympy.Symbol) -> sympy.Expr:
    """d expr / d symbol; a sum differentiates only its terms that contain ``symbol``.

    sympy's diff visits every term of a sum; for a sum of n terms in 3n + 1 tensors that makes the
    partials cost O(n**2) instead of O(n).
    """
    if isinstance(expr, sympy.Add):
        return sympy.Add(*[_diff(term, symbol) for term in expr.args if symbol in term.free_symbols])
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
        derivative = stabilize(derivative, tensors)
        for node in sympy.preorder_traversal(derivative):
            if isinstance(node, _UNEVALUATED):
                raise DerivationError(
                    f"sympy cannot differentiate the forward with respect to {name!r}: "
                    f"it leaves {sympy.sstr(node)} unevaluated",
                    where=where,
                    hint="rewrite that part with functions sympy can differentiate",
                )
        partials.append(Partial(name=name, expr=derivative))
    return Derivation(parsed=parsed, forward=forward, partials=tuple(partials))
