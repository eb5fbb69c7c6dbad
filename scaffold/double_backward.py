"""Stage 5, for both planners: the derived double backward (backward's own backward).

Backward computes ``grad_i = B_i(upstream, saved)`` for each tensor argument i, elementwise math in the
upstream gradients and the tensors it reads. Differentiated again, each of backward's inputs v (an upstream
gradient, or a saved tensor that is not a bool mask) gets ``sum_i grad_grad_i * dB_i/dv``. The partials
dB_i/dv are derived and rewritten like the first ones (:func:`.derivation.differentiate`), so that they stay
finite where a factor of B_i overflows: autograd of B_i's code multiplies that inf by the 0 the rest of the
formula makes of it, and 0 * inf is nan.

The elementwise planner (:mod:`.plan`) gives its backward's formulas as they are. The structured one
(:mod:`.dataflow`) walks its nodes in reverse: :func:`composed_gradients` writes each argument's gradient as
the chain rule composes it, in terms of what its backward reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sympy

from .derivation import differentiate

if TYPE_CHECKING:
    from .plan import DerivativeCode

#: Second partials derived for a double backward, at most: beyond, autograd differentiates backward's code
#: (a sum of 64 tanh terms in 193 tensors would need about a thousand).
MAX_SECOND_PARTIALS = 64
GRAD_GRAD_PREFIX = "grad_grad_"

#: Shares the temporaries of a list of formulas (the planner's CSE): (formulas, their labels, names taken).
Share = Callable[[list[sympy.Expr], list[str], set[str]], "DerivativeCode"]


@dataclass(frozen=True)
class DoubleBackward:
    """Backward's own backward, for a second derivative (double backward).

    Backward computes ``grad_i = B_i(grad_output, saved)`` for each tensor argument i. Differentiated
    again, each of its inputs v (grad_output, then each saved tensor that is not a bool mask) gets
    ``sum_i grad_grad_i * dB_i/dv``, where ``grad_grad_i`` is the gradient arriving at ``grad_i`` (None
    where nothing differentiates grad_i: its terms are skipped). Autograd chains the part through a saved
    output itself. The partials dB_i/dv are derived and rewritten like the first ones, so that they stay
    finite where a factor of B_i overflows (autograd of B_i's code multiplies that inf by 0).
    """

    inputs: tuple[str, ...]  # grad_output, then the saved tensors with a gradient, in backward's order
    pairs: tuple[tuple[int, int], ...]  # (index into inputs, index of the tensor argument) of each term
    code: DerivativeCode  # a term per pair: dB_i/dv, to be multiplied by grad_grad_i


def derive_double_backward(
    parts: list[list[sympy.Expr]],
    names: list[str],
    differentiable: list[sympy.Symbol],
    tensors: frozenset[sympy.Symbol],
    taken: set[str],
    where: str,
    share: Share,
) -> DoubleBackward | None:
    """The :class:`DoubleBackward` of backward's formulas, given as ``parts`` per tensor argument in ``names``
    (one part, or with several outputs one per output): each part's derivative is a term of its own, reduced
    on its own in turn. None where there is nothing to derive, or more than :data:`MAX_SECOND_PARTIALS`."""
    pairs = [
        (a, i, p)
        for a, v in enumerate(differentiable)
        for i, terms in enumerate(parts)
        for p in terms
        if v in p.free_symbols
    ]
    if not pairs or len(pairs) > MAX_SECOND_PARTIALS:
        return None
    terms, kept = [], []
    for a, i, p in pairs:
        what = f"the gradient of {names[i]}"
        second = differentiate(p, differentiable[a], tensors, what=what, where=where)
        if second != 0:
            terms.append(second)
            kept.append((a, i))
    if not terms:
        return None
    # The terms are the partials dB_i/dv; each is multiplied by its grad_grad_i where it is printed, so
    # that no shared temporary reads a grad_grad_i that may be None.
    taken = taken | {GRAD_GRAD_PREFIX + n for n in names} | {f"{n}_shape" for n in names}
    code = share(terms, [f"{differentiable[a]}/{names[i]}" for a, i in kept], taken)
    return DoubleBackward(tuple(str(v) for v in differentiable), tuple(kept), code)


@dataclass(frozen=True)
class Node:
    """An elementwise node as the chain rule reads it: ``name = forward``, and its partial derivative in
    each value it reads (as backward multiplies its gradient by it)."""

    name: str
    forward: sympy.Expr
    partials: tuple[tuple[str, sympy.Expr], ...]


def composed_gradients(
    nodes: list[Node], seeds: dict[str, list[sympy.Symbol]], arguments: list[str], kept: set[str]
) -> list[list[sympy.Expr]]:
    """Each argument's gradient, one part per upstream gradient: the upstream gradient times the chain-rule
    composition of the partials of ``nodes`` (in forward order) on the way from the value it arrives at
    (``seeds``: value -> its upstream gradients) to the argument. Values not in ``kept`` (what backward has:
    the saved tensors) are written as their forward formulas, so that each part reads only what backward
    reads."""
    adjoints: dict[str, dict[sympy.Symbol, sympy.Expr]] = {}
    for value, grads in seeds.items():
        for g in grads:
            adjoints.setdefault(value, {})[g] = g
    for node in reversed(nodes):
        for read, partial in node.partials:
            if partial == 0:
                continue
            for g, share in adjoints.get(node.name, {}).items():
                into = adjoints.setdefault(read, {})
                into[g] = into.get(g, sympy.S.Zero) + share * partial
    formulas = {sympy.Symbol(n.name, real=True): n.forward for n in nodes if n.name not in kept}

    def read_by_backward(expr: sympy.Expr) -> sympy.Expr:
        while expr.free_symbols & formulas.keys():
            expr = expr.xreplace(formulas)
        return expr

    upstream = [g for grads in seeds.values() for g in grads]
    return [
        [read_by_backward(adjoints[a][g]) for g in upstream if adjoints.get(a, {}).get(g, 0) != 0] for a in arguments
    ]
