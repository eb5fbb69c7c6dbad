"""Stage 4: the backward plan.

Decides what the generated backward (and jvp) compute and what the forward must leave them:

* each gradient is ``grad_output * partial``, reduced to its input's shape; each jvp term is
  ``partial * tangent``;
* common subexpressions are shared (sympy's ``cse``) across all terms; a temporary used by one term is
  computed inside that term's guard (``needs_input_grad``, or "this tangent is not None"), one used by
  several is computed once, guarded by "any of them is needed";
* where a partial contains the whole forward (d/dx exp(x) = exp(x)), backward uses the saved output
  instead of computing the forward again;
* exactly the tensors the formulas use are saved; scalars they use become ctx attributes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import sympy

from .derivation import Derivation

GRAD_OUTPUT = "grad_output"
OUTPUT = "out"
TANGENT_SUFFIX = "_tangent"


@dataclass(frozen=True)
class Step:
    """One assignment ``name = expr`` of generated code."""

    name: str
    expr: sympy.Expr


@dataclass(frozen=True)
class Term:
    """One tensor argument's part of a derivative: its gradient in backward, its term in jvp."""

    index: int  # position of the argument in the forward's signature
    name: str
    steps: tuple[Step, ...]  # temporaries only this term uses
    expr: sympy.Expr  # in terms of the temporaries

    @property
    def is_zero(self) -> bool:
        return self.expr == 0


@dataclass(frozen=True)
class SharedSteps:
    """Temporaries used by several terms, computed when any of them is needed."""

    users: tuple[int, ...]  # indices of the terms that use them
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class DerivativeCode:
    """The shared temporaries and the per-argument terms of backward or of jvp."""

    shared: tuple[SharedSteps, ...]
    terms: tuple[Term, ...]

    def free_names(self) -> set[str]:
        exprs = [t.expr for t in self.terms] + [s.expr for b in self.shared for s in b.steps]
        exprs += [s.expr for t in self.terms for s in t.steps]
        return {s.name for e in exprs for s in e.free_symbols}


@dataclass(frozen=True)
class BackwardPlan:
    forward_steps: tuple[Step, ...]
    forward_expr: sympy.Expr
    backward: DerivativeCode
    saved: tuple[str, ...]  # tensors saved for backward, in order; may end with OUTPUT
    ctx_scalars: tuple[str, ...]  # scalar arguments backward or jvp read from ctx
    jvp: DerivativeCode
    saved_for_forward: tuple[str, ...]  # tensors saved for jvp


def _temp_names(taken: set[str]) -> Iterator[sympy.Symbol]:
    for i in range(10**6):
        if f"tmp{i}" not in taken:
            yield sympy.Symbol(f"tmp{i}", real=True)


def _share(exprs: list[sympy.Expr], names: list[str], taken: set[str]) -> DerivativeCode:
    """CSE across ``exprs``; place each temporary with the one term that uses it, or in a shared block."""
    replacements, reduced = sympy.cse(exprs, symbols=_temp_names(taken), order="none")
    users: dict[sympy.Symbol, set[int]] = {s: set() for s, _ in replacements}
    for i, expr in enumerate(reduced):
        for s in expr.free_symbols & users.keys():
            users[s].add(i)
    for s, expr in reversed(replacements):  # a temporary's users are also its dependencies' users
        for dep in expr.free_symbols & users.keys():
            users[dep] |= users[s]

    own: dict[int, list[Step]] = {i: [] for i in range(len(exprs))}
    shared: list[SharedSteps] = []
    for s, expr in replacements:
        step = Step(str(s), expr)
        who = tuple(sorted(users[s]))
        if len(who) == 1:
            own[who[0]].append(step)
        elif shared and shared[-1].users == who:
            shared[-1] = SharedSteps(who, shared[-1].steps + (step,))
        elif who:
            shared.append(SharedSteps(who, (step,)))
    terms = tuple(Term(i, name, tuple(own[i]), reduced[i]) for i, name in enumerate(names))
    return DerivativeCode(tuple(shared), terms)


def straight_line(expr: sympy.Expr, taken: set[str]) -> tuple[tuple[Step, ...], sympy.Expr]:
    """``expr`` as assignments of its repeated subexpressions and a final expression over them."""
    replacements, (reduced,) = sympy.cse([expr], symbols=_temp_names(taken), order="none")
    return tuple(Step(str(s), e) for s, e in replacements), reduced


def make_plan(derivation: Derivation) -> BackwardPlan:
    parsed = derivation.parsed
    names = [p.name for p in derivation.partials]
    taken = set(parsed.symbols) | {GRAD_OUTPUT, OUTPUT} | {n + TANGENT_SUFFIX for n in names}
    grad_output = sympy.Symbol(GRAD_OUTPUT, real=True)
    output = sympy.Symbol(OUTPUT, real=True)

    # Forward: share repeated subexpressions, e.g. exp(x) in x * exp(x) + exp(x).
    forward_steps, forward_expr = straight_line(derivation.forward, taken)

    # Backward: the whole forward inside a partial is the saved output (exp, tanh, ...): no recompute.
    forward = derivation.forward
    backward = _share(
        [
            grad_output * (p.expr.xreplace({forward: output}) if not forward.is_Symbol else p.expr)
            for p in derivation.partials
        ],
        names,
        taken,
    )
    # jvp: partial * tangent per argument, from the inputs alone (the output has no tangent there).
    jvp = _share([p.expr * sympy.Symbol(p.name + TANGENT_SUFFIX, real=True) for p in derivation.partials], names, taken)

    backward_names, jvp_names = backward.free_names(), jvp.free_names()
    saved = tuple(n for n in parsed.tensor_names if n in backward_names)
    return BackwardPlan(
        forward_steps=forward_steps,
        forward_expr=forward_expr,
        backward=backward,
        saved=saved + ((OUTPUT,) if OUTPUT in backward_names else ()),
        ctx_scalars=tuple(n for n in parsed.scalar_names if n in backward_names | jvp_names),
        jvp=jvp,
        saved_for_forward=tuple(n for n in parsed.tensor_names if n in jvp_names),
    )
