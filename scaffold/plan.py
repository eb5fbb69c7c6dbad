"""Stage 4: the backward plan.

Decides what the generated backward (and jvp) compute and what the forward must leave them:

* each gradient is ``grad_output * partial``, reduced to its input's shape; each jvp term is
  ``partial * tangent``;
* common subexpressions are shared (sympy's ``cse``) across all terms; a temporary used by one term is
  computed inside that term's guard (``needs_input_grad``, or "this tangent is not None"), one used by
  several is computed once, guarded by "any of them is needed";
* what backward reads is chosen by a small cost model. The candidates: the inputs; the output, where a
  partial contains the whole forward (d/dx exp(x) = exp(x), d/dx tanh(x) = 1 - tanh(x)**2); and boolean
  masks for the conditions of steps and case distinctions (relu, leaky_relu, clamp), one byte per element
  instead of the four or eight of the float input they are computed from. Each choice is costed in
  bytes saved (relative to the example shapes of the spec) and in tensor operations in backward (plus the
  forward's work to build the masks); the spec's ``policy`` says which comes first: ``"memory"`` (the
  default) the bytes, ``"time"`` the operations;
* exactly the tensors the formulas use are saved; scalars they use become ctx attributes;
* before CSE, each formula is lowered (:mod:`.lowering`): a branch's input kept inside its region,
  powers of a quotient computed as such, ``x * exp(y)`` as 0 where x = 0.

Intermediates of the forward other than its output are never saved: saving them would need them
returned as extra outputs for double backward to stay correct, so backward recomputes them instead.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import sympy

from . import lowering
from .derivation import Derivation, differentiate
from .expression import GRAD
from .spec import OpSpec

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
class Mask:
    """A condition of the forward saved for backward as a bool tensor: ``name = condition``."""

    name: str
    condition: sympy.Basic


@dataclass(frozen=True)
class Cost:
    """What a choice of saved tensors costs, relative to the op's example shapes."""

    elements: float  # saved elements, each mask element counting 1/4 (bool next to float32)
    operations: int  # tensor operations in backward, plus those the forward adds to build masks


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


@dataclass(frozen=True)
class BackwardPlan:
    forward_steps: tuple[Step, ...]
    forward_expr: sympy.Expr
    # The forward as written (not its stable rewrite), straight-lined: the generated test's reference and
    # what ``scaffold bench`` runs under plain autograd.
    reference_steps: tuple[Step, ...]
    reference_expr: sympy.Expr
    # Custom gradients as written (over the arguments and expression.GRAD): the generated test's formulas.
    custom_gradients: tuple[tuple[str, sympy.Expr], ...]
    backward: DerivativeCode
    saved: tuple[str, ...]  # saved for backward, in order: inputs, then masks, then OUTPUT
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


def _temp_names(taken: set[str]) -> Iterator[sympy.Symbol]:
    for i in range(10**6):
        if f"tmp{i}" not in taken:
            yield sympy.Symbol(f"tmp{i}", real=True)


def _share(
    exprs: list[sympy.Expr], names: list[str], taken: set[str], scalars: frozenset[sympy.Symbol]
) -> DerivativeCode:
    """CSE across ``exprs``; place each temporary with the one term that uses it, or in a shared block."""
    replacements, reduced = _eliminate(exprs, taken, scalars)
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


def straight_line(
    expr: sympy.Expr, taken: set[str], scalars: frozenset[sympy.Symbol] | None = None
) -> tuple[tuple[Step, ...], sympy.Expr]:
    """``expr`` as assignments of its repeated subexpressions and a final expression over them.

    ``scalars``: the symbols that are not tensors; None for the expression as written (a test's
    reference), without the :mod:`.lowering` rewrites."""
    replacements, (reduced,) = _eliminate([expr], taken, scalars)
    return tuple(Step(str(s), e) for s, e in replacements), reduced


Replacements = list[tuple[sympy.Symbol, sympy.Expr]]


def _eliminate(
    exprs: list[sympy.Expr], taken: set[str], scalars: frozenset[sympy.Symbol] | None
) -> tuple[Replacements, list[sympy.Expr]]:
    """sympy's ``cse`` of ``exprs`` (lowered first unless ``scalars`` is None), temporaries numbered in
    order of use."""
    names = _temp_names(taken)
    definitions: Replacements = []
    if scalars is not None:
        exprs = [lowering.guard_branches(e, scalars) for e in exprs]
        exprs = lowering.pair_powers(exprs, names, definitions)
    exprs = lowering.products_with_exp(exprs, names, definitions)
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
    renamed = dict(zip((s for s, _ in steps), _temp_names(taken)))
    steps = [(renamed[s], e.xreplace(renamed)) for s, e in steps]
    return steps, [e.xreplace(renamed) for e in reduced[: len(exprs)]]


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
    where = f"{spec.source}: forward" if spec is not None else "forward"
    policy = spec.policy if spec is not None else "memory"
    shapes = {t.name: t.shape for t in spec.tensors} if spec is not None else {}
    names = [p.name for p in derivation.partials]
    taken = set(parsed.symbols) | {GRAD_OUTPUT, OUTPUT} | {n + TANGENT_SUFFIX for n in names}
    grad_output = sympy.Symbol(GRAD_OUTPUT, real=True)
    output = sympy.Symbol(OUTPUT, real=True)

    # Forward: share repeated subexpressions, e.g. exp(x) in x * exp(x) + exp(x).
    scalars = frozenset(parsed.symbols[n] for n in parsed.scalar_names)
    forward_steps, forward_expr = straight_line(derivation.forward, taken, scalars)
    reference_steps, reference_expr = straight_line(parsed.expr, set(parsed.symbols) | {OUTPUT})

    # Backward: choose what it reads (see the module docstring), then share its subexpressions.
    forward = derivation.forward
    # A custom gradient replaces grad_output times the derived partial (it need not be linear in it).
    custom = {name: expr.xreplace({GRAD: grad_output}) for name, expr in derivation.custom}
    plain = [custom.get(p.name, grad_output * p.expr) for p in derivation.partials]
    variants = [plain]
    if not forward.is_Symbol:
        with_output = [e.xreplace({forward: output}) for e in plain]
        if with_output != plain:
            variants.append(with_output)
    sizes = _Sizes(parsed.tensor_names, shapes)
    candidates = [_with_masks(v, subset, taken, sizes) for v in variants for subset in _mask_subsets(v, parsed)]
    exprs, masks, cost = min(candidates, key=lambda c: _rank(c[2], policy))
    backward = _share(exprs, names, taken | {m.name for m in masks}, scalars)
    # jvp: partial * tangent per argument, from the inputs alone (the output has no tangent there).
    tangents = [sympy.Symbol(p.name + TANGENT_SUFFIX, real=True) for p in derivation.partials]
    jvp = _share([p.expr * t for p, t in zip(derivation.partials, tangents)], names, taken, scalars)

    backward_names, jvp_names = backward.free_names(), jvp.free_names()
    saved = tuple(n for n in parsed.tensor_names if n in backward_names)
    used_masks = tuple(m for m in masks if m.name in backward_names)
    differentiable = [grad_output, *(parsed.symbols[n] for n in saved)]
    differentiable += [output] if OUTPUT in backward_names else []
    tensors = frozenset(parsed.symbols[n] for n in parsed.tensor_names) | {grad_output, output}
    double_backward = _double_backward(
        exprs, names, differentiable, tensors | {sympy.Symbol(m.name) for m in used_masks}, taken, scalars, where
    )
    return BackwardPlan(
        forward_steps=forward_steps,
        forward_expr=forward_expr,
        reference_steps=reference_steps,
        reference_expr=reference_expr,
        custom_gradients=parsed.gradients,
        backward=backward,
        saved=saved + tuple(m.name for m in used_masks) + ((OUTPUT,) if OUTPUT in backward_names else ()),
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
    )


#: Second partials derived for a double backward, at most: beyond, autograd differentiates backward's code
#: (a sum of 64 tanh terms in 193 tensors would need about a thousand).
MAX_SECOND_PARTIALS = 64
GRAD_GRAD_PREFIX = "grad_grad_"


def _double_backward(
    exprs: list[sympy.Expr],
    names: list[str],
    differentiable: list[sympy.Symbol],
    tensors: frozenset[sympy.Symbol],
    taken: set[str],
    scalars: frozenset[sympy.Symbol],
    where: str,
) -> DoubleBackward | None:
    """The :class:`DoubleBackward` of backward's formulas ``exprs`` (one per tensor argument in ``names``)."""
    pairs = [(a, i) for a, v in enumerate(differentiable) for i, e in enumerate(exprs) if v in e.free_symbols]
    if not pairs or len(pairs) > MAX_SECOND_PARTIALS:
        return None
    terms, kept = [], []
    for a, i in pairs:
        what = f"the gradient of {names[i]}"
        second = differentiate(exprs[i], differentiable[a], tensors, what=what, where=where)
        if second != 0:
            terms.append(second)
            kept.append((a, i))
    if not terms:
        return None
    # The terms are the partials dB_i/dv; each is multiplied by its grad_grad_i where it is printed, so
    # that no shared temporary reads a grad_grad_i that may be None.
    taken = taken | {GRAD_GRAD_PREFIX + n for n in names}
    code = _share(terms, [f"{differentiable[a]}/{names[i]}" for a, i in kept], taken, scalars)
    return DoubleBackward(tuple(str(v) for v in differentiable), tuple(kept), code)


# -- the cost model ---------------------------------------------------------------------------------

#: Conditions considered for masks, at most: every subset of them is costed.
MAX_MASKED_CONDITIONS = 6
#: Bytes of a bool element relative to a float32 one.
MASK_WEIGHT = 0.25


class _Sizes:
    """Elements of the tensors backward may read, from the spec's example shapes (1 where unknown)."""

    def __init__(self, tensor_names: tuple[str, ...], shapes: dict[str, tuple[int, ...]]) -> None:
        self.shapes = {n: shapes.get(n, ()) for n in tensor_names}

    def of(self, names: set[str]) -> int:
        """Elements of the broadcast of the named tensors' shapes (the output: all of them)."""
        dims: list[int] = []
        for shape in (self.shapes[n] for n in sorted(names) if n in self.shapes):
            shape = (1,) * (len(dims) - len(shape)) + tuple(shape)
            dims = [1] * (len(shape) - len(dims)) + dims
            dims = [max(a, b) for a, b in zip(dims, shape)]
        return math.prod(dims)


def _rank(cost: Cost, policy: str) -> tuple[float, float]:
    return (cost.elements, cost.operations) if policy == "memory" else (cost.operations, cost.elements)


def _conditions(exprs: list[sympy.Expr], tensors: set[sympy.Symbol]) -> list[sympy.Basic]:
    """Tensor conditions of the formulas that a bool mask could stand for: those of Piecewise and of steps
    (Heaviside, 0 or 1 at 0), except where the printer keeps a branch's or a step's other factors inside
    the region using the condition itself (see lowering.needs_guard)."""

    def needs_guard(value: sympy.Basic) -> bool:
        return lowering.needs_guard(value, lambda e: bool(e.free_symbols & tensors))

    found: list[sympy.Basic] = []
    for expr in exprs:
        nodes = list(sympy.preorder_traversal(expr))
        # A step whose other factors would overflow outside it is printed with their input kept inside it.
        guarded = {
            f
            for n in nodes
            if isinstance(n, sympy.Mul) and needs_guard(n)
            for f in n.args
            if isinstance(f, sympy.Heaviside)
        }
        for node in nodes:
            if isinstance(node, sympy.Piecewise) and not any(needs_guard(p.expr) for p in node.args):
                conds = [p.cond for p in node.args if p.cond.free_symbols & tensors]
            elif (
                isinstance(node, sympy.Heaviside)
                and node.args[1] in (0, 1)
                and node.free_symbols & tensors
                and node not in guarded
            ):
                conds = [_step_condition(node)]
            else:
                continue
            found += [c for c in conds if c not in found]
    return found


def _step_condition(step: sympy.Heaviside) -> sympy.Basic:
    """Where a step (0 or 1 at 0) is 1, as a comparison of its positive and negative terms: x > y."""
    arg, at_zero = step.args
    constant, terms = arg.as_coeff_add()
    positive = sympy.Add(*[t for t in terms if not t.could_extract_minus_sign()])
    negative = sympy.Add(*[-t for t in terms if t.could_extract_minus_sign()])
    if positive == 0:  # c - v > 0: v < c
        return (sympy.Lt if at_zero == 0 else sympy.Le)(negative, constant)
    return (sympy.Gt if at_zero == 0 else sympy.Ge)(positive, negative - constant)


def _mask_subsets(exprs: list[sympy.Expr], parsed) -> list[tuple[sympy.Basic, ...]]:
    conditions = _conditions(exprs, {parsed.symbols[n] for n in parsed.tensor_names})
    if len(conditions) > MAX_MASKED_CONDITIONS:
        return [(), tuple(conditions)]
    return [c for k in range(len(conditions) + 1) for c in itertools.combinations(conditions, k)]


def _with_masks(
    exprs: list[sympy.Expr], conditions: tuple[sympy.Basic, ...], taken: set[str], sizes: _Sizes
) -> tuple[list[sympy.Expr], tuple[Mask, ...], Cost]:
    """``exprs`` with each of ``conditions`` read from a saved mask, the masks, and what it all costs."""
    names = (n for n in (f"mask{i}" if i else "mask" for i in range(10**6)) if n not in taken)
    masks = tuple(Mask(next(names), c) for c in conditions)
    symbols = {m.condition: sympy.Symbol(m.name) for m in masks}

    def mask(node: sympy.Basic) -> sympy.Basic:
        if isinstance(node, sympy.Heaviside):
            if node.args[1] in (0, 1) and _step_condition(node) in symbols:
                return sympy.Piecewise((1, symbols[_step_condition(node)]), (0, True))
            return node
        pairs = [(p.expr, symbols.get(p.cond, p.cond)) for p in node.args]
        return sympy.Piecewise(*pairs)

    if symbols:
        exprs = [e.replace(lambda n: isinstance(n, (sympy.Piecewise, sympy.Heaviside)), mask) for e in exprs]
    read = {s.name for e in exprs for s in e.free_symbols}
    tensors = set(sizes.shapes)
    elements = sum(sizes.of({n}) for n in read & tensors)
    if OUTPUT in read:
        elements += sizes.of(tensors)
    operations = sum(_operations(e, tensors | {OUTPUT, GRAD_OUTPUT} | set(symbols.values())) for e in exprs)
    for m in masks:
        if m.name in read:
            condition_tensors = {s.name for s in m.condition.free_symbols} & tensors
            elements += MASK_WEIGHT * sizes.of(condition_tensors)
            operations += _operations(m.condition, tensors)
    return exprs, masks, Cost(elements, operations)


def _operations(expr: sympy.Basic, tensors: set) -> int:
    """Tensor operations (passes over memory) ``expr`` costs when printed as torch code, roughly."""
    names = {t if isinstance(t, str) else t.name for t in tensors}
    count = 0
    for node in sympy.preorder_traversal(expr):
        if node.is_Atom or not any(s.name in names for s in node.free_symbols):
            continue
        if isinstance(node, (sympy.Add, sympy.Mul)):
            tensor_args = sum(1 for a in node.args if any(s.name in names for s in a.free_symbols))
            count += tensor_args - 1 + (tensor_args < len(node.args))
        elif isinstance(node, sympy.Piecewise):
            count += len(node.args) - 1
        elif not isinstance(node, sympy.functions.elementary.piecewise.ExprCondPair):
            count += 1
    return count
