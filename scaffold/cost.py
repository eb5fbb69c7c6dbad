"""The cost model of planning: what a choice of what backward reads costs, and which choice a policy takes.

Both planners read it: :func:`.plan.make_plan` (an elementwise op's backward) and :mod:`.dataflow` (a
structured program's). A choice (which inputs, outputs, intermediates and bool masks backward reads) is
costed relative to the op's example shapes:

* ``elements``: what is kept between forward and backward, a bool mask's element counting
  :data:`MASK_WEIGHT` of a float32 one;
* ``operations``: backward's tensor operations, each weighted by what its kernel costs
  (:data:`KERNEL_WEIGHTS`), and the forward's extra work (a mask's comparison);
* ``moved``: in fused mode, the elements moved beyond what forward and backward must.

The policy ranks them (:func:`rank`): ``"memory"`` the bytes first, ``"time"`` the operations first, the
other breaking ties. Masks are one of the choices: :func:`conditions` finds the conditions a mask may stand
for, :func:`with_masks` costs formulas with some of them read from masks.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import sympy

from . import lowering
from .program import broadcast

#: Conditions considered for masks, at most: every subset of them is costed.
MAX_MASKED_CONDITIONS = 6
#: Bytes of a bool element relative to a float32 one.
MASK_WEIGHT = 0.25
#: What writing an element costs relative to reading one (a CPU reads a cache line before it writes it).
WRITE_WEIGHT = 2


@dataclass(frozen=True)
class Cost:
    """What a choice of saved tensors costs, relative to the op's example shapes."""

    elements: float  # saved elements, each mask element counting 1/4 (bool next to float32)
    operations: float  # backward's tensor operations, weighted (KERNEL_WEIGHTS), and the forward's extra ones
    # Fused mode: elements moved beyond what forward and backward must (read the inputs and grad_output,
    # write the output and the gradients): backward's reads of what it saves, forward's writes of hidden
    # outputs and each mask's eager pass in setup_context, writes weighing WRITE_WEIGHT.
    moved: float = 0.0


@dataclass(frozen=True)
class Mask:
    """A condition of the forward saved for backward as a bool tensor: ``name = condition``."""

    name: str
    condition: sympy.Basic


@dataclass(frozen=True)
class Sizes:
    """The example shapes of the tensors backward may read: ``shapes`` of the op's tensors by name (those a
    condition may read), ``outputs`` the elements of each output backward may read by name, ``upstream``
    the names of the upstream gradients (given to backward, never kept)."""

    shapes: dict[str, tuple[int, ...]]
    outputs: dict[str, int]
    upstream: frozenset[str]

    def of(self, names: set[str]) -> int:
        """Elements of the broadcast of the named tensors' shapes."""
        return math.prod(broadcast([self.shapes[n] for n in sorted(names) if n in self.shapes]))


def rank(cost: Cost, policy: str, fused: bool = False) -> tuple[float, float]:
    """Eager code keeps its saved tensors, and memory counts what it keeps; fused code runs as two
    compiled kernels, whose time is the bytes they move (or their work, under policy 'time')."""
    kept = cost.moved if fused else cost.elements
    return (kept, cost.operations) if policy == "memory" else (cost.operations, kept)


def conditions(
    exprs: list[sympy.Expr], tensors: set[sympy.Symbol], upstream: set[sympy.Symbol] = frozenset()
) -> list[sympy.Basic]:
    """Tensor conditions of the formulas that a bool mask could stand for: those of Piecewise and of steps
    (Heaviside, 0 or 1 at 0), except where the printer keeps a branch's or a step's other factors inside
    the region using the condition itself (see lowering.needs_guard). A mask is computed in setup_context,
    before any gradient exists: a condition that reads an ``upstream`` gradient (a custom gradient's
    ``grad < 0``) stays in backward, and of ``(x >= bound) | (grad < 0)`` only ``x >= bound`` may be a mask."""

    def maskable(condition: sympy.Basic) -> list[sympy.Basic]:
        if not condition.free_symbols & tensors:
            return []
        if not condition.free_symbols & upstream:
            return [condition]
        if isinstance(condition, (sympy.And, sympy.Or)):
            return [c for arg in condition.args for c in maskable(arg)]
        return []

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
                conds = [c for p in node.args for c in maskable(p.cond)]
            elif (
                isinstance(node, sympy.Heaviside)
                and node.args[1] in (0, 1)
                and node.free_symbols & tensors
                and not node.free_symbols & upstream
                and node not in guarded
            ):
                conds = [step_condition(node)]
            else:
                continue
            found += [c for c in conds if c not in found]
    return found


def step_condition(step: sympy.Heaviside) -> sympy.Basic:
    """Where a step (0 or 1 at 0) is 1, as a comparison of its positive and negative terms: x > y."""
    arg, at_zero = step.args
    constant, terms = arg.as_coeff_add()
    positive = sympy.Add(*[t for t in terms if not t.could_extract_minus_sign()])
    negative = sympy.Add(*[-t for t in terms if t.could_extract_minus_sign()])
    if positive == 0:  # c - v > 0: v < c
        return (sympy.Lt if at_zero == 0 else sympy.Le)(negative, constant)
    return (sympy.Gt if at_zero == 0 else sympy.Ge)(positive, negative - constant)


def mask_subsets(
    exprs: list[sympy.Expr], tensors: set[sympy.Symbol], upstream: set[sympy.Symbol] = frozenset()
) -> list[tuple[sympy.Basic, ...]]:
    """Each set of the conditions of ``exprs`` (on ``tensors``) that masks may stand for, the empty one
    first; beyond :data:`MAX_MASKED_CONDITIONS` conditions, none or all of them."""
    return subsets(conditions(exprs, tensors, upstream))


def subsets(found: list[sympy.Basic]) -> list[tuple[sympy.Basic, ...]]:
    """Each set of the conditions ``found``, the empty one first; beyond :data:`MAX_MASKED_CONDITIONS`
    conditions, none or all of them."""
    if len(found) > MAX_MASKED_CONDITIONS:
        return [(), tuple(found)]
    return [c for k in range(len(found) + 1) for c in itertools.combinations(found, k)]


def with_masks(
    exprs: list[sympy.Expr], chosen: tuple[sympy.Basic, ...], taken: set[str], sizes: Sizes
) -> tuple[list[sympy.Expr], tuple[Mask, ...], Cost]:
    """``exprs`` with each of the conditions ``chosen`` read from a saved mask, the masks, and what it all
    costs."""
    names = (n for n in (f"mask{i}" if i else "mask" for i in range(10**6)) if n not in taken)
    masks = tuple(Mask(next(names), c) for c in chosen)
    symbols = {m.condition: sympy.Symbol(m.name) for m in masks}

    def mask(node: sympy.Basic) -> sympy.Basic:
        if isinstance(node, sympy.Heaviside):
            if node.args[1] in (0, 1) and step_condition(node) in symbols:
                return sympy.Piecewise((1, symbols[step_condition(node)]), (0, True))
            return node
        # a condition a mask stands for, or one of the terms of a condition's And/Or (the rest reads grad)
        pairs = [(p.expr, symbols.get(p.cond, p.cond.xreplace(symbols))) for p in node.args]
        return sympy.Piecewise(*pairs)

    if symbols:
        exprs = [e.replace(lambda n: isinstance(n, (sympy.Piecewise, sympy.Heaviside)), mask) for e in exprs]
    read = {s.name for e in exprs for s in e.free_symbols}
    tensors = set(sizes.shapes)
    elements = sum(sizes.of({n}) for n in read & tensors)
    elements += sum(size for name, size in sizes.outputs.items() if name in read)
    extra = set(sizes.outputs) | sizes.upstream | {s.name for s in symbols.values()}
    operations = operations_of(exprs, tensors | extra)
    moved = elements
    for m in masks:
        if m.name in read:
            condition_tensors = {s.name for s in m.condition.free_symbols} & tensors
            size = sizes.of(condition_tensors)
            elements += MASK_WEIGHT * size
            operations += operations_of(m.condition, tensors)
            # an eager pass in setup_context reads the condition's tensors and writes the mask
            moved += sum(sizes.of({n}) for n in condition_tensors) + (1 + WRITE_WEIGHT) * MASK_WEIGHT * size
    return exprs, masks, Cost(elements, operations, moved)


#: What one call of a function costs, in passes of a multiply over the same elements: PyTorch's float32 CPU
#: kernels (4M elements, one thread, torch 2.13), measured and rounded. tanh is five times sigmoid there,
#: and the functions without a vectorized CPU kernel (asinh, erfcx, ndtr, log_ndtr, xlog1py) twenty to
#: forty multiplies, so a plan that recomputes them is not "one operation" slower than one that reads them.
#: On a GPU every elementwise kernel costs about one pass over memory; the weights only order choices.
#: Functions not listed cost one pass.
KERNEL_WEIGHTS: dict[str, float] = {
    "exp": 1.5, "exp2": 1, "log": 2.5, "log2": 2, "log10": 2, "log1p": 1.5, "expm1": 2,
    "tanh": 4, "sinh": 2.5, "cosh": 2.5, "asinh": 36, "acosh": 30, "atanh": 3,
    "sin": 2, "cos": 2, "tan": 3.5, "asin": 3, "acos": 3, "atan": 4, "atan2": 3,
    "erf": 3, "erfc": 3, "erfcx": 40, "ndtr": 19, "log_ndtr": 43, "log_ndtr_grad": 43, "loggamma": 9,
    "softplus": 2.5, "tanh_softplus": 5, "logsigmoid": 8, "log_softplus": 4, "logaddexp": 3, "mish": 6, "gelu": 1.5,
    "xlogy": 6, "xlog1py": 23, "xexpy": 2, "logit": 2.5, "silu": 1.5,
}  # fmt: skip


def operations_of(expr: sympy.Basic | list[sympy.Basic], tensors: set) -> float:
    """What computing ``expr`` (or all of a list, sharing their common subexpressions as backward's CSE
    does) costs when printed as torch code, roughly: tensor operations weighted by KERNEL_WEIGHTS."""
    names = {t if isinstance(t, str) else t.name for t in tensors}
    exprs = expr if isinstance(expr, list) else [expr]
    nodes = {node for e in exprs for node in sympy.preorder_traversal(e)}
    count = 0.0
    for node in nodes:
        if node.is_Atom or not any(s.name in names for s in node.free_symbols):
            continue
        if isinstance(node, (sympy.Add, sympy.Mul)):
            tensor_args = sum(1 for a in node.args if any(s.name in names for s in a.free_symbols))
            count += tensor_args - 1 + (tensor_args < len(node.args))
        elif isinstance(node, sympy.Piecewise):
            count += len(node.args) - 1
        elif not isinstance(node, sympy.functions.elementary.piecewise.ExprCondPair):
            count += KERNEL_WEIGHTS.get(type(node).__name__, 1)
    return count
