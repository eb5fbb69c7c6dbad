"""Stage 4b: the derivative of each node of a structured program, one rule per kind of node.

As PyTorch's ``tools/autograd/derivatives.yaml`` gives each op its backward formula (and forward-mode
formula) in terms of ``grad``, ``self`` and ``result``, this module gives each kind of node of
:mod:`.structural` its vector-Jacobian product and its Jacobian-vector product as torch code over the
node's operands, its result and the incoming gradient or tangents. An elementwise node's rule is the
symbolic one: its partial derivatives in each value it reads, taken by :func:`.derivation.differentiate`
in stable primitives; the gradient it passes on is the incoming one times the partial.

A rule's code keeps each dim as written (from the front where it is non-negative, from the back where it
is negative, every dimension at call time where it is omitted), so that it means at every rank what torch
means by it. The rules never see shapes beyond the example ones: a gradient that reaches a node with
fewer elements than its result (the gradient of a reduction's operand before it meets another term)
broadcasts, and a rule that needs the exact shape (a matrix product, log_softmax) expands it first
(:mod:`.dataflow`).

Rules, with ``g`` the gradient of the result ``y``, ``t`` a tangent, dims the reduced dimensions (``g``
and ``y`` unsqueezed there where keepdim is False):

========== ============================================== =================================================
node       gradient of the operand                        tangent of the result
========== ============================================== =================================================
sum        g (broadcast)                                  sum(t)
mean       g / n (n elements reduced)                     mean(t)
logsumexp  g * exp(x - y)  (the softmax of x)             sum(exp(x - y) * t)
amax/amin  g * (x == y) / count(x == y) (ties share)      sum(t * (x == y)) / count(x == y)
softmax    y * (g - sum(g * y))                           y * (t - sum(y * t))
log_softmax g - exp(y) * sum(g)                           t - sum(exp(y) * t)
a @ b      a: g @ b^T, b: a^T @ g (summed over broadcast)  ta @ b + a @ tb
transpose  g transposed back                              t transposed
cumsum     g summed from the back (reversed cumsum)        cumsum(t)
cumprod    exact at zeros: see _cumprod_backward           exact at zeros: see _cumprod_tangent
x[a:b]     zeros of x's shape with g scattered into a:b   t[a:b]
cat        g split: each operand's part along dim          cat of the tangents
stack      g selected at each operand's index along dim    stack of the tangents
reshape    g reshaped back to x's shape                   t reshaped (unsqueeze, squeeze, flatten alike)
one_hot    none: its operand holds int64 class indices    none (zero)
gather     zeros scattered with g at the indices (added)  t gathered at the indices
argmax     none: int64 indices (zero for x)               none (zero)
========== ============================================== =================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from .derivation import differentiate, flat_warnings, unused_scalar_warnings
from .program import ELEMENTWISE, Program, Value
from .stable import remove_singularities, stabilize
from .structural import (
    AMax,
    AMin,
    ArgIndex,
    Concatenated,
    CumProd,
    CumSum,
    Flattened,
    Gather,
    LogSoftmax,
    LogSumExp,
    MatrixProduct,
    OneHot,
    ReduceMean,
    ReduceSum,
    Reduction,
    Reshaped,
    Reshaping,
    Scan,
    Sliced,
    Softmax,
    Stacked,
    Structural,
    Transposed,
    sliced,
    spelled,
)


@dataclass(frozen=True)
class ElementwiseNode:
    """An elementwise node in stable primitives, with its partial derivative in each tensor value it reads."""

    name: str
    forward: sympy.Expr
    partials: tuple[tuple[str, sympy.Expr], ...]  # read -> d node / d read


@dataclass(frozen=True)
class ProgramDerivation:
    """A structured program with every elementwise node's partial derivatives (the structural nodes'
    rules are the functions below)."""

    program: Program
    elementwise: tuple[ElementwiseNode, ...]
    # the custom gradients (Program.gradients) in stable primitives: tensor name -> what backward returns
    custom: tuple[tuple[str, sympy.Expr], ...] = ()
    warnings: tuple[str, ...] = ()  # for the user: e.g. a tensor whose gradient is zero everywhere
    removable: tuple[str, ...] = ()  # tensors at whose 0 a node as written is 0/0 (x/expm1(x))

    def node(self, name: str) -> ElementwiseNode:
        return next(n for n in self.elementwise if n.name == name)


def derive_program(program: Program, *, where: str) -> ProgramDerivation:
    """The partial derivatives of every elementwise node of ``program`` in the tensor values it reads."""
    scalars = {sympy.Symbol(n, real=True) for n in program.parsed.scalar_names} | {
        program.parsed.symbols[n] for n in program.parsed.scalar_names
    }
    nodes, removable = [], set()
    for value in program.values:
        if value.kind != ELEMENTWISE:
            continue
        reads = [s for s in value.expr.free_symbols if s not in scalars]
        tensors = frozenset(reads)
        forward, singular = remove_singularities(stabilize(value.expr, tensors), tensors)
        removable |= {s.name for s in singular}
        what = f"the step {value.name!r}" if not value.name.startswith("tmp") else "the forward"
        partials = tuple(
            (s.name, differentiate(forward, s, tensors, what=what, where=where))
            for s in sorted(reads, key=lambda s: s.name)
        )
        nodes.append(ElementwiseNode(value.name, forward, partials))
    custom = tuple(
        (name, stabilize(expr, frozenset(s for s in expr.free_symbols if s not in scalars)))
        for name, expr in program.gradients
    )
    flat = [name for name in program.tensor_names if name not in _differentiable(program, nodes)]
    flat = [name for name in flat if name not in dict(custom) and program.consumers(name)]
    flat = [name for name in flat if name not in program.integers]  # class indices: no gradient, no warning
    warnings = unused_scalar_warnings(program.parsed) + flat_warnings(program.parsed, flat)
    removable_tensors = tuple(name for name in program.tensor_names if name in removable)
    return ProgramDerivation(program, tuple(nodes), custom, warnings, removable_tensors)


def _differentiable(program: Program, nodes: list[ElementwiseNode]) -> set[str]:
    """The values some output's gradient reaches: the outputs, and what a value it reaches reads through
    a rule or a partial derivative that is not zero."""
    partials = {n.name: dict(n.partials) for n in nodes}
    reached = {o.value for o in program.outputs}
    for value in reversed(program.values):
        if value.name not in reached or value.expr is None or value.name in program.integers:
            continue  # (int64 indices, an argmax's: no gradient passes through them)
        for read in value.reads:
            if value.kind != ELEMENTWISE or partials[value.name].get(read, 0) != 0:
                reached.add(read)
    return reached


# -- the structural rules, as torch code -------------------------------------------------------------------


class Emitter:
    """What a rule may ask while it writes code: a value's name (the value must reach backward or jvp), a
    value's shape at run time, and the example shapes."""

    def value(self, name: str) -> str:
        raise NotImplementedError

    def shape(self, name: str) -> str:
        raise NotImplementedError

    def example_shape(self, name: str) -> tuple[int, ...]:
        raise NotImplementedError

    def module(self, alias: str) -> str:
        """``alias`` (a key of printing.IMPORTS), which the generated module then imports."""
        raise NotImplementedError

    def temporary(self, code: str) -> str:
        """The name of a temporary assigned ``code`` just before the rule's result (read twice there)."""
        raise NotImplementedError

    def softmax_of(self, name: str, call: Reduction) -> str | None:
        """Code for the softmax of the value ``name`` along the one dim ``call`` reduces, as written, from a
        softmax or log_softmax node of the program, or None where it has none."""
        return None


def _dims_argument(dims: tuple[int, ...]) -> str:
    return str(dims[0]) if len(dims) == 1 else str(tuple(dims))


def reduce_code(call: Reduction, operand: str, dtype: str | None = None) -> str:
    """The torch code of a reduction of ``operand`` (a name, or code in parentheses) over its dims as
    written (every dimension at call time where dim is omitted), a sum accumulating in ``dtype`` where
    given."""
    keep = (", keepdim=True" if call.keepdim else "") + (f", dtype={dtype}" if dtype else "")
    if isinstance(call, LogSumExp):
        dims = _dims_argument(call.dims) if call.dims else f"tuple(range({operand}.dim()))"
        return f"torch.logsumexp({operand}, dim={dims}{keep})"
    method = {ReduceSum: "sum", ReduceMean: "mean", AMax: "amax", AMin: "amin"}[type(call)]
    if not call.dims and not keep:
        return f"{operand}.{method}()"
    if not call.dims:  # every dimension: amax and amin spell it dim=()
        return f"{operand}.{method}(dim={'()' if method in ('amax', 'amin') else 'None'}{keep})"
    return f"{operand}.{method}(dim={_dims_argument(call.dims)}{keep})"


def unsqueezed(code: str, call: Reduction) -> str:
    """``code`` (shaped like the reduction's result) with the reduced dimensions put back as size 1, at
    the dims as written: those counted from the front in increasing order, those from the back from -1 on
    (:mod:`.expression` refuses a reduction that mixes the two)."""
    if call.keepdim or not call.dims:  # a 0-d result broadcasts as it is
        return code
    front = sorted(d for d in call.dims if d >= 0)
    back = sorted((d for d in call.dims if d < 0), reverse=True)
    for d in front + back:
        code = f"{code}.unsqueeze({d})"
    return code


def forward_code(call: Structural, operands: list[str], dtype: str = "") -> str:
    """The torch code computing ``call`` of the values ``operands`` (names); ``dtype``, code for the
    floating-point dtype a one_hot takes."""
    if isinstance(call, OneHot):
        return f"torch.nn.functional.one_hot({call.index_code(operands[0])}, {call.classes}).to({dtype})"
    if isinstance(call, Gather):
        return f"{operands[0]}.gather({call.dim}, {call.index_code(operands[1])})"
    if isinstance(call, ArgIndex):
        return f"{operands[0]}.{call.spelling}(dim={call.dim}{', keepdim=True' if call.keepdim else ''})"
    if isinstance(call, Reduction):
        return reduce_code(call, operands[0])
    if isinstance(call, Softmax):
        function = "torch.log_softmax" if isinstance(call, LogSoftmax) else "torch.softmax"
        return f"{function}({operands[0]}, dim={call.dim})"
    if isinstance(call, MatrixProduct):
        return f"{operands[0]} @ {operands[1]}"
    if isinstance(call, Scan):
        return f"torch.{call.spelling}({operands[0]}, dim={call.dim})"
    if isinstance(call, Sliced):
        return sliced(operands[0], call)
    if isinstance(call, Concatenated):
        function = "torch.stack" if isinstance(call, Stacked) else "torch.cat"
        return f"{function}(({', '.join(operands)}), dim={call.dim})"
    if isinstance(call, Reshaping):
        return _reshaping_code(call, operands[0])
    assert isinstance(call, Transposed)
    return f"{operands[0]}.transpose({call.dims[0]}, {call.dims[1]})"


def _reshaping_code(call: Reshaping, x: str) -> str:
    if isinstance(call, Reshaped):
        return f"{x}.reshape({', '.join(map(str, call.sizes))})"
    if isinstance(call, Flattened):
        return f"{x}.flatten({call.dims[0]}, {call.dims[1]})"
    return f"{x}.{call.spelling}({call.dim})"


def needs_exact_gradient(call: Structural) -> bool:
    """Whether the rule needs the incoming gradient at the result's exact shape (not merely broadcasting
    to it): sums over it, or multiplies matrices with it."""
    return isinstance(call, (MatrixProduct, Softmax, Scan, Sliced, Concatenated, Reshaping, Gather))


def backward_code(node: Value, operand: int, g: str, emit: Emitter) -> str:
    """The gradient that ``node`` passes to its operand number ``operand``, given its own gradient ``g``
    (a name). The result may have fewer elements than the operand where it broadcasts to it."""
    call = node.expr
    x = str(call.operand_exprs[0])
    if isinstance(call, Reduction):
        dims = call.dims
        grad = unsqueezed(g, call)
        if isinstance(call, ReduceSum):
            return grad
        if isinstance(call, ReduceMean):
            shape = emit.shape(x)
            # math.prod, not Size.numel: torch.func.functionalize passes a shape as a plain tuple
            count = (
                f"{emit.module('math')}.prod({shape})" if not call.dims else " * ".join(f"{shape}[{d}]" for d in dims)
            )
            return f"{grad} / {count}" if len(dims) == 1 or not call.dims else f"{grad} / ({count})"
        if isinstance(call, LogSumExp):
            softmax = emit.softmax_of(x, call)  # the program's own softmax of x, where it has one
            if softmax is not None:
                return f"{grad} * {softmax}"
        y = unsqueezed(emit.value(node.name), call)
        if isinstance(call, LogSumExp):
            return f"{grad} * torch.exp({emit.value(x)} - {y})"
        # where, and a count in the gradient's dtype: a bool sum counts in int64, slowly
        ties = emit.temporary(f"{emit.value(x)} == {y}")
        count = reduce_code(_keeping(call), ties, dtype=f"{g}.dtype")
        return f"torch.where({ties}, {grad} / {count}, 0)"
    if isinstance(call, Softmax):
        # PyTorch's own backward kernels (one pass, and differentiable again): y * (g - sum(g * y)) for
        # softmax, g - exp(y) * sum(g) for log_softmax
        y = emit.value(node.name)
        kernel = "_log_softmax_backward_data" if isinstance(call, LogSoftmax) else "_softmax_backward_data"
        return f"torch.{kernel}({g}, {y}, {call.dim}, {y}.dtype)"
    if isinstance(call, Transposed):
        return f"{g}.transpose({call.dims[0]}, {call.dims[1]})"
    if isinstance(call, Gather):  # out of place, so differentiable again
        index = call.index_code(emit.value(str(call.args[1])))
        return f"{g}.new_zeros({emit.shape(x)}).scatter_add({call.dim}, {index}, {g})"
    if isinstance(call, CumSum):
        return _from_the_back(g, call.dim)
    if isinstance(call, CumProd):
        return _cumprod_backward(call, g, emit.value(x), emit.value(node.name), emit)
    if isinstance(call, Sliced):
        # out of place (differentiable again): zeros where forward dropped x's elements
        # bounds from the front: slice_scatter's vmap rule (jacrev, hessian) refuses negative ones
        shape = emit.shape(x)
        start, stop = (b if b is None or b >= 0 else f"{shape}[{call.dim}] - {-b}" for b in call.bounds)
        return f"{g}.new_zeros({shape}).slice_scatter({g}, {call.dim}, {start}, {stop})"
    if isinstance(call, Concatenated):
        return _cat_backward(call, operand, g, emit)
    if isinstance(call, Reshaping):
        return f"{g}.reshape({emit.shape(x)})"
    return _matmul_backward(call, operand, g, emit)


def _from_the_back(code: str, dim: int) -> str:
    """The sums of ``code`` (a name) from each position to the end along ``dim``: cumsum's gradient."""
    return f"{code}.flip({dim}).cumsum({dim}).flip({dim})"


def _cumprod_backward(call: CumProd, g: str, x: str, y: str, emit: Emitter) -> str:
    """cumprod's gradient, exact where ``x`` has zeros and differentiable again (torch ops only, O(n)).

    x_i's gradient is sum over k >= i of g_k * prod(x_j, j <= k, j != i). Where x_i != 0 that is the sum
    from the back of g * y, over x_i (derivatives.yaml's formula). Every term has a factor 0 at the zeros
    after the first, so at the first zero it is the sum from the back of g * cumprod(x with that zero as 1),
    and at the second the same with both first zeros as 1, times the first zero (0, but not flat in it:
    a second derivative needs that). After the second zero the gradient is 0 to first order."""
    d = call.dim
    g = g if g.isidentifier() else emit.temporary(g)  # (expanded to the result's shape: read three times)
    zero = emit.temporary(f"{x} == 0")
    count = emit.temporary(f"{zero}.cumsum({d})")
    first = emit.temporary(f"{zero} & ({count} == 1)")
    second = emit.temporary(f"{zero} & ({count} == 2)")
    but_first = emit.temporary(f"torch.where({first}, 1, {x})")
    but_two = emit.temporary(f"torch.where({second}, 1, {but_first})")
    first_zero = f"torch.where({first}, {x}, 0).sum({d}, keepdim=True)"
    at_first = _from_the_back(emit.temporary(f"{g} * {but_first}.cumprod({d})"), d)
    at_second = _from_the_back(emit.temporary(f"{g} * {but_two}.cumprod({d})"), d)
    nonzero = f"{_from_the_back(emit.temporary(f'{g} * {y}'), d)} / torch.where({zero}, 1, {x})"
    zeros = f"torch.where({first}, {at_first}, torch.where({second}, {first_zero} * {at_second}, 0))"
    return f"torch.where({zero}, {zeros}, {nonzero})"


def _cat_backward(call: Concatenated, operand: int, g: str, emit: Emitter) -> str:
    """Operand ``operand``'s part of ``g``: its size along dim, after the operands before it (sizes at
    call time)."""
    if isinstance(call, Stacked):
        return f"{g}.select({call.dim}, {operand})"
    sizes = [f"{emit.shape(str(o))}[{call.dim}]" for o in call.operand_exprs]
    start = " + ".join(sizes[:operand]) or "0"
    return f"{g}.narrow({call.dim}, {start}, {sizes[operand]})"


def _keeping(call: Reduction) -> Reduction:
    """The sum over the same dimensions as ``call``, keeping them (it counts ties)."""
    return ReduceSum(call.args[0], call.args[1], sympy.true)


def _matmul_backward(call: MatrixProduct, operand: int, g: str, emit: Emitter) -> str:
    """As torch.matmul's: a vector is a vector at every call (``_check_ranks``), a matrix may have batch
    dimensions, which broadcast: each operand's gradient is summed back to its shape at call time."""
    a, b = (str(o) for o in call.operand_exprs)
    ra, rb = len(emit.example_shape(a)), len(emit.example_shape(b))
    if ra == 1 and rb == 1:  # a dot product
        return f"{g} * {emit.value(b if operand == 0 else a)}"
    target = a if operand == 0 else b
    if operand == 0:
        if rb == 1:  # (..., n, k) @ (k,): the outer product of g and b, a's shape already
            return f"{g}.unsqueeze(-1) * {emit.value(b)}"
        code = f"({g}.unsqueeze(-2) @ {emit.value(b)}.mT).squeeze(-2)" if ra == 1 else f"({g} @ {emit.value(b)}.mT)"
    else:
        if ra == 1:  # (k,) @ (..., k, m): b's shape already
            return f"{emit.value(a)}.unsqueeze(-1) * {g}.unsqueeze(-2)"
        code = f"({emit.value(a)}.mT @ {g}.unsqueeze(-1)).squeeze(-1)" if rb == 1 else f"({emit.value(a)}.mT @ {g})"
    return f"{code}.sum_to_size({emit.shape(target)})"


def tangent_code(node: Value, tangents: list[str], emit: Emitter) -> str:
    """The tangent of ``node``'s result given its operands' tangents (names)."""
    call = node.expr
    x = str(call.operand_exprs[0])
    if isinstance(call, Reduction):
        if isinstance(call, (ReduceSum, ReduceMean)):
            return reduce_code(call, tangents[0])
        y = unsqueezed(emit.value(node.name), call)
        if isinstance(call, LogSumExp):
            return reduce_code(_summing(call), f"(torch.exp({emit.value(x)} - {y}) * {tangents[0]})")
        ties = f"({emit.value(x)} == {y})"
        total = reduce_code(_summing(call), f"({tangents[0]} * {ties})")
        return f"{total} / {reduce_code(_summing(call), ties)}"
    if isinstance(call, Softmax):
        y = emit.value(node.name)
        if isinstance(call, LogSoftmax):
            return f"{tangents[0]} - (torch.exp({y}) * {tangents[0]}).sum(dim={call.dim}, keepdim=True)"
        return f"{y} * ({tangents[0]} - ({y} * {tangents[0]}).sum(dim={call.dim}, keepdim=True))"
    if isinstance(call, Transposed):
        return f"{tangents[0]}.transpose({call.dims[0]}, {call.dims[1]})"
    if isinstance(call, Gather):
        return f"{tangents[0]}.gather({call.dim}, {call.index_code(emit.value(str(call.args[1])))})"
    if isinstance(call, CumSum):
        return f"{tangents[0]}.cumsum({call.dim})"
    if isinstance(call, CumProd):
        return _cumprod_tangent(call, tangents[0], emit.value(x), emit.value(node.name))
    if isinstance(call, (Sliced, Concatenated, Reshaping)):
        return forward_code(call, tangents)
    a, b = (str(o) for o in call.operand_exprs)
    # an operand without a tangent (a one_hot of int64 indices) adds no term
    terms = [f"{tangents[0]} @ {emit.value(b)}", f"{emit.value(a)} @ {tangents[1]}"]
    return " + ".join(term for term, t in zip(terms, tangents) if t != "None")


def _cumprod_tangent(call: CumProd, t: str, x: str, y: str) -> str:
    """cumprod's tangent, exact where ``x`` has zeros: y_k's is sum over i <= k of t_i * prod(x_j, j <= k,
    j != i). Before the first zero that is y * cumsum(t / x); from the first zero to the second only its
    own term is left, t there times cumprod(x with that zero as 1); from the second on, 0."""
    d = call.dim
    zero, count = f"({x} == 0)", f"({x} == 0).cumsum({d})"
    first = f"{zero} & ({count} == 1)"
    before = f"{y} * ({t} / torch.where({zero}, 1, {x})).cumsum({d})"
    after = f"torch.where({first}, {t}, 0).sum({d}, keepdim=True) * torch.where({first}, 1, {x}).cumprod({d})"
    return f"torch.where({count} == 0, {before}, torch.where({count} == 1, {after}, 0))"


def _summing(call: Reduction) -> Reduction:
    """The sum over the same dimensions as ``call``, keeping them as it does."""
    return ReduceSum(*call.args)


def describe(node: Value) -> str:
    """One line on the rule a structural node's gradient follows, for a comment in backward."""
    call, y = node.expr, node.name
    x = str(call.operand_exprs[0])
    if isinstance(call, MatrixProduct):
        b = str(call.operand_exprs[1])
        rule = f"{x}'s gradient is g @ {b}^T, {b}'s is {x}^T @ g"
    else:
        rule = {
            ReduceSum: f"{x}'s gradient is g, spread over the summed dimensions",
            ReduceMean: f"{x}'s gradient is g spread evenly over the averaged dimensions",
            LogSumExp: f"{x}'s gradient is g times the softmax of {x}, exp({x} - {y})",
            AMax: f"{x}'s gradient is g at its largest elements, shared between ties",
            AMin: f"{x}'s gradient is g at its smallest elements, shared between ties",
            Softmax: f"{x}'s gradient is {y} * (g - sum(g * {y}))",
            LogSoftmax: f"{x}'s gradient is g - exp({y}) * sum(g)",
            Transposed: f"{x}'s gradient is g transposed back",
            CumSum: f"{x}'s gradient is g summed from each position to the end",
            CumProd: f"{x}'s gradient is g * {y} summed from the back, over {x}; at its zeros, without dividing",
            Sliced: f"{x}'s gradient is g where the slice took {x}'s elements, 0 elsewhere",
            Concatenated: "each operand's gradient is its part of g along dim",
            Stacked: "each operand's gradient is g at its index along dim",
            OneHot: f"{x} holds int64 class indices: no gradient",
            Gather: f"{x}'s gradient is g added into zeros where {call.args[1]} points",
        }.get(type(call), f"{x}'s gradient is g reshaped back to {x}'s shape")
    return f"{y} = {spelled(call)}: {rule}"
