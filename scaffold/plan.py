"""Stage 4: the backward plan.

Decides what the generated backward computes and what the forward must leave it:

* each gradient is ``grad_output * partial``, reduced to its input's shape;
* common subexpressions are shared (sympy's ``cse``) across all gradients; a temporary used by one
  gradient is computed inside that gradient's ``needs_input_grad`` guard, one used by several is computed
  once, guarded by "any of them is needed";
* where a partial contains the whole forward (d/dx exp(x) = exp(x)), the saved output is used instead
  of computing the forward again;
* exactly the tensors the gradient formulas use are saved; scalars they use become ctx attributes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import sympy

from .derivation import Derivation

GRAD_OUTPUT = "grad_output"
OUTPUT = "out"


@dataclass(frozen=True)
class Step:
    """One assignment ``name = expr`` of generated code."""

    name: str
    expr: sympy.Expr


@dataclass(frozen=True)
class GradientPlan:
    """How the gradient of one tensor argument is computed."""

    index: int  # position of the argument in the forward's signature
    name: str
    partial: sympy.Expr  # d(forward)/d(name), for the docstring
    steps: tuple[Step, ...]  # temporaries only this gradient uses
    expr: sympy.Expr  # grad_output * partial, in terms of the temporaries

    @property
    def is_zero(self) -> bool:
        return self.expr == 0


@dataclass(frozen=True)
class SharedSteps:
    """Temporaries used by several gradients, computed when any of them is needed."""

    users: tuple[int, ...]  # indices of the gradients that use them
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class BackwardPlan:
    forward_steps: tuple[Step, ...]
    forward_expr: sympy.Expr
    saved: tuple[str, ...]  # tensors saved for backward, in order; may end with OUTPUT
    ctx_scalars: tuple[str, ...]  # scalar arguments the backward reads from ctx
    shared: tuple[SharedSteps, ...]
    gradients: tuple[GradientPlan, ...]


def _temp_names(taken: set[str]) -> Iterator[sympy.Symbol]:
    prefix = "tmp"
    for i in range(10**6):
        name = f"{prefix}{i}"
        if name not in taken:
            yield sympy.Symbol(name, real=True)


def make_plan(derivation: Derivation) -> BackwardPlan:
    parsed = derivation.parsed
    taken = set(parsed.symbols) | {GRAD_OUTPUT, OUTPUT}
    grad_output = sympy.Symbol(GRAD_OUTPUT, real=True)
    output = sympy.Symbol(OUTPUT, real=True)

    # Forward: share repeated subexpressions, e.g. exp(x) in exp(x) / (1 + exp(x)).
    forward_replacements, (forward_expr,) = sympy.cse([parsed.expr], symbols=_temp_names(taken), order="none")
    forward_steps = tuple(Step(str(s), e) for s, e in forward_replacements)

    # Backward: the whole forward inside a partial is the saved output (exp, tanh, ...): no recompute.
    forward = parsed.expr
    uses_output = lambda p: not forward.is_Symbol and p.has(forward)  # noqa: E731
    grads = [
        grad_output * (p.expr.xreplace({forward: output}) if uses_output(p.expr) else p.expr)
        for p in derivation.partials
    ]
    replacements, reduced = sympy.cse(grads, symbols=_temp_names(taken), order="none")

    # Which gradients use each temporary, directly or through another temporary.
    temps = [s for s, _ in replacements]
    users: dict[sympy.Symbol, set[int]] = {s: set() for s in temps}
    for i, expr in enumerate(reduced):
        for s in expr.free_symbols & users.keys():
            users[s].add(i)
    for s, expr in reversed(replacements):
        for dep in expr.free_symbols & users.keys():
            users[dep] |= users[s]

    own: dict[int, list[Step]] = {i: [] for i in range(len(grads))}
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

    gradients = tuple(
        GradientPlan(index=i, name=p.name, partial=p.expr, steps=tuple(own[i]), expr=reduced[i])
        for i, p in enumerate(derivation.partials)
    )

    used: set[str] = set()
    for expr in [*reduced, *(e for _, e in replacements)]:
        used |= {s.name for s in expr.free_symbols}
    saved = tuple(n for n in parsed.tensor_names if n in used) + ((OUTPUT,) if OUTPUT in used else ())
    return BackwardPlan(
        forward_steps=forward_steps,
        forward_expr=forward_expr,
        saved=saved,
        ctx_scalars=tuple(n for n in parsed.scalar_names if n in used),
        shared=tuple(shared),
        gradients=gradients,
    )
