"""Stage 5: the backward plan.

Decides what the generated backward (and jvp) compute and what the forward must leave them:

* each gradient is ``grad_output * partial`` (with several outputs, the sum over the outputs of each one's
  upstream gradient times its partial), reduced to its input's shape; each jvp term is ``partial *
  tangent``, and each output's tangent the sum of its terms;
* common subexpressions are shared (sympy's ``cse``) across all terms; a temporary used by one term is
  computed inside that term's guard (``needs_input_grad``, or "this tangent is not None"), one used by
  several is computed once, guarded by "any of them is needed";
* what backward reads is chosen by a small cost model. The candidates: the inputs; the outputs, where a
  partial contains the whole forward of one (d/dx exp(x) = exp(x), d/dx tanh(x) = 1 - tanh(x)**2); and boolean
  masks for the conditions of steps and case distinctions (relu, leaky_relu, clamp), one byte per element
  instead of the four or eight of the float input they are computed from; and intermediates of the
  forward (``input - target``, ``sigmoid(beta*x)``), which forward returns as hidden outputs. Each choice is
  costed in bytes saved (relative to the example shapes of the spec) and in tensor operations in backward,
  each weighted by what its kernel costs (plus the forward's work to build masks and intermediates): the
  cost model of :mod:`.cost`, which the structured planner (:mod:`.dataflow`) shares; the spec's
  ``policy`` says which comes first: ``"memory"`` (the default) the bytes, ``"time"`` the operations;
* exactly the tensors the formulas use are saved; scalars they use become ctx attributes;
* before CSE, each formula is lowered (:mod:`.lowering`): a branch's input kept inside its region,
  powers of a quotient computed as such, a sum that appears in several multiples computed once,
  ``x * exp(y)`` as 0 where x = 0.

A saved intermediate is returned by forward as a hidden output, PyTorch's documented pattern: a tensor
saved from inside forward would be a constant to double backward, which must reach it through the
Function's own backward (BackwardPlan.hidden_backward). Only ops with one visible output keep any.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

import sympy

from . import lowering
from .cost import WRITE_WEIGHT, Cost, Mask, Sizes, mask_subsets, operations_of, rank, with_masks
from .derivation import Derivation, differentiate
from .double_backward import DoubleBackward, derive_double_backward
from .program import Program
from .spec import RESERVED_ARGUMENT_NAMES, RESERVED_PREFIXES, RESERVED_SUFFIXES, OpSpec
from .stable import DerivativeKernel, gelu_grad, ndtr, neg_abs, sigmoid, silu, softplus, stabilize, tanh_softplus

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
    output: int = 0  # the output whose tangent (jvp) or gradient (backward, several outputs) it is part of

    @property
    def is_zero(self) -> bool:
        return self.expr == 0


@dataclass(frozen=True)
class SharedSteps:
    """Temporaries used by several terms, computed when any of them is needed."""

    users: tuple[int, ...]  # the arguments (Term.index) of the terms that use them
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
class OutputNames:
    """The names of one output in the generated code."""

    name: str  # the user's ("" for a forward's one unnamed output)
    value: str  # the output in backward's formulas and setup_context (OUTPUT for one output)
    grad: str  # its upstream gradient, a parameter of backward (GRAD_OUTPUT for one output)
    hidden: bool = False  # an intermediate forward returns only for backward to read (the op does not)


@dataclass(frozen=True)
class BackwardPlan:
    outputs: tuple[OutputNames, ...]
    forward_steps: tuple[Step, ...]
    forward_exprs: tuple[sympy.Expr, ...]  # one per output
    # Custom gradients as written (over the arguments and ParsedExpression.grads): the test's formulas.
    custom_gradients: tuple[tuple[str, sympy.Expr], ...]
    backward: DerivativeCode
    saved: tuple[str, ...]  # saved for backward, in order: inputs, then masks, then outputs
    masks: tuple[Mask, ...]  # computed in setup_context from the inputs
    ctx_scalars: tuple[str, ...]  # scalar arguments backward or jvp read from ctx
    backward_scalars: tuple[str, ...]  # those backward reads
    jvp_scalars: tuple[str, ...]  # those jvp reads
    jvp: DerivativeCode
    saved_for_forward: tuple[str, ...]  # tensors saved for jvp
    policy: str
    cost: Cost
    baseline: Cost  # saving the inputs the formulas use, as written, without masks or the output
    double_backward: DoubleBackward | None  # None: autograd differentiates backward's code (too many terms)
    # The gradients that reach the hidden outputs (only in a second derivative, through what backward read):
    # a term per (argument, hidden output), grad_<hidden> times the intermediate's partial derivative.
    hidden_backward: tuple[Term, ...] = ()
    fused: bool = False  # chosen for fused mode: the fewest elements moved (Cost.moved) first

    @property
    def output_values(self) -> tuple[str, ...]:
        return tuple(o.value for o in self.outputs)

    @property
    def visible(self) -> tuple[OutputNames, ...]:
        """The outputs the op returns."""
        return tuple(o for o in self.outputs if not o.hidden)

    @property
    def hidden(self) -> tuple[OutputNames, ...]:
        return tuple(o for o in self.outputs if o.hidden)


def _temp_names(taken: set[str]) -> Iterator[sympy.Symbol]:
    for i in range(10**6):
        if f"tmp{i}" not in taken:
            yield sympy.Symbol(f"tmp{i}", real=True)


def _share(
    exprs: list[sympy.Expr],
    names: list[str],
    taken: set[str],
    scalars: frozenset[sympy.Symbol],
    keys: list[tuple[int, int]] | None = None,
    *,
    fused: bool = False,
) -> DerivativeCode:
    """CSE across ``exprs``; place each temporary with the one term that uses it, or in a shared block.

    ``keys``: each term's (argument index, output index); default: the i-th term is argument i's. ``fused``:
    the code runs through torch.compile (:func:`_one_exponential`)."""
    keys = keys or [(i, 0) for i in range(len(exprs))]
    replacements, reduced = _cheapest_elimination(exprs, taken, scalars, fused)
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
        arguments = tuple(sorted({keys[i][0] for i in who}))
        if len(who) == 1:
            own[who[0]].append(step)
        elif shared and shared[-1].users == arguments:
            shared[-1] = SharedSteps(arguments, shared[-1].steps + (step,))
        elif who:
            shared.append(SharedSteps(arguments, (step,)))
    terms = tuple(
        Term(index, name, tuple(own[i]), reduced[i], output)
        for i, (name, (index, output)) in enumerate(zip(names, keys))
    )
    return DerivativeCode(tuple(shared), terms)


def _cheapest_elimination(
    exprs: list[sympy.Expr], taken: set[str], scalars: frozenset[sympy.Symbol], fused: bool = False
) -> tuple[Replacements, list[sympy.Expr]]:
    """:func:`_eliminate` of ``exprs`` as they are, or with each product distributed over its sums
    (``grad_output * (s + t*s*s1)`` as ``grad_output*s + grad_output*t*s*s1``), whichever costs less.

    Distributed, the upstream gradient (or a tangent) can join a factor the formulas share, as reverse mode
    shares it: swish's ``grad_output * sigmoid(u) * sigmoid(-u)`` once, for the gradient of x and of beta,
    instead of ``sigmoid(u) * sigmoid(-u)`` once and a multiply by grad_output in each."""
    best = _eliminate(exprs, taken, scalars, fused)
    cost = _codeoperations_of(*best, scalars)
    unfused = _unfused(exprs)
    for variant in ([_distributed(e) for e in exprs], unfused, [_distributed(e) for e in unfused]):
        if variant == exprs:
            continue
        other = _eliminate(variant, taken, scalars, fused)
        other_cost = _codeoperations_of(*other, scalars)
        if other_cost < cost:
            best, cost = other, other_cost
    return best


def _bounded(factor: sympy.Expr) -> bool:
    """Whether ``factor`` is a number, a symbol (an input, grad_output), or a function bounded by 1."""
    if factor.is_Number or factor.is_Symbol or isinstance(factor, (sigmoid, sympy.tanh, sympy.erf, sympy.Heaviside)):
        return True
    return isinstance(factor, sympy.Piecewise) and all(p.expr.is_Number for p in factor.args)


def _unfused(exprs: list[sympy.Expr]) -> list[sympy.Expr]:
    """``exprs`` with each ``silu(u)`` as ``u * sigmoid(u)`` where ``sigmoid(u)`` is computed anyway: one
    multiply instead of a kernel, and a product CSE can share (swish's ``sigmoid(u) * sigmoid(-u) * u``)."""
    # tanh_softplus(u) is computed from sigmoid(u) (lowering.tanh_softplus_in_sigmoids)
    sigmoids = {
        e.args[0] for x in exprs for e in sympy.preorder_traversal(x) if isinstance(e, (sigmoid, tanh_softplus))
    }

    def unfuse(node: silu) -> sympy.Expr:
        return node.args[0] * sigmoid(node.args[0])

    return [e.replace(lambda n: isinstance(n, silu) and n.args[0] in sigmoids, unfuse) for e in exprs]


def _one_exponential(exprs: list[sympy.Expr]) -> list[sympy.Expr]:
    """Fused code: ``sigmoid(t)`` and ``sigmoid(-t)`` (swish's and silu's derivatives read both) from one
    exponential, ``e = exp(-|t|)``, ``r = 1/(1 + e)``: sigmoid(t) is r where t >= 0 and e*r elsewhere, and
    sigmoid(-t) the other way round, exact and finite on both sides, where inductor computes each sigmoid
    with an exp and a division of its own. ``-|t|`` is :class:`.stable.neg_abs`: abs in the compiled
    kernels, and where autograd of this code may run (torch.func transforms differentiate backward's code)
    a form whose derivative at 0 is the case t >= 0's, so that it gets sigmoid'(0) = 1/4, not the 0 that
    abs' at 0 would give.
    ``silu(u)`` is ``u * sigmoid(u)`` here, so that silu(-x) pairs with sigmoid(x)."""
    exprs = [e.replace(lambda n: isinstance(n, silu), lambda n: n.args[0] * sigmoid(n.args[0])) for e in exprs]
    arguments = {n.args[0] for e in exprs for n in sympy.preorder_traversal(e) if isinstance(n, sigmoid)}
    replacements = {}
    for t in arguments:
        if -t not in arguments or t.could_extract_minus_sign():
            continue
        positive = t >= 0
        e = sympy.exp(neg_abs(t))
        r = 1 / (1 + e)
        replacements[sigmoid(t)] = sympy.Piecewise((r, positive), (e * r, True))
        replacements[sigmoid(-t)] = sympy.Piecewise((e * r, positive), (r, True))
    return [e.xreplace(replacements) for e in exprs] if replacements else exprs


def _one_logarithm(
    exprs: list[sympy.Expr], names: Iterator[sympy.Symbol], definitions: Replacements
) -> list[sympy.Expr]:
    """Fused code: ``softplus(t)`` as ``max(t, 0) + log1p(e)``, ``e = exp(-|t|)``, with log1p(e) computed
    as ``log(u) + (e - (u - 1))``, ``u = 1 + e``: ``u - 1`` is exact, and ``e - (u - 1)``, the rounding
    error of ``u``, corrects the logarithm to within an ulp (0 where u rounds to 1, which leaves e), with no
    division; autograd of it gives 1/u, the exact derivative. Inductor's log1p on a CPU costs half as much
    again as its log (4M float32 elements, one thread: 2.0 ms, 1.25 ms), and PyTorch's softplus and
    logsigmoid compile to exp and log1p; a division instead (Goldberg's log(u) * e / (u - 1)) costs what
    log1p does. ``u``, ``u - 1`` and the correction are temporaries of their own (definitions, as
    :mod:`.lowering` makes), so that sympy neither simplifies ``u - 1`` to ``e`` nor reorders the sums;
    ``-|t|`` is written as in :func:`_one_exponential` and ``max(t, 0)`` as a case distinction on ``t >= 0``,
    so that autograd of this code gets softplus'(0) = 1/2."""
    nodes = {n for e in exprs for n in sympy.preorder_traversal(e) if isinstance(n, softplus)}
    replacements = {}
    for node in sorted(nodes, key=sympy.default_sort_key):
        (t,) = node.args
        positive = t >= 0
        e = sympy.exp(neg_abs(t))
        u, rounded, correction = next(names), next(names), next(names)
        definitions += [(u, 1 + e), (rounded, u - 1), (correction, e - rounded)]
        replacements[node] = sympy.Piecewise((t, positive), (0, True)) + sympy.log(u) + correction
    return [e.xreplace(replacements) for e in exprs] if replacements else exprs


def _erf_beside_exponential(
    exprs: list[sympy.Expr], names: Iterator[sympy.Symbol], definitions: Replacements
) -> list[sympy.Expr]:
    """Fused code: ``erf(u)`` beside ``exp(-u**2)`` (the derivative of ``erf(u)``, or of ``u * erf(u)``) with
    ``u`` a temporary of its own, ``t``, and the exponential written ``exp(-t**2)``: inductor's vectorized
    ``erf`` on a CPU computes ``exp(-t*t)`` inside, and the C++ compiler shares it with ours only where both
    square the same value. ``-x**2/2``, sympy's canonical form, squares ``x``, not ``x/sqrt(2)``, and costs
    gelu's compiled backward an exponential per element: 1.25 ms against 0.86 ms (4M float32 elements, two
    threads, the same math otherwise). ``ndtr(x)`` and PyTorch's ``gelu_backward`` kernel (gelu_grad),
    which inductor computes as ``(1 + erf(x/sqrt(2)))/2``, are written so here too; CUDA is unaffected."""
    exprs = [e.replace(lambda n: isinstance(n, gelu_grad), lambda n: gelu_grad.expanded(n.args[0])) for e in exprs]
    nodes = {n for e in exprs for n in sympy.preorder_traversal(e) if isinstance(n, (sympy.erf, ndtr))}
    present = {n for e in exprs for n in sympy.preorder_traversal(e) if isinstance(n, sympy.exp)}
    replacements: dict[sympy.Expr, sympy.Expr] = {}
    for node in sorted(nodes, key=sympy.default_sort_key):
        u = node.args[0] / sympy.sqrt(2) if isinstance(node, ndtr) else node.args[0]
        exponential = sympy.exp(-(u**2))
        if exponential not in present or u.is_Atom:
            continue
        t = next(names)
        definitions.append((t, u))
        replacements[exponential] = sympy.exp(-(t**2))
        replacements[node] = (1 + sympy.erf(t)) / 2 if isinstance(node, ndtr) else sympy.erf(t)
    return [e.xreplace(replacements) for e in exprs] if replacements else exprs


#: Terms a distributed product may have, at most: a product over a long sum is left whole (CSE of the
#: distributed form costs generation time, and such sums share little).
MAX_DISTRIBUTED_TERMS = 8


def _distributed(expr: sympy.Expr) -> sympy.Expr:
    """A product with sums among its factors as the sum of the products of their terms (only at the top),
    where its other factors are bounded (numbers, symbols, sigmoids, ...): CSE may then multiply them
    together without the terms' factors, and a product of two powers that overflow (found_19's
    ``(w*(x - y))**3 * (w*(x - y))**2``, inf in float32 at 1e4) is no longer tamed by the tiny factor
    beside it (``(1 + (w*(x - y))**6)**-4``)."""
    if not expr.is_Mul:
        return expr
    factors = [sympy.Add.make_args(f) for f in expr.args]
    if all(len(f) == 1 for f in factors) or math.prod(len(f) for f in factors) > MAX_DISTRIBUTED_TERMS:
        return expr
    if not all(len(f) > 1 or _bounded(f[0]) for f in factors):
        return expr
    return sympy.Add(*(sympy.Mul(*terms) for terms in itertools.product(*factors)))


def _codeoperations_of(steps: Replacements, exprs: list[sympy.Expr], scalars: frozenset[sympy.Symbol]) -> float:
    """What straight-line code (temporaries, then the final expressions) costs: :func:`_operations`."""
    temporaries = {s for s, _ in steps}
    tensors = {s.name for e in [*(e for _, e in steps), *exprs] for s in e.free_symbols} - {
        s.name for s in scalars | temporaries
    }
    for s, e in steps:  # a temporary is a tensor where it reads one
        if any(f.name in tensors for f in e.free_symbols):
            tensors.add(s.name)
    return operations_of([*(e for _, e in steps), *exprs], tensors)


def straight_line(
    exprs: list[sympy.Expr],
    taken: set[str],
    scalars: frozenset[sympy.Symbol] | None = None,
    fused: bool = False,
    *,
    cheapest: bool = False,
) -> tuple[tuple[Step, ...], tuple[sympy.Expr, ...]]:
    """``exprs`` as assignments of their repeated subexpressions and final expressions over them.

    ``scalars``: the symbols that are not tensors; None for the expressions as written (a test's
    reference), without the :mod:`.lowering` rewrites. ``fused``: code that runs through torch.compile.
    ``cheapest``: the exprs as they are or with their products distributed or silu unfused, whichever
    costs less (:func:`_cheapest_elimination`: a backward's gradients, which share a factor that way)."""
    eliminate = _cheapest_elimination if cheapest else _eliminate
    replacements, reduced = eliminate(list(exprs), taken, scalars, fused)
    return tuple(Step(str(s), e) for s, e in replacements), tuple(reduced)


Replacements = list[tuple[sympy.Symbol, sympy.Expr]]


def _eliminate(
    exprs: list[sympy.Expr], taken: set[str], scalars: frozenset[sympy.Symbol] | None, fused: bool = False
) -> tuple[Replacements, list[sympy.Expr]]:
    """sympy's ``cse`` of ``exprs`` (lowered first unless ``scalars`` is None; then, for ``fused`` code,
    sigmoid pairs from one exponential), temporaries numbered in order of use."""
    names = _temp_names(taken)
    definitions: Replacements = []
    if scalars is not None:
        exprs = [lowering.guard_branches(e, scalars) for e in exprs]
        exprs = lowering.pair_powers(exprs, names, definitions)
        exprs = lowering.scaled_sums(exprs, scalars, names, definitions)
        exprs = lowering.tanh_softplus_in_sigmoids(exprs, eager=not fused)
        exprs = [lowering.negated_weights(lowering.one_logarithm_of_odds(e)) for e in exprs]
        exprs = lowering.guarded_sums(exprs, names, definitions)
    exprs = lowering.products_with_exp(exprs, names, definitions)
    if fused:  # after lowering, whose guards would keep each branch's exp apart
        exprs = _one_logarithm(_one_exponential(exprs), names, definitions)
        exprs = _erf_beside_exponential(exprs, names, definitions)
    replacements, reduced = sympy.cse([*exprs, *(d for _, d in definitions)], symbols=names, order="none")
    steps = _in_order(replacements + [(s, e) for (s, _), e in zip(definitions, reduced[len(exprs) :])])
    # A lowering definition that CSE reduced to a temporary it already had (exp(y) of an xexpy, when exp(y)
    # is also used bare) is an alias, `tmp2 = tmp1`: the later uses read the original instead.
    aliases: dict[sympy.Symbol, sympy.Expr] = {}
    temporaries = {t for t, _ in steps}
    for s, e in steps:
        if e in temporaries:
            aliases[s] = aliases.get(e, e)
    if aliases:
        steps = [(s, e.xreplace(aliases)) for s, e in steps if s not in aliases]
        reduced = [e.xreplace(aliases) for e in reduced]
    # sympy's cse can leave a temporary's own expression standing elsewhere (beta*x inside
    # exp(-alpha**2*exp(2*beta*x) + beta*x) after tmp0 = beta*x, tmp1 = 2*tmp0): read the temporary there.
    defined = {e: s for s, e in steps if not e.is_Atom}
    if defined:
        steps = _in_order([(s, e.xreplace({k: v for k, v in defined.items() if v != s})) for s, e in steps])
        reduced = [e.xreplace(defined) for e in reduced]
    if scalars is not None:  # code, not a test's reference as written
        steps, reduced = _divisors(steps, reduced, scalars)
    renamed = dict(zip((s for s, _ in steps), _temp_names(taken)))
    steps = [(renamed[s], e.xreplace(renamed)) for s, e in steps]
    return steps, [e.xreplace(renamed) for e in reduced[: len(exprs)]]


def _divisors(
    steps: Replacements, reduced: list[sympy.Expr], scalars: frozenset[sympy.Symbol]
) -> tuple[Replacements, list[sympy.Expr]]:
    """``steps`` and ``reduced`` with each temporary ``t = 1/e`` of a tensor that is read only as a factor of
    products (or raised to an integer power) as ``t = e`` (or ``e`` itself where it is a name), each product
    dividing by it: n divisions where there were a reciprocal and n multiplies. On a CPU a division costs
    what a multiply does, one pass over memory (4M float32 elements, one thread: 2.5 ms, 2.4 ms), and it
    rounds once, not twice; binary cross-entropy's backward divides by its guarded arguments, ``y / p`` and
    ``(1 - y) / (1 - p)``, not ``1 / p`` times each. A reciprocal of numbers and scalars stays: it is
    computed once, in Python."""
    exprs = [e for _, e in steps] + list(reduced)
    scalar = set(scalars)
    for s, e in steps:
        if e.free_symbols <= scalar:
            scalar.add(s)
    quotients = {
        s: 1 / s if not e.base.is_Atom else e
        for s, e in steps
        if s not in scalar and e.is_Pow and e.exp == -1 and _read_as_factor(s, exprs)
    }
    if not quotients:
        return steps, reduced
    steps = [(s, e.base if s in quotients else e.xreplace(quotients)) for s, e in steps if quotients.get(s) != e]
    return steps, [e.xreplace(quotients) for e in reduced]


def _read_as_factor(symbol: sympy.Symbol, exprs: list[sympy.Expr]) -> bool:
    """Whether every node of ``exprs`` that reads ``symbol`` is a product or an integer power of it."""
    return all(
        node.is_Mul or (node.is_Pow and node.exp.is_Integer)
        for e in exprs
        for node in sympy.preorder_traversal(e)
        if symbol in node.args
    ) and not any(e == symbol for e in exprs)


def _in_order(steps: Replacements) -> Replacements:
    """``steps`` ordered so that each comes after the temporaries it reads (stable otherwise)."""
    defined = {s for s, _ in steps}
    done: set[sympy.Symbol] = set()
    ordered: Replacements = []
    pending = list(steps)
    while pending:
        i = next(i for i, (_, e) in enumerate(pending) if (e.free_symbols & defined) <= done)
        s, e = pending.pop(i)
        ordered.append((s, e))
        done.add(s)
    return ordered


def make_plan(derivation: Derivation, spec: OpSpec | None = None) -> BackwardPlan:
    parsed = derivation.parsed
    program = derivation.program
    where = f"{spec.source}: forward" if spec is not None else "forward"
    policy = spec.policy if spec is not None else "memory"
    fused = spec.fuse if spec is not None else False
    names = list(parsed.tensor_names)
    taken = set(parsed.symbols) | {GRAD_OUTPUT, OUTPUT} | {n + TANGENT_SUFFIX for n in names}
    outputs = _output_names(program, taken)
    taken |= {n for o in outputs for n in (o.value, o.grad)}
    grads = [sympy.Symbol(o.grad, real=True) for o in outputs]
    values = [sympy.Symbol(o.value, real=True) for o in outputs]

    # Forward: share repeated subexpressions, e.g. exp(x) in x * exp(x) + exp(x), across the outputs.
    scalars = frozenset(parsed.symbols[n] for n in parsed.scalar_names)
    forward_steps, forward_exprs = straight_line([o.forward for o in derivation.outputs], taken, scalars, fused)

    # Backward: each gradient is the sum over the outputs of their upstream gradient times the partial (or the
    # custom gradient, which need not be linear in them); choose what it reads (see the module docstring),
    # then share its subexpressions.
    plain = _gradient_exprs(derivation, names, grads, len(outputs))
    # A custom op's setup_context sees its inputs and outputs alone: an intermediate kept for backward would
    # be an output of the op that its users see.
    keeps = len(outputs) == 1 and (spec is None or spec.target != "custom_op")
    kept = _Intermediates(derivation, names, scalars, taken, where) if keeps else None
    candidates = _candidates(derivation, plain, values, set(grads), kept, taken, _sizes(program, outputs))
    exprs, masks, cost, chosen = min(candidates, key=lambda c: rank(c[2], policy, fused))
    if chosen:  # the kept intermediates named saved, saved1, ... in order
        renamed = kept.rename(chosen)
        exprs = [e.xreplace(renamed) for e in exprs]
    hidden = tuple(OutputNames("", str(kept.symbol(t)), f"grad_{kept.symbol(t)}", hidden=True) for t in chosen)
    outputs += hidden
    taken |= {n for o in hidden for n in (o.value, o.grad)}
    if hidden:
        # forward computes the kept intermediates too, sharing what it can with the output
        forward_steps, forward_exprs = straight_line(
            [o.forward for o in derivation.outputs] + list(chosen), taken, scalars, fused
        )
    backward_taken = taken | {m.name for m in masks}
    parts, backward = _shared_backward(exprs, names, grads, len(outputs), backward_taken, scalars, fused)
    partials = [[p.expr for p in o.partials] for o in derivation.outputs]
    jvp = _jvp(partials + ([kept.partials(t) for t in chosen] if chosen else []), names, taken, scalars)
    hidden_backward = kept.backward(chosen, taken) if chosen else ()

    backward_names, jvp_names = backward.free_names(), jvp.free_names()
    backward_names |= {
        s.name for t in hidden_backward for e in [t.expr, *(s.expr for s in t.steps)] for s in e.free_symbols
    }
    saved = tuple(n for n in parsed.tensor_names if n in backward_names)
    used_masks = tuple(m for m in masks if m.name in backward_names)
    saved_outputs = tuple(o.value for o in outputs if o.value in backward_names)
    differentiable = [*grads, *(parsed.symbols[n] for n in saved), *(sympy.Symbol(v, real=True) for v in saved_outputs)]
    tensors = frozenset(parsed.symbols[n] for n in parsed.tensor_names) | set(grads) | set(values)
    tensors |= {sympy.Symbol(o.value, real=True) for o in hidden}
    tensors |= {sympy.Symbol(m.name) for m in used_masks}
    share = functools.partial(_share, scalars=scalars)
    double_backward = derive_double_backward(parts, names, differentiable, tensors, taken, where, share)
    return BackwardPlan(
        outputs=outputs,
        forward_steps=forward_steps,
        forward_exprs=forward_exprs,
        custom_gradients=parsed.gradients,
        backward=backward,
        saved=saved + tuple(m.name for m in used_masks) + saved_outputs,
        masks=used_masks,
        ctx_scalars=tuple(n for n in parsed.scalar_names if n in backward_names | jvp_names),
        backward_scalars=tuple(n for n in parsed.scalar_names if n in backward_names),
        jvp_scalars=tuple(n for n in parsed.scalar_names if n in jvp_names),
        jvp=jvp,
        saved_for_forward=tuple(n for n in parsed.tensor_names if n in jvp_names),
        policy=policy,
        cost=cost,
        baseline=candidates[0][2],
        double_backward=double_backward,
        hidden_backward=hidden_backward,
        fused=fused,
    )


def _gradient_exprs(
    derivation: Derivation, names: list[str], grads: list[sympy.Symbol], n_outputs: int
) -> list[sympy.Expr]:
    """Each input's gradient: the sum over the outputs of their upstream gradient times the partial, or the
    custom gradient (which need not be linear in them); with several outputs, each part summed to the
    input's shape on its own (outputs may differ in shape)."""
    parsed = derivation.parsed
    custom = {name: expr.xreplace(dict(zip(parsed.grads, grads))) for name, expr in derivation.custom}
    plain = []
    for i, name in enumerate(names):
        if name in custom:
            parts = _parts_by_upstream(custom[name], grads)
        else:
            parts = [g * o.partials[i].expr for g, o in zip(grads, derivation.outputs)]
        if n_outputs > 1:
            shape = sympy.Symbol(f"{name}_shape")
            parts = [lowering.sum_to(p, shape) for p in parts if p != 0]
        plain.append(sympy.Add(*parts))
    return plain


def _candidates(derivation, plain, values, grads, kept, taken, sizes) -> list[tuple]:
    """Every way backward may compute the gradients ``plain``: reading the outputs ``values`` or not,
    each subset of the intermediates ``kept`` may save, each subset of steps as masks; (exprs, masks, cost,
    chosen intermediates) each, the plain one first; ``grads`` are the upstream gradients."""
    parsed = derivation.parsed
    tensors = {parsed.symbols[n] for n in parsed.tensor_names}
    variants = [plain]
    for chosen in _output_subsets(derivation, values):
        with_outputs = [e.xreplace(chosen) for e in plain]
        if with_outputs not in variants:
            variants.append(with_outputs)
    candidates = []
    for variant in variants:
        for chosen in kept.subsets(variant) if kept is not None else [()]:
            replaced = [e.xreplace(kept.replacements(chosen)) for e in variant] if chosen else variant
            for subset in mask_subsets(replaced, tensors, grads):
                exprs, masks, cost = with_masks(replaced, subset, taken, sizes)
                if chosen:
                    if not kept.readable(chosen, exprs):
                        continue
                    cost = kept.cost(chosen, exprs, cost, sizes)
                candidates.append((exprs, masks, cost, chosen))
    return candidates


def _shared_backward(exprs, names, grads, n_outputs, taken, scalars, fused):
    """The gradients' parts and their straight-line code. With several outputs each gradient is a sum of
    parts, one per output (lowering.sum_to), each reduced to the input's shape on its own and skipped where
    nobody used the output (its gradient is None): a term per (input, output), -1 for a custom gradient's term
    that mixes several outputs' gradients."""
    if n_outputs == 1:
        return [[e] for e in exprs], _share(exprs, names, taken, scalars, fused=fused)
    parts = [[lowering.without_sum_to(p) for p in sympy.Add.make_args(e)] for e in exprs]
    flat, keys = [], []
    for i, terms in enumerate(parts):
        for part in terms:
            read = [k for k, g in enumerate(grads) if g in part.free_symbols]
            flat.append(part)
            keys.append((i, read[0] if len(read) == 1 else -1))
    return parts, _share(flat, [names[i] for i, _ in keys], taken, scalars, keys)


def _jvp(partials: list[list[sympy.Expr]], names: list[str], taken: set[str], scalars) -> DerivativeCode:
    """jvp's code: each output's tangent is the sum of partial * tangent over the arguments, from the inputs
    alone (the outputs have no tangent there); a hidden output's too (torch.func's forward-over-reverse reads
    it). ``partials[k][i]`` is output k's partial derivative in argument ``names[i]``."""
    tangents = [sympy.Symbol(n + TANGENT_SUFFIX, real=True) for n in names]
    keys = [(i, k) for k in range(len(partials)) for i in range(len(names))]
    terms = [partials[k][i] * tangents[i] for i, k in keys]
    return _share(terms, [names[i] for i, _ in keys], taken, scalars, keys)


def one_derivative_kernel(plan: BackwardPlan) -> bool:
    """Whether backward is one of ATen's fused ``grad * derivative`` kernels and nothing else (sigmoid's or
    tanh's, of a saved tensor): fused code runs it eagerly, as torch.compile would fuse it with nothing and
    call it through its own overhead (tens of microseconds after a large kernel has flushed the caches)."""
    terms = [t for t in plan.backward.terms if not t.is_zero]
    if plan.backward.shared or len(plan.outputs) != 1 or len(terms) != 1 or terms[0].steps:
        return False
    return derivative_kernel_alone(terms[0].expr, sympy.Symbol(plan.outputs[0].grad, real=True))


def derivative_kernel_alone(expr: sympy.Expr, grad: sympy.Symbol) -> bool:
    """Whether ``expr`` is ``grad`` times one of ATen's fused derivative kernels of a tensor it is given
    (``tanh_backward(grad, out)``), and nothing else."""
    factors = sympy.Mul.make_args(expr)
    return (
        len(factors) == 2
        and grad in factors
        and any(isinstance(f, DerivativeKernel) and f.args[0].is_Symbol for f in factors)
    )


#: Forward intermediates considered for saving, at most (the most expensive to recompute first), and how
#: many of them one plan may keep.
MAX_INTERMEDIATES = 3
MAX_KEPT = 2


class _Intermediates:
    """Intermediates of the forward that backward may read instead of recomputing them: forward returns them
    as hidden outputs (PyTorch's documented way to save an intermediate so that double backward stays right:
    a second derivative reaches them through the Function's own backward, see BackwardPlan.hidden_backward).

    Candidates are subexpressions of backward's formulas over the inputs and scalars: a function of a tensor
    (exp(x), sigmoid(beta*x)) or a sum of several (input - target). A choice is valid where the hidden
    outputs' own gradients read only what backward saves anyway; it costs the intermediates' elements and
    the forward's work to compute those the output does not already compute.
    """

    def __init__(self, derivation: Derivation, names: list[str], scalars, taken: set[str], where: str) -> None:
        parsed = derivation.parsed
        self.inputs = frozenset(parsed.symbols[n] for n in names)
        self.scalars = scalars
        self.names = names
        self.where = where
        self.forwards = [o.forward for o in derivation.outputs]
        # the user's steps by their formula (over the inputs, in stable primitives), for naming
        program = derivation.program
        stable_steps = [(stabilize(program.formula(n), self.inputs), n) for n in program.steps]
        self.steps = {formula: name for formula, name in reversed(stable_steps)}
        self.taken = taken
        self.symbols = (sympy.Symbol(f"_candidate{i}", real=True) for i in range(10**6))
        self._named: dict[sympy.Expr, sympy.Symbol] = {}
        self._partials: dict[sympy.Expr, list[sympy.Expr]] = {}

    def candidates(self, exprs: list[sympy.Expr]) -> list[sympy.Expr]:
        found: dict[sympy.Expr, None] = {}
        for expr in exprs:
            for node in sympy.preorder_traversal(expr):
                if node.is_Atom or not isinstance(node, sympy.Expr):
                    continue
                symbols = node.free_symbols
                if not symbols & self.inputs or not symbols <= self.inputs | self.scalars:
                    continue
                if isinstance(node, (sympy.Piecewise, sympy.Heaviside, sympy.sign, DerivativeKernel, lowering.within)):
                    continue
                tensor_terms = sum(1 for a in node.args if a.free_symbols & self.inputs) if node.is_Add else 0
                if node in self.forwards or -node in self.forwards:  # the output itself: saved as such
                    continue
                if (isinstance(node, sympy.Function) or tensor_terms >= 2) and -node not in found:
                    found.setdefault(node)
        tensors = {s.name for s in self.inputs}
        ranked = sorted(found, key=lambda n: -operations_of(n, tensors))
        return ranked[:MAX_INTERMEDIATES]

    def subsets(self, exprs: list[sympy.Expr]) -> list[tuple[sympy.Expr, ...]]:
        """The empty choice, then each set of at most MAX_KEPT candidates."""
        found = self.candidates(exprs)
        chosen = [c for k in range(1, MAX_KEPT + 1) for c in itertools.combinations(found, k)]
        # nested candidates (sigmoid(x) inside exp(sigmoid(x))): keeping the outer one only is the same choice
        chosen = [c for c in chosen if not any(a != b and a.has(b) for a in c for b in c)]
        return [(), *chosen]

    def replacements(self, chosen: tuple[sympy.Expr, ...]) -> dict[sympy.Expr, sympy.Expr]:
        """Each intermediate by its hidden output, and its negation (target - input of input - target) by
        the hidden output's."""
        replacements: dict[sympy.Expr, sympy.Expr] = {t: self.symbol(t) for t in chosen}
        for t in chosen:
            replacements.setdefault(-t, -self.symbol(t))
        return replacements

    def rename(self, chosen: tuple[sympy.Expr, ...]) -> dict[sympy.Symbol, sympy.Symbol]:
        """Names for the chosen intermediates' hidden outputs (from now on): the name of the user's step
        that computes it (d = input - target), else saved, saved1, ..."""
        fresh = (f"saved{i}" if i else "saved" for i in range(10**6))
        names = (sympy.Symbol(n, real=True) for n in fresh if n not in self.taken)
        renamed = {}
        for t in chosen:
            step = self.steps.get(t)
            named = step is not None and step not in self.taken
            renamed[self.symbol(t)] = sympy.Symbol(step, real=True) if named else next(names)
        self._named.update({t: renamed[self._named[t]] for t in chosen})
        return renamed

    def symbol(self, intermediate: sympy.Expr) -> sympy.Symbol:
        if intermediate not in self._named:
            self._named[intermediate] = next(self.symbols)
        return self._named[intermediate]

    def partials(self, intermediate: sympy.Expr) -> list[sympy.Expr]:
        """d intermediate / d input, per input, in stable primitives."""
        if intermediate not in self._partials:
            self._partials[intermediate] = [
                differentiate(intermediate, s, self.inputs, what="a saved intermediate", where=self.where)
                if s in intermediate.free_symbols
                else sympy.S.Zero
                for s in (sympy.Symbol(n, real=True) for n in self.names)
            ]
        return self._partials[intermediate]

    def _gradients(self, chosen: tuple[sympy.Expr, ...]) -> list[list[sympy.Expr]]:
        """Per hidden output, per input: grad_<hidden> * its partial, reading the hidden outputs."""
        replacements = self.replacements(chosen)
        return [
            [sympy.Symbol(f"grad_{self.symbol(t)}", real=True) * p.xreplace(replacements) for p in self.partials(t)]
            for t in chosen
        ]

    def readable(self, chosen: tuple[sympy.Expr, ...], exprs: list[sympy.Expr]) -> bool:
        """Whether the hidden outputs' gradients read only what backward's formulas ``exprs`` save."""
        hidden = {self.symbol(t) for t in chosen}
        read = {s for e in exprs for s in e.free_symbols} | hidden
        needed = {s for row in self._gradients(chosen) for e in row for s in e.free_symbols}
        return needed & (self.inputs | hidden) <= read

    def cost(self, chosen: tuple[sympy.Expr, ...], exprs: list[sympy.Expr], cost: Cost, sizes) -> Cost:
        """``cost`` (of ``exprs``, which read the hidden outputs) with the hidden outputs' elements and the
        forward's extra work."""
        tensors = {s.name for s in self.inputs}
        kept = sum(sizes.of({s.name for s in t.free_symbols}) for t in chosen)
        extra = sum(operations_of(t, tensors) for t in chosen if not any(f.has(t) for f in self.forwards))
        return Cost(cost.elements + kept, cost.operations + extra, cost.moved + (1 + WRITE_WEIGHT) * kept)

    def backward(self, chosen: tuple[sympy.Expr, ...], taken: set[str]) -> tuple[Term, ...]:
        """A term per (input, hidden output), each with its own temporaries (a rare path: no sharing)."""
        terms = []
        for k, row in enumerate(self._gradients(chosen)):
            for i, expr in enumerate(row):
                if expr != 0:
                    (term,) = _share([expr], [self.names[i]], taken, self.scalars).terms
                    terms.append(dataclasses.replace(term, index=i, output=k))
        return tuple(terms)


def _parts_by_upstream(expr: sympy.Expr, grads: list[sympy.Symbol]) -> list[sympy.Expr]:
    """A custom gradient's terms grouped by the upstream gradients each holds (one group per output, where
    the formula is a sum of such terms)."""
    groups: dict[frozenset, list[sympy.Expr]] = {}
    for term in sympy.Add.make_args(expr):
        groups.setdefault(frozenset(term.free_symbols & set(grads)), []).append(term)
    return [sympy.Add(*terms) for terms in groups.values()]


#: Outputs whose subsets are each costed as what backward reads (beyond: all of them or none).
MAX_OUTPUT_SUBSETS = 3


def _output_names(program: Program, taken: set[str]) -> tuple[OutputNames, ...]:
    """The generated code's names of each output: OUTPUT and GRAD_OUTPUT for one output; for several the
    user's names and ``grad_<name>``, renamed where they would shadow a name of the generated code: ``out_``
    in front of a name that starts as its temporaries do (tmp0, grad_x, mask), a trailing ``_`` after one it
    uses (ctx, output, an argument's name)."""
    if not program.several_outputs:
        return (OutputNames(program.outputs[0].name, OUTPUT, GRAD_OUTPUT),)
    # "out" is free: the generated code names no value so when there are several outputs.
    taken = (set(taken) - {OUTPUT}) | (RESERVED_ARGUMENT_NAMES - {OUTPUT})
    result = []
    for output in program.outputs:
        value = output.name
        if value.startswith(RESERVED_PREFIXES) or re.fullmatch(r"mask\d*", value):
            value = f"{OUTPUT}_{value}"
        while value in taken or value.endswith(RESERVED_SUFFIXES):
            value += "_"
        taken.add(value)
        grad = f"grad_{value}"
        while grad in taken:
            grad += "_"
        taken.add(grad)
        result.append(OutputNames(output.name, value, grad))
    return tuple(result)


def _output_subsets(derivation: Derivation, values: list[sympy.Symbol]) -> list[dict[sympy.Expr, sympy.Symbol]]:
    """The outputs backward may read in place of their formulas: every non-empty subset of them (all of them
    only, beyond :data:`MAX_OUTPUT_SUBSETS`), each as the replacements it makes."""
    candidates = [(o.forward, v) for o, v in zip(derivation.outputs, values) if not o.forward.is_Symbol]
    if len(candidates) > MAX_OUTPUT_SUBSETS:
        return [dict(candidates)]
    return [dict(c) for k in range(len(candidates), 0, -1) for c in itertools.combinations(candidates, k)]


def _sizes(program: Program, names: tuple[OutputNames, ...]) -> Sizes:
    """The example sizes of the tensors backward may read: the program's, its outputs' by their names in
    the generated code, and the upstream gradients'."""
    return Sizes(
        shapes={n: program.value(n).shape for n in program.tensor_names},
        outputs={n.value: math.prod(o.shape) for n, o in zip(names, program.outputs)},
        upstream=frozenset(n.grad for n in names),
    )
