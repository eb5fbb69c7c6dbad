"""Stage 5c: plan and write the forward, backward and jvp of a structured program.

Backward walks the nodes in reverse (reverse-mode differentiation, as autograd does, but planned once
here): each node's gradient is the sum of what its consumers pass it, and its rule (:mod:`.rules`) passes
gradients on to what it reads. A node whose gradient no tensor argument needs under ``needs_input_grad``
is skipped at run time (a whole matrix product nobody needs is never computed).

What backward reads decides what is kept from forward, as a careful hand-written Function would:

* tensor arguments and outputs are saved as they are (they exist anyway);
* a condition of a derivative on an intermediate (relu(x @ w + b)'s ``x @ w + b > 0``) is saved as a
  bool mask, one byte an element, and the intermediate itself is not kept; one on tensor arguments alone
  where the cost model plan.make_plan uses (:mod:`.cost`) ranks the mask first under the policy;
* the result of a reduction, softmax or product that backward reads (a norm's per-row statistic,
  attention's probabilities) is saved: forward returns it as a hidden output, so that a second
  derivative reaches it (a Function's intermediates are saved that way);
* a part hoisted out of a formula (:mod:`.program`: a norm's ``rsqrt = 1/sqrt(var + eps)``) is saved
  the same way, and its derivatives are written in terms of its own value where they can be
  (``-rsqrt**3/2``, not ``-(var + eps)**(-3/2)/2``), so that backward needs neither what it reads nor a
  root at every element (a compiler fusing backward into one loop recomputes such parts per element);
  one of what backward keeps anyway (snake's ``1/a`` beside ``a``) only under "time": the cost model
  ranks its elements first under "memory";
* other elementwise intermediates and transposes are recomputed in backward from what is saved: they cost
  one pass over memory, not a tensor kept alive between forward and backward.

Backward's code is differentiable torch code on saved tensors, so a second derivative differentiates it.
jvp recomputes the forward from the inputs alongside the tangents (forward mode keeps nothing extra).
"""

from __future__ import annotations

import ast
import functools
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass

import sympy

from . import cost, structural
from .double_backward import DoubleBackward, Node, composed_gradients, derive_double_backward
from .errors import ExpressionError, error_context
from .lowering import step_relational
from .plan import Step, _share, derivative_kernel_alone, straight_line
from .printing import IMPORTS, POWER, PRODUCT, is_finite, math_text, print_torch
from .printing import operand as parenthesized
from .program import ELEMENTWISE, SCALAR, TENSOR, Program, Value, _broadcast_checked, broadcast, spread_reduction
from .rows import RowKernels
from .rules import (
    Emitter,
    ProgramDerivation,
    backward_code,
    describe,
    forward_code,
    needs_exact_gradient,
    tangent_code,
    unsqueezed,
)
from .stable import finite_at_zero, xexpy
from .structural import (
    CAT,
    GATHER,
    MATMUL,
    ONE_HOT,
    REDUCE,
    RESHAPE,
    SCAN,
    SLICE,
    SOFTMAX,
    TRANSPOSE,
    LogSoftmax,
    LogSumExp,
    ReduceMean,
    ReduceSum,
    reduced_dims,
)

GRAD_OUTPUT = "grad_output"
#: Steps that move or copy elements (elementwise math too): backward computes them again, keeping no more
_COPIES = (ELEMENTWISE, TRANSPOSE, SLICE, CAT, RESHAPE)
#: Steps whose rule places the gradient's elements by the result's shape at call time
_PLACING = (SLICE, CAT, RESHAPE)
#: Steps whose result may be a view of their operand
_VIEWS = (TRANSPOSE, SLICE, RESHAPE)
TANGENT = "_tangent"


@dataclass(frozen=True)
class Line:
    """A statement of generated code, run only where some tensor of ``guard`` needs its gradient (empty:
    always); ``indent`` nests it under the statement before it."""

    text: str
    guard: frozenset[int] = frozenset()
    indent: int = 0


@dataclass(frozen=True)
class ProgramPlan:
    """The code of a structured op, in pieces for the template."""

    forward: tuple[str, ...]  # forward's statements, then
    returns: tuple[str, ...]  # what it returns: the outputs, then the hidden outputs
    visible: tuple[str, ...]  # the outputs' values
    hidden: tuple[str, ...]  # intermediates and masks forward returns for backward
    masks: tuple[str, ...]  # those of the hidden outputs that are bool masks
    mask_reads: tuple[tuple[str, tuple[str, ...]], ...]  # each mask and the values its condition reads
    saved: tuple[str, ...]  # what setup_context saves for backward, in order
    saved_notes: tuple[str, ...]  # why, one line each
    upstream: tuple[str, ...]  # backward's gradient parameters, one per returned value
    backward: tuple[Line, ...]
    grads: tuple[str, ...]  # backward's results, one per tensor argument
    shapes: tuple[str, ...]  # tensor arguments whose shapes backward reads (ctx.<name>_shape)
    backward_scalars: tuple[str, ...]
    jvp: tuple[str, ...]  # jvp's statements (the forward recomputed, with tangents)
    jvp_returns: tuple[str, ...]
    jvp_scalars: tuple[str, ...]
    imports: tuple[str, ...]
    helpers: tuple[str, ...]  # the module's own functions the code calls (fused code's printing.NEG_ABS)
    # the example shape of each tensor backward takes (saved values, upstream gradients), for stage 6b
    parameter_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # and the arguments whose leading dimensions each has at call time (_Planner._sources)
    parameter_sources: tuple[tuple[str, frozenset[str]], ...] = ()
    elementwise_docs: tuple[tuple[str, str], ...] = ()  # "d tmp1 / d x", formula
    rule_docs: tuple[str, ...] = ()
    # hidden outputs that carry no gradient, before the masks: a restated softmax's statistics
    constants: tuple[str, ...] = ()
    recomputed: tuple[str, ...] = ()  # values backward computes again from what it has
    # backward is one of ATen's grad * derivative kernels of a saved tensor alone (tanh_backward(grad, out)):
    # fused code runs it eagerly (plan.one_derivative_kernel)
    one_kernel: bool = False
    # backward's own backward, derived (None: autograd differentiates backward's code)
    double_backward: DoubleBackward | None = None
    # an unused output's gradient stays None and what it would pass on is skipped (several outputs); False:
    # backward fills it with zeros (a custom gradient, or a tensor the forward is flat in, reads every one)
    skips_unused: bool = False
    # fused mode's Triton kernels, where the op works row by row (:mod:`.rows`); else why it has none
    rows: RowKernels | None = None
    rows_reason: str = ""


def plan_program(
    derivation: ProgramDerivation,
    *,
    where: str,
    fused: bool = False,
    policy: str = "memory",
    custom_op: bool = False,
) -> ProgramPlan:
    """The plan of a structured program under ``policy`` (see :meth:`_Keeping._recomputed_for_memory`);
    ``custom_op``: the op is a torch.library custom op, whose outputs may not alias its inputs nor each other.
    Where it saves masks, it is planned again without a mask for any condition on values it saves anyway
    (huber's ``|d| < 1`` where it keeps ``d``), or on elementwise math of them alone (hinge's ``1 - t*x > 0``
    where it keeps ``t`` and ``x``): one byte an element less."""
    with error_context(where):
        plan = _planned(derivation, where, frozenset(), fused=fused, policy=policy, custom_op=custom_op)
        if plan.masks:
            unmasked = (frozenset(plan.saved) | frozenset(plan.recomputed)) - frozenset(plan.masks)
            unmasked = _with_math_of(unmasked, derivation.program)
            plan = _planned(derivation, where, unmasked, fused=fused, policy=policy, custom_op=custom_op)
        return plan


def _planned(derivation: ProgramDerivation, where: str, unmasked: frozenset[str], **options) -> ProgramPlan:
    """The plan, skipping what unused outputs pass on; or, where backward needs every output's gradient (a
    tensor the forward is flat in takes zeros like one), with each unused one filled with zeros."""
    try:
        return _Planner(derivation, where, unmasked, **options).plan()
    except _HiddenGradientAloneError:
        planner = _Planner(derivation, where, unmasked, **options)
        planner.hidden_alone = True
        return planner.plan()
    except _NeedsEveryGradientError:
        planner = _Planner(derivation, where, unmasked, **options)
        planner.zero_fills = True
        return planner.plan()


class _NeedsEveryGradientError(Exception):
    """Raised while planning to skip unused outputs, where backward needs every output's gradient."""


class _HiddenGradientAloneError(Exception):
    """Raised while planning to skip unused outputs, where forward returns hidden outputs: in a second
    derivative one's gradient may come alone, with no output's, so that no value's gradient is sure to be
    given (planned again so)."""


def _with_math_of(values: frozenset[str], program: Program) -> frozenset[str]:
    """``values`` and the elementwise nodes (not hoisted) computed from them and scalars alone."""
    values = set(values)
    for v in program.values:  # in order: a node after what it reads
        if v.kind == ELEMENTWISE and v.name not in program.hoisted:
            if all(r in values or program.value(r).kind == SCALAR for r in v.reads):
                values.add(v.name)
    return frozenset(values)


class _Graph:
    """What every part of planning reads of a structured program: its values by name, the tensor arguments,
    the forward's nodes and outputs, the custom gradients, which tensor arguments each value depends on
    and whose leading dimensions it has at call time, and the shapes of what its rules pass on."""

    def __init__(self, derivation: ProgramDerivation) -> None:
        self.derivation = derivation
        self.program: Program = derivation.program
        self.values = {v.name: v for v in self.program.values}
        self.tensor_args = [v.name for v in self.program.values if v.kind == TENSOR]
        self.scalars = {v.name for v in self.program.values if v.kind == SCALAR}
        # the forward's nodes; those only custom gradients read, backward computes (_recomputed_for_custom)
        forward_nodes = [v for v in self.program.values if v.name not in self.program.backward_only]
        self.nodes = [v for v in forward_nodes if v.kind not in (TENSOR, SCALAR)]
        self.visible = [o.value for o in self.program.outputs]
        self.hoisted = self.program.hoisted
        # whether some dim is counted from the front: at another rank than the example's, such a dimension
        # is another one of the example's, and the example's shapes do not say which dimensions a gradient
        # sums over (see _summed_to)
        self.positional = any(_positional(v.expr) for v in self.nodes if v.kind != ELEMENTWISE)
        self.sources = self._sources()
        # the custom gradients (the spec's gradients table): their tensors take no derived gradient
        self.custom = dict(derivation.custom)
        for name in self.tensor_args:
            if name not in self.custom and not any(name in v.reads for v in self.nodes):
                self.custom[name] = sympy.Integer(0)  # only a custom gradient reads it: the forward is flat in it
        self.depends = self.dependencies(frozenset())
        self.upstream = self.dependencies(frozenset(self.custom))
        # softmax nodes with a log_softmax of the same value along the same dimension: softmax -> log_softmax
        self.exp_of = {
            v.name: w.name
            for v in self.nodes
            if v.kind == SOFTMAX and not isinstance(v.expr, LogSoftmax)
            for w in self.nodes
            if isinstance(w.expr, LogSoftmax) and w.expr.args == v.expr.args
        }

    # -- which arguments each value depends on ----------------------------------------------------------

    def dependencies(self, custom: frozenset[str]) -> dict[str, frozenset[int]]:
        """For each value, the indices of the tensor arguments it depends on (those in ``custom``, whose
        gradient is not derived, aside)."""
        upstream: dict[str, frozenset[int]] = {}
        for v in self.program.values:
            if v.kind == TENSOR:
                # class indices (int64) take no gradient
                none = v.name in custom or v.name in self.program.integers
                upstream[v.name] = frozenset() if none else frozenset({self.tensor_args.index(v.name)})
            elif v.kind == SCALAR:
                upstream[v.name] = frozenset()
            elif v.name in self.program.integers:  # int64 indices (an argmax's): no gradient passes through
                upstream[v.name] = frozenset()
            else:
                upstream[v.name] = frozenset().union(*(upstream[r] for r in v.reads))
        return upstream

    def _sources(self) -> dict[str, frozenset[str]]:
        """For each value, the tensor arguments whose leading dimensions it has at call time (an argument
        called with more dimensions than its example's passes them on through broadcasting, reductions
        over given dims, softmaxes, transposes and products; a reduction over every dimension stops them)."""
        sources: dict[str, frozenset[str]] = {}
        for v in self.program.values:
            if v.kind == TENSOR:
                sources[v.name] = frozenset({v.name})
            elif v.kind == REDUCE and not v.expr.dims and not v.expr.keepdim:
                sources[v.name] = frozenset()
            else:
                sources[v.name] = frozenset().union(*(sources[r] for r in v.reads))
        return sources

    def outranks(self, node: str, target: str) -> bool:
        """Whether ``node`` may have leading dimensions at call time that ``target`` (which it reads) has
        not: it reads an argument that ``target`` does not, of as many dimensions as ``target`` or more (an
        argument of fewer dimensions broadcasts into it)."""
        rank = len(self.shape(target))
        return any(len(self.shape(s)) >= rank for s in self.sources[node] - self.sources[target])

    def shape(self, name: str) -> tuple[int, ...]:
        return self.values[name].shape

    def is_tensor(self, name: str) -> bool:
        return name in self.values and self.values[name].kind != SCALAR

    def trailing_aligned(self, name: str) -> bool:
        """Whether the value ``name``'s dimensions, counted from the back, are those of the tensors it is
        computed from: no reduction without keepdim removed other than leading dimensions on the way, and
        no product with a vector removed one."""
        v = self.values[name]
        if v.kind == REDUCE and not v.expr.keepdim and v.expr.dims:
            if sorted(v.expr.dims) != list(range(len(v.expr.dims))):
                return False
        if v.kind == structural.ARG_INDEX and not v.expr.keepdim and v.expr.dim != 0:
            return False
        if v.kind == MATMUL and len(v.shape) < max(len(self.shape(str(o))) for o in v.expr.operand_exprs):
            return False
        return all(self.trailing_aligned(r) for r in v.reads)

    def row_shape(self, name: str) -> tuple[int, ...]:
        """The shape of a softmax's statistics: its own, 1 along the dimension it normalizes."""
        shape = self.shape(name)
        dim = self.values[name].expr.dim % len(shape)
        return tuple(1 if d == dim else n for d, n in enumerate(shape))

    def gram(self, node: Value) -> tuple[str, bool] | None:
        """(a, whether a is the left operand) where ``node`` is ``a @ transpose(a, -1, -2)`` or
        ``transpose(a, -1, -2) @ a``, and nothing else reads the transpose; else None."""
        if node.kind != MATMUL:
            return None
        left, right = (str(o) for o in node.expr.operand_exprs)
        for a, t, first in ((left, right, True), (right, left, False)):
            value = self.values[t]
            if value.kind != TRANSPOSE or str(value.expr.args[0]) != a or t in self.visible:
                continue
            if sorted(value.expr.dims) != [-2, -1]:  # as written: the last two at every rank
                continue
            if [c.name for c in self.program.consumers(t)] == [node.name]:
                return a, first
        return None

    def follows_arguments(self, name: str) -> bool:
        """Whether the value ``name`` is a tensor argument or elementwise math of one (through elementwise
        nodes only): as large at call time as the arguments it is given, whatever the example's shapes."""
        value = self.values.get(name)
        if value is None or value.kind not in (TENSOR, ELEMENTWISE):
            return False
        return value.kind == TENSOR or any(self.follows_arguments(r) for r in value.reads)

    def reads_arguments(self, name: str) -> bool:
        """Whether the value ``name`` reads a tensor argument (not only reductions' results)."""
        return any(self.values[r].kind == TENSOR for r in self.values[name].reads)

    def custom_shape(self, name: str, shapes: dict[str, tuple[int, ...]], where: str) -> tuple[int, ...]:
        """The example shape of the custom gradient of ``name`` (of the tensors ``shapes``, by name): refused
        where those do not broadcast together, or the result not to ``name``'s shape."""
        want = self.shape(name)
        try:
            have = _broadcast_checked(list(shapes.values()))
        except ValueError:
            listed = ", ".join(f"{n} {list(shape)}" for n, shape in sorted(shapes.items()))
            raise ExpressionError(
                f"the gradient of {name!r} combines tensors whose shapes do not broadcast together: {listed}",
                where=where,
                hint="grad has the output's shape (a reduced output's with its reduced dimensions as 1); "
                "keepdim=True keeps a reduced dimension as 1",
            ) from None
        try:
            _broadcast_checked([have, want])
        except ValueError:
            raise ExpressionError(
                f"the gradient of {name!r} has shape {list(have)}, which does not broadcast to the shape of {name!r}, "
                f"{list(want)}",
                where=where,
                hint="a gradient has its tensor's shape, or one that broadcasts to it (it is summed back over the "
                "broadcast dimensions); keepdim=True keeps a reduced dimension as 1",
            ) from None
        return have

    def rule_shape(self, node: Value, operand: int, g_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The example shape of the gradient a structural node passes to an operand."""
        call = node.expr
        x = str(call.operand_exprs[0])
        if node.kind == REDUCE:
            x_shape = self.shape(x)
            dims = reduced_dims(call, x_shape)
            if isinstance(call, (ReduceSum, ReduceMean)):
                if call.keepdim or not call.dims:
                    return g_shape  # as it is: it broadcasts over the reduced dimensions
                # g broadcasts to the result: as many dimensions as it, then a 1 at each reduced one
                ones = iter((1,) * (len(node.shape) - len(g_shape)) + tuple(g_shape))
                return tuple(1 if i in dims else next(ones) for i in range(len(x_shape)))
            return x_shape
        if node.kind in (SOFTMAX, SCAN):
            return broadcast([self.shape(x), g_shape])
        if node.kind == GATHER:
            return self.shape(x)
        if node.kind == TRANSPOSE:
            d0, d1 = call.dims
            padded = (1,) * (len(node.shape) - len(g_shape)) + tuple(g_shape)
            swapped = list(padded)
            swapped[d0], swapped[d1] = padded[d1], padded[d0]
            return tuple(swapped)
        # a product sums each operand's gradient back to its shape; a slice and cat give it exactly (rules)
        assert node.kind in (MATMUL, SLICE, CAT, RESHAPE)
        return self.shape(str(call.operand_exprs[operand]))


class _Writer:
    """What every part of a structured op's code shares: the program's facts, the choices made so far (masks,
    values recomputed or restated) and the printing of sympy into torch code under them."""

    def __init__(
        self,
        derivation: ProgramDerivation,
        where: str,
        unmasked: frozenset[str] = frozenset(),
        *,
        fused: bool = False,
        policy: str = "memory",
        custom_op: bool = False,
    ) -> None:
        self.graph = graph = _Graph(derivation)
        self.policy = policy
        self.fused = fused  # the code runs through torch.compile
        self.custom_op = custom_op  # a torch.library custom op: what forward returns is a tensor of its own
        self.unmasked = unmasked  # values backward has anyway: conditions on them need no mask
        self.for_memory: set[str] = set()  # values recomputed under the policy "memory" (from _Keeping)
        self.restated: dict[str, tuple[str, str]] = {}  # softmax -> (its maximum, its log-sum), per row (likewise)
        self.where = where
        self.zero_summed: set[str] = set()  # values some of whose gradient's shares sum to zero (not computed)
        self.imports: set[str] = set()
        self.helpers: set[str] = set()  # the module's own functions the code calls (fused code's NEG_ABS)
        self.custom_reads: set[str] = set()  # values custom gradients read that depend on a tensor they are given for
        self.masks: dict[sympy.Basic, str] = {}  # condition -> mask name
        self.argument_masks: dict[str, frozenset[sympy.Basic]] = {}  # node -> the conditions on arguments masked
        self.kernel_alone: str | None = None  # an elementwise node's gradient code, where one kernel alone
        # names code may not take for a temporary: the values, their gradients and what backward takes
        self.taken = {*graph.values, *(f"grad_{n}" for n in graph.values), GRAD_OUTPUT, "ctx", "torch", "math"}
        # whose dtype a one_hot takes: the first floating-point argument's in forward and jvp, a saved
        # tensor's in backward (which may not have that argument)
        floats = [n for n in graph.tensor_args if n not in graph.program.integers]
        self.one_hot_dtype = f"{floats[0]}.dtype" if floats else "torch.get_default_dtype()"
        self.taken |= {f"{n}_shape" for n in graph.values} | {f"mask{k}" for k in range(64)} | {"mask", "grads"}
        self.named = frozenset(self.taken)  # the names every function of the module may not take

    def partials(self, v: Value) -> dict[str, sympy.Expr]:
        """The elementwise node ``v``'s partial derivatives as backward multiplies by them, by read: a hoisted
        part's in terms of its own value, which backward has (``-rsqrt**3/2``); an output's in terms of
        itself where that reads none of the tensors they read, and no more elements (tanh's, sigmoid's and
        exp's, as a hand-written Function saves its output: the derivative kernel of one saved tensor, not
        the forward computed again). Under "memory" only where those tensors are arguments, which backward
        would keep: a product or softmax it reads is computed again there, not kept (matvec's ``tanh(w @ x)``
        keeps ``w`` and ``x`` alone)."""
        graph = self.graph
        node = graph.derivation.node(v.name)
        partials = dict(node.partials)
        own = sympy.Symbol(v.name, real=True)
        if v.name in graph.hoisted:
            return {read: _in_terms_of(p, v.expr, own) for read, p in partials.items()}
        if v.name not in graph.visible:
            return partials
        written = {read: _in_terms_of(p, node.forward, own) for read, p in partials.items()}
        operands = {s.name for p in partials.values() for s in p.free_symbols if graph.is_tensor(s.name)}
        remaining = {s.name for p in written.values() for s in p.free_symbols if graph.is_tensor(s.name)}
        if not operands or remaining != {v.name}:
            return partials
        if self.policy == "memory" and any(graph.values[o].kind != TENSOR for o in operands):
            return partials
        return written if _elements(v.shape) <= sum(_elements(graph.shape(o)) for o in operands) else partials

    # -- printing ----------------------------------------------------------------------------------------

    def print(
        self,
        expr: sympy.Basic,
        extra: set[str] = frozenset(),
        bools: set[str] = frozenset(),
        finite: set[str] = (),
        forward: bool = False,
    ) -> str:
        """``expr`` as torch code; ``extra``: tensors besides the program's values (gradients, temporaries),
        ``finite``: those of them known to be finite (a step multiplies them as a mask, printing.is_finite);
        ``forward``: forward's code, where a case distinction between numbers takes its dtype from the first
        float argument (a temporary may hold a count of int64 or a condition)."""
        tensors = {n for n in self.graph.values if self.graph.is_tensor(n)} | set(extra) | set(self.masks.values())
        # the int64 and bool arguments are no float tensor a case distinction may take its dtype from
        bools = set(bools) | set(self.masks.values()) | self.graph.program.integers
        anchor = min(set(extra) - bools, default=GRAD_OUTPUT)  # a float tensor: new_tensor takes its dtype
        if forward or anchor not in tensors:  # no upstream gradient: the first float argument
            anchor = next((n for n in self.graph.tensor_args if n not in bools), anchor)
        finite = set(finite) | set(self.graph.tensor_args) | bools
        # x * exp(y) that is 0 where x is, not 0 * inf = nan (the form the elementwise plan lowers it to)
        expr = expr.replace(
            lambda node: isinstance(node, xexpy),
            lambda node: node.args[0] * finite_at_zero(sympy.exp(node.args[1]), node.args[0]),
        )
        printed = print_torch(expr, tensors, where=self.where, bools=bools, anchor=anchor, finite=finite)
        self.imports |= printed.imports
        self.helpers |= printed.helpers
        return printed.text

    def _parameters(self, saved, grad_names, hidden_values) -> list[tuple[str, str]]:
        """What backward takes, each with the value whose shape it has: the saved values, the restated
        softmaxes' statistics, the outputs' gradients and the hidden outputs'."""
        parameters = [(n, n) for n in saved if n in self.graph.values]
        parameters += [(stat, v) for v, stats in self.restated.items() for stat in stats]
        return (
            parameters
            + [(grad_names[v], v) for v in self.graph.visible]
            + [(returned_grad(h), h) for h in hidden_values]
        )

    def _temporary(self) -> str:
        return _fresh(self.taken)

    # -- masks -------------------------------------------------------------------------------------------

    def _masked(self, partial: sympy.Expr, node: str) -> sympy.Expr:
        """``partial`` (of the node ``node``) with each condition on an intermediate read from a bool mask
        forward saves, and each on tensor arguments alone that the cost model chose to mask for the node
        (:func:`_argument_masks`: relu's ``x > 0`` under "memory", as plan.make_plan keeps it)."""
        tensors = {n for n, v in self.graph.values.items() if v.kind != SCALAR}
        if node not in self.argument_masks:
            self.argument_masks[node] = _argument_masks(
                self.graph, node, self.unmasked, self.taken, self.policy, self.fused
            )
        chosen = self.argument_masks[node]

        def maskable(condition: sympy.Basic) -> bool:
            read = {s.name for s in condition.free_symbols} & tensors
            if not read or read <= self.unmasked:
                return False
            return condition in chosen or any(self.graph.values[n].kind != TENSOR for n in read)

        def mask_of(condition: sympy.Basic) -> sympy.Symbol:
            if condition not in self.masks:
                taken = {*self.graph.values, *self.masks.values()}
                names = (f"mask{k}" if k else "mask" for k in itertools.count())
                self.masks[condition] = next(n for n in names if n not in taken)
            return sympy.Symbol(self.masks[condition])

        def replace(node: sympy.Basic) -> sympy.Basic:
            if isinstance(node, sympy.Heaviside):
                if node.args[1] in (0, 1) and (maskable(step_relational(node)) or cost.step_condition(node) in chosen):
                    return sympy.Piecewise((1, mask_of(step_relational(node))), (0, True))
                return node
            pairs = [
                (p.expr, mask_of(p.cond) if p.cond is not sympy.true and maskable(p.cond) else p.cond)
                for p in node.args
            ]
            return sympy.Piecewise(*pairs)

        return partial.replace(lambda n: isinstance(n, (sympy.Piecewise, sympy.Heaviside)), replace)

    def _printed(self, backward: list[Line]) -> dict:
        """What the printed code needs of the module, its imports and its own functions (fused code's
        ``_neg_abs``, which the template defines), and whether ``backward`` is one ATen kernel alone."""
        return {
            "imports": tuple(IMPORTS[a] for a in sorted(self.imports)),
            "helpers": tuple(sorted(self.helpers)),
            "one_kernel": self._one_kernel(backward),
        }

    def _one_kernel(self, backward: list[Line]) -> bool:
        """Whether ``backward`` is one gradient, one of ATen's derivative kernels of a saved tensor (an
        output's: tanh's, sigmoid's) alone."""
        if len(self.graph.nodes) != 1 or self.kernel_alone is None or len(self.graph.tensor_args) != 1:
            return False
        return [line.text for line in backward] == [f"grad_{self.graph.tensor_args[0]} = {self.kernel_alone}"]


class _ForwardWriter(_Writer):
    """forward's code and forward mode's (jvp): each value from what it reads, as written or (an elementwise
    step) through the elementwise plan's straight-line code."""

    def forward_expr(self, v: Value, copy: bool = False) -> str:
        """The code computing ``v`` from what it reads, as forward computes it and as backward and jvp
        compute again; ``copy``: a tensor of its own where it may be another value or a view of one (a custom
        op's output)."""
        if v.kind == ELEMENTWISE:
            return self._unaliased(self.print(self.graph.derivation.node(v.name).forward, forward=True), copy)
        operands = [str(o) for o in v.expr.operand_exprs]
        code = forward_code(v.expr, operands, self.one_hot_dtype)
        return f"{code}.clone()" if copy and v.kind in _VIEWS else code

    def forward_statements(self, v: Value, taken: set[str], copy: bool = False, forward: bool = True) -> list[str]:
        """``v = ...`` and, for an elementwise node, the steps it shares first: its formula lowered to the
        forms the elementwise plan computes (mish from one sigmoid, a guarded branch; in fused code a sigmoid
        pair from one exponential, softplus from an exp and a log) and its repeated subexpressions computed
        once (:func:`.plan.straight_line`), in temporaries not in ``taken`` (which gains them); ``copy`` as
        :meth:`forward_expr`'s; ``forward``: False in backward (:meth:`print`'s)."""
        if v.kind != ELEMENTWISE:
            return [f"{v.name} = {self.forward_expr(v, copy)}"]
        formula = self.graph.derivation.node(v.name).forward
        steps, (reduced,) = straight_line([formula], taken, self.scalars, self.fused)
        taken |= {step.name for step in steps}
        temporaries, lines = set(), []  # the tensors among them: one over scalars alone is a Python number
        for step in steps:
            lines.append(f"{step.name} = {self.print(step.expr, extra=temporaries, forward=forward)}")
            if any(s.name in temporaries or self.graph.is_tensor(s.name) for s in step.expr.free_symbols):
                temporaries.add(step.name)
        code = self.print(reduced, extra=temporaries, forward=forward)
        return lines + [f"{v.name} = {self._unaliased(code, copy)}"]

    @staticmethod
    def _unaliased(code: str, copy: bool = False) -> str:
        """A value that may be another one itself (an input, or a case between values on a bool scalar) is a
        view of it: forward may not return one tensor twice, nor an input as it is; a custom op may not
        return a view of one either (``copy``): a copy."""
        if not _may_alias(code):
            return code
        return f"{_atom(code)}.clone()" if copy else f"{_atom(code)}[...]"

    @property
    def scalars(self) -> frozenset[sympy.Symbol]:
        """The non-tensor arguments' symbols, as the lowering rewrites tell them from tensors."""
        return frozenset(sympy.Symbol(n, real=True) for n in self.graph.scalars) | frozenset(
            self.graph.program.parsed.symbols[n] for n in self.graph.scalars
        )

    def _forward_lines(self, returned: frozenset[str] = frozenset()) -> list[str]:
        """forward's statements. A log_softmax and a logsumexp of the same value along the same dimension
        share their work, as torch computes each: the maximum, and the log of the sum of exponentials of the
        value shifted by it (one reduction, not two; log_probs = shifted - that, lse = maximum + that).
        In a custom op, a ``returned`` value that may be an input or another returned value, or a view of one,
        is a copy."""
        lines, shared = [], {}
        # forward's temporaries are its own (backward's may take the same names), besides the statistics kept
        taken = set(self.named) | {stat for stats in self.restated.values() for stat in stats}
        for v in self.graph.nodes:
            if v.name in self.restated:  # the statistics backward keeps, then the softmax from them
                largest, log_sum = self.restated[v.name]
                operand, dim = str(v.expr.args[0]), v.expr.dim
                shifted = _fresh(taken)
                log_probs = f"{shifted} - {log_sum}"
                lines += _log_normalizer_lines(operand, dim, largest, shifted, log_sum)
                lines.append(f"{v.name} = {log_probs if isinstance(v.expr, LogSoftmax) else f'torch.exp({log_probs})'}")
                continue
            key = _log_normalizer(v)
            partners = [w for w in self.graph.nodes if w is not v and _log_normalizer(w) == key]
            if key is None or not partners:
                # a custom op's outputs never alias; a Function's hidden output a view of an input would
                # take its gradient twice (through the view and through backward's)
                copy = (self.custom_op or v.kind in _VIEWS) and self._may_share(v, returned)
                lines += self.forward_statements(v, taken, copy)
                continue
            operand, dim = key
            if key not in shared:
                names = [_fresh(taken) for _ in range(3)]
                lines += _log_normalizer_lines(operand, dim, *names)
                shared[key] = names
            largest, shifted, log_sum = shared[key]
            if v.kind == SOFTMAX:
                lines.append(f"{v.name} = {shifted} - {log_sum}")
            else:
                lse = f"{largest} + {log_sum}"
                lines.append(f"{v.name} = {lse}" if v.expr.keepdim else f"{v.name} = ({lse}).squeeze({dim})")
        return lines

    def _may_share(self, v: Value, returned: frozenset[str]) -> bool:
        """Whether the returned value ``v`` may share its memory with an input or another returned value: an
        elementwise one that may be either itself (the printed code tells), a transpose of one."""
        if v.name not in returned or v.kind not in (ELEMENTWISE, *_VIEWS):
            return False
        operand = v.expr.operand_exprs[0] if v.kind in _VIEWS else None
        while operand is not None and operand.name not in returned:
            read = self.graph.values[operand.name]
            operand = read.expr.operand_exprs[0] if read.kind in _VIEWS else None
            if read.kind == TENSOR:
                return True
        return v.kind == ELEMENTWISE or operand is not None

    def _restated(self, name: str) -> str:
        """The recomputation of a restated softmax: from its statistics, or (where autograd records backward,
        in a second derivative) as the softmax itself, whose derivative the statistics do not carry."""
        call = self.graph.values[name].expr
        operand = str(call.args[0])
        largest, log_sum = self.restated[name]
        log_probs = f"{operand} - {largest} - {log_sum}"
        cheap = log_probs if isinstance(call, LogSoftmax) else f"torch.exp({log_probs})"
        return f"{self.forward_expr(self.graph.values[name])} if torch.is_grad_enabled() else {cheap}"

    # -- forward mode ------------------------------------------------------------------------------------

    def _jvp(self, hidden: list[str]) -> tuple[list[str], list[str], list[str]]:
        lines = []
        emitter = _Everything(self)
        # class indices have no tangent, nor has what depends on them alone (a one_hot)
        tangents = {n: n + TANGENT for n in self.graph.tensor_args if n not in self.graph.program.integers}
        taken = set(self.named) | {v.name + TANGENT for v in self.graph.program.values}
        scalars: set[str] = set()
        for v in self.graph.nodes:
            lines.append(f"{v.name} = {self.forward_expr(v)}")
            scalars |= {s.name for s in v.expr.free_symbols if s.name in self.graph.scalars}
            t = v.name + TANGENT
            if v.name in self.graph.program.integers:
                continue  # int64 indices (an argmax, an argument returned as it is): no tangent
            if v.kind == ELEMENTWISE:
                lines += self._elementwise_tangent(v, tangents, taken, scalars)
            elif not any(str(o) in tangents for o in v.expr.operand_exprs):
                continue
            else:
                operands = [tangents.get(str(o), "None") for o in v.expr.operand_exprs]
                lines.append(f"{t} = {tangent_code(v, operands, emitter)}")
            tangents[v.name] = t
        for mask, condition in ((m, c) for c, m in self.masks.items()):
            lines.append(f"{mask} = {self.print(condition)}")
        # a float output with no tangent (a one_hot of an argmax) gets zeros: torch.func.jvp refuses None for it
        # (the hidden outputs, masks among them, are non-differentiable: None)
        integers = self.graph.program.integers
        returns = [tangents.get(v, "None" if v in integers else f"torch.zeros_like({v})") for v in self.graph.visible]
        returns += [tangents.get(h, "None") for h in hidden]
        lines = _live(lines, returns)
        read = {name for line in lines for name in re.findall(r"\b\w+\b", line)}
        return lines, returns, sorted(scalars & read)

    def _elementwise_tangent(self, v: Value, tangents: dict[str, str], taken: set[str], scalars: set[str]) -> list[str]:
        """An elementwise step's tangent: each tangent it reads times the step's partial derivative in it,
        summed, the subexpressions the partials share computed once first (as the elementwise plan's jvp),
        in temporaries not in ``taken`` (which gains them); ``scalars`` gains the scalars it reads."""
        partials = dict(self.graph.derivation.node(v.name).partials)
        reads = [r for r in partials if r in tangents and partials[r] != 0]
        if not reads:  # flat in everything it reads: zeros of its value's shape, dtype and device
            return [f"{v.name}{TANGENT} = torch.zeros_like({v.name})"]
        steps, reduced = straight_line([partials[r] for r in reads], taken, self.scalars)
        taken |= {step.name for step in steps}
        extra, lines = set(tangents.values()), []  # not its own tangent: printing may anchor a tensor on it
        bools = {step.name for step in steps if isinstance(step.expr, sympy.logic.boolalg.Boolean)}
        for step in steps:  # the tensors among them: one over scalars alone is a Python number
            lines.append(f"{step.name} = {self.print(step.expr, extra=extra, bools=bools)}")
            if any(s.name in extra or self.graph.is_tensor(s.name) for s in step.expr.free_symbols):
                extra.add(step.name)
        total = sympy.Add(*[sympy.Symbol(tangents[r], real=True) * p for r, p in zip(reads, reduced)])
        scalars |= {s.name for e in (total, *(step.expr for step in steps)) for s in e.free_symbols} & set(
            self.graph.scalars
        )
        code = self.print(total, extra=extra, bools=bools)
        if code.isidentifier() and v.name in self.graph.visible:  # an input returned as it is (a view of it):
            code = f"{code}.view_as({code})"  # autograd takes a view of its tangent back, not the tangent
        return [*lines, f"{v.name}{TANGENT} = {code}"]


class _Skipping(_ForwardWriter):
    """Where an op has several outputs, the gradients that unused outputs would pass on: None, and what they
    would reach skipped (``if grad_t is not None``), so that an unused output's inf cannot meet a 0."""

    def _start_skipping(self) -> None:
        """With several outputs, an unused one's gradient is None, and so is each value's that only unused ones
        reach: what planning to skip their shares starts from (see plan_program)."""
        self.skips_unused = len(self.graph.visible) > 1 and not self.graph.custom and not self.zero_fills
        self.outputs_of = self._outputs_of()
        # a gradient reached by every output's is given (backward returns at once where none is), unless a
        # hidden output's may come alone
        self.every_output = frozenset(self.graph.visible) | ({""} if self.hidden_alone else set())
        self.guarded = False  # the lines written now run only where the node's gradient is not None
        # values whose gradient may be None so far (their shares so far all guarded), or not yet assigned
        self.maybe_none = set(self.graph.visible) if self.skips_unused else set()
        self.none_first: set[str] = set()  # values whose first share is guarded: None until one is given
        # each value's shares' example shapes, where some may be skipped (the outputs' own: their gradients)
        self.skippable = {v: {self.graph.shape(v)} for v in self.maybe_none}

    def _uneven(self, name: str) -> bool:
        """Whether ``name``'s gradient is a sum of shares of different shapes, some of which may be skipped:
        its shape at call time is then that of the shares given."""
        return len(self.skippable.get(name, ())) > 1

    def _expand_uneven(self, node: Value, grad_names, grad_shapes, lines: list[Line]) -> None:
        """``node``'s gradient expanded to its shape, where it may lack a share that the rules count on."""
        if not self._uneven(node.name):
            return
        if grad_shapes[node.name] != node.shape:  # kept smaller than node (a spread mean's): never so far
            raise _NeedsEveryGradientError
        g = grad_names[node.name]
        # (given where this runs: node's lines are under a test of it where it may be None)
        lines.append(Line(f"{g} = {g}.expand({self.emitter.shape(node.name)})", self.graph.upstream[node.name]))

    def _none_first_lines(self, grad_names) -> list[Line]:
        """None for each intermediate value's gradient whose first share may be skipped (the arguments'
        start as None in the template)."""
        names = [n for n in self.graph.values if n in self.none_first and n not in self.graph.tensor_args]
        return [Line(f"{grad_names[n]} = None", self.graph.upstream[n]) for n in names]

    def _bring(self, lines: list[Line], name: str, g: str, guard: frozenset[int], brought) -> None:
        """``name``'s gradient ``g`` brought to its shape (:func:`_bring`), under ``if g is not None`` where it
        may be None."""
        if self.skips_unused and self.outputs_of[name] != self.every_output:
            lines += self._unless_none(name, Line(f"{g} = {brought(g)}", guard), g)
        else:
            _bring(lines, g, guard, brought)

    def _unless_none(self, name: str, line: Line, g: str) -> list[Line]:
        """``line``, under ``if g is not None`` where ``name``'s gradient ``g`` may be None (only unused outputs
        may reach it)."""
        if not self.skips_unused or self.outputs_of[name] == self.every_output:
            return [line]
        return [Line(f"if {g} is not None:", line.guard), Line(line.text, line.guard, line.indent + 1)]

    def _outputs_of(self) -> dict[str, frozenset[str]]:
        """For each value, the outputs it is or feeds: its gradient is None where none of theirs is given."""
        outputs: dict[str, frozenset[str]] = {}
        for v in reversed(self.graph.program.values):
            readers = [c.name for c in self.graph.nodes if v.name in c.reads]
            own = frozenset({v.name}) if v.name in self.graph.visible else frozenset()
            outputs[v.name] = own.union(*(outputs[r] for r in readers))
        return outputs


class _Shares(_Skipping):
    """How a node's share of a value's gradient is added to it, and how each argument's gradient is brought to
    the argument's shape at call time."""

    def _argument_shapes(self, lines: list[Line], grad_names, grad_shapes) -> set[str]:
        """Each argument's gradient brought to its shape at call time (lines added to ``lines``); the
        arguments whose shapes that reads."""
        shapes_read = set()
        for name in self.graph.tensor_args:
            if name not in grad_shapes:
                continue
            have, want = grad_shapes[name], self.graph.shape(name)
            index = frozenset({self.graph.tensor_args.index(name)})
            g = grad_names[name]
            if self._uneven(name):
                # its shares have different shapes and some may be skipped: brought to its shape from any
                shapes_read.add(name)
                code = f"{g}.expand(torch.broadcast_shapes({g}.shape, {name}_shape))"
                code = f"{code}.sum_to_size({name}_shape)" if _outgrows(have, want) else f"{g}.expand({name}_shape)"
                lines += self._unless_none(name, Line(f"{g} = {code}", index), g)
                continue
            if have == want:
                # the same shape in the example; at call time an argument of as many dimensions beside it
                # may have more (a batch of inputs beside an unbatched target)
                # (a product's rule sums its operands' gradients to their shapes itself)
                if any(
                    c.kind != MATMUL and self.graph.outranks(c.name, name) for c in self.graph.program.consumers(name)
                ):
                    shapes_read.add(name)
                    self._bring(
                        lines, name, g, index, lambda code, name=name: f"{_atom(code)}.sum_to_size({name}_shape)"
                    )
                continue
            shapes_read.add(name)
            self._bring(
                lines, name, g, index, lambda code, have=have, want=want, name=name: _brought_to(code, have, want, name)
            )
        return shapes_read

    def _sums_to_zero(
        self, read: str, part: sympy.Expr, have: tuple[int, ...], summed: tuple[int, ...], shape_of
    ) -> bool:
        """Whether ``part`` (of example shape ``have``) sums to zero over the dimensions ``summed``: it is a
        multiple of ``read - x``, ``read`` being ``mean(x, dim=summed, keepdim=True)`` (a centred value sums
        to zero along the dimensions its mean was taken over: the variance's share of a LayerNorm's mean
        gradient). That sum is exactly zero in the math and a rounding error in floating point: it is not
        computed."""
        call = self.graph.values[read].expr
        if not isinstance(call, ReduceMean) or not call.keepdim or any(d >= 0 for d in call.dims):
            # dims counted from the front are other dimensions at another rank than the example's
            return False
        x = str(call.args[0])
        if self.graph.shape(x) != have or reduced_dims(call, have) != tuple(sorted(summed)):
            return False
        ratio = sympy.cancel(part / (sympy.Symbol(read, real=True) - sympy.Symbol(x, real=True)))
        for symbol in ratio.free_symbols:  # the multiple: constant along those dimensions
            shape = shape_of(symbol)
            if any(d >= 0 and shape[d] != 1 for d in _aligned(summed, shape, have)):
                return False
        return True

    def _contribute(
        self, lines, target, code, static, grad_names, grad_shapes, outer: str = "1", node: str | None = None
    ) -> None:
        """Add ``code`` (of example shape ``static``), passed on by ``node``, summed to ``target``'s shape and
        then multiplied by ``outer``, to ``target``'s gradient."""
        guard = self.graph.upstream[target]
        want = self.graph.shape(target)
        if self.graph.values[target].kind != TENSOR:
            if (
                len(static) == len(want)
                and all(w in (1, n) for n, w in zip(static, want))
                and node is not None
                and self.graph.values[node].kind != MATMUL
                and (
                    self.graph.outranks(node, target)
                    or (self.graph.values[target].kind in _PLACING and self._broadcast_later(target))
                )
            ):
                # the example's ranks agree, the shapes at call time need not: node (or a step after it)
                # may have leading dimensions that target has not; a slice, cat or reshape places g's
                # elements by its own shape
                code, static = f"{_atom(code)}.sum_to_size({self.emitter.shape(target)})", want
            elif static != want and target in self.graph.hoisted and self.graph.reads_arguments(target):
                # a part hoisted out of a formula is as large at call time as the tensor arguments it reads,
                # which may broadcast beyond the example's shapes (a parameter declared [] given per element)
                code, static = f"{_atom(code)}.sum_to_size({self.emitter.shape(target)})", want
            code, static = _summed_to(code, static, want, lambda: self.emitter.shape(target), self.graph.positional)
        if outer != "1":
            # by what the texts print as: outer * (a + b), -(a - b)
            if outer == "-1":
                code = f"-{_atom(code) if code[0] == '-' else parenthesized(code, PRODUCT)}"
            else:
                code = f"{parenthesized(outer, PRODUCT)} * {parenthesized(code, POWER)}"
        g = grad_names[target]
        if target in grad_shapes and self.graph.values[target].kind == TENSOR and grad_shapes[target] != static:
            # an argument's shares are summed to its shape once, at the end; shares of different shapes (one per
            # element beside one a hoisted part passed on, summed already) are brought to its shape at call time
            # first, each on its own, or the smaller would be added at every element of the larger
            if _outgrows(grad_shapes[target], want):
                self.emitter.shapes.add(target)
                brought = Line(f"{g} = {_brought_to(g, grad_shapes[target], want, target)}", guard)
                if target in self.maybe_none:
                    lines.append(Line(f"if {g} is not None:", guard))
                    brought = Line(brought.text, guard, 1)
                lines.append(brought)
                grad_shapes[target] = want
            if _outgrows(static, want):
                self.emitter.shapes.add(target)
                code, static = _brought_to(code, static, want, target), want
        if self.guarded or target in self.skippable:
            self.skippable.setdefault(target, set()).add(static)
        if target in grad_shapes and target in self.maybe_none:
            # its gradient may still be None: every share so far came from outputs that may be unused
            share = self._temporary()
            lines.append(Line(f"{share} = {code}", guard))
            lines.append(Line(f"{g} = {share} if {g} is None else {g} + {share}", guard))
            grad_shapes[target] = broadcast([grad_shapes[target], static])
        elif target in grad_shapes:
            total = f"{g} - {code[1:]}" if code.startswith("-") else f"{g} + {code}"
            lines.append(Line(f"{g} = {total}", guard))
            grad_shapes[target] = broadcast([grad_shapes[target], static])
        else:
            lines.append(Line(f"{g} = {code}", guard))
            grad_shapes[target] = static
            if self.guarded:
                self.maybe_none.add(target)
                self.none_first.add(target)
        if not self.guarded:
            self.maybe_none.discard(target)


class _CustomBackward(_Shares):
    """The custom gradients' part of backward: each ``[gradients]`` formula over the values backward has and
    the upstream gradients it reads (:class:`_Planner` lays out the rest)."""

    def _custom_backward(self, lines: list[Line], grad_names, grad_shapes) -> None:
        """Each custom gradient as the spec gives it, over the values backward has and the upstream
        gradients; summed to its tensor's shape at call time, as a derived gradient is."""
        upstream, shapes, sources, aligned = self._custom_upstream(grad_names)
        for name, expr in self.graph.custom.items():
            where = self.where.replace(": forward", f": gradients.{name}")
            expr = expr.xreplace(upstream)
            self.emitter.request_symbols(expr)
            read = sorted(
                s.name for s in expr.free_symbols if s.name in self.graph.values and self.graph.is_tensor(s.name)
            )
            computed = [r for r in read if r not in self.graph.tensor_args]
            self.custom_reads |= {
                r
                for r in computed
                if self.graph.depends[r] != self.graph.upstream[r] or r in self.graph.program.backward_only
            }
            grads = [s.name for s in expr.free_symbols if s.name in shapes]
            named = {r: self.graph.shape(r) for r in read} | {str(_grad_of(g, upstream)): shapes[g] for g in grads}
            have = self.graph.custom_shape(name, named, where)
            for grad in grads:
                if len(shapes[grad]) < len(have) and not self.graph.trailing_aligned(aligned[grad]):
                    raise ExpressionError(
                        f"grad (shape {list(shapes[grad])}) has fewer dimensions than the gradient of {name!r} "
                        f"(shape {list(have)}), and broadcasting aligns its last dimensions with dimensions the "
                        "forward reduced away",
                        where=where,
                        hint="make the reduction the forward's last step, or keep its dimensions with keepdim=True",
                    )
            index = frozenset({self.graph.tensor_args.index(name)})
            code = self.print(expr, extra=set(shapes))
            want = self.graph.shape(name)
            if not read and not grads:  # a number: a tensor of it, of the tensor's shape
                self.emitter.shapes.add(name)
                anchor = grad_names[self.graph.visible[0]]
                code = f"{anchor}.new_zeros({name}_shape)" if expr == 0 else f"{anchor}.new_full({name}_shape, {code})"
                have = want
            calls = frozenset().union(*(self.graph.sources[r] for r in read), *(sources[g] for g in grads))
            if have == want and any(len(self.graph.shape(a)) >= len(want) for a in calls - self.graph.sources[name]):
                # the example's shapes agree, the shapes at call time need not: another argument's leading
                # dimensions
                self.emitter.shapes.add(name)
                code = f"{_atom(code)}.sum_to_size({name}_shape)"
            if name in dict(self.graph.derivation.custom):
                comment = f"{name}'s gradient is the custom one the spec gives, not the derived one"
            else:
                comment = f"only a custom gradient reads {name}: the forward is flat in it"
            lines.append(Line(f"# {comment}", index))
            lines.append(Line(f"{grad_names[name]} = {code}", index))
            grad_shapes[name] = have

    def _custom_upstream(self, grad_names) -> tuple[dict, dict, dict, dict]:
        """Each upstream gradient of a custom gradient (ParsedExpression.grads) as backward has it: an
        output's gradient, with the dimensions a reduction without keepdim removed put back as size 1 where
        the output is that reduction (so that ``grad * posterior`` spreads it over them, as the reduction's
        derivative does); with its example shape, the arguments whose leading dimensions it has and the
        value whose dimensions it has (the reduction's operand where it is spread)."""
        upstream, shapes, sources, aligned = {}, {}, {}, {}
        for symbol, output in zip(self.graph.program.parsed.grads, self.graph.visible):
            code, call, shape = (
                grad_names[output],
                spread_reduction(self.graph.program, output),
                self.graph.shape(output),
            )
            aligned[code] = output
            if call is not None:
                operand = self.graph.shape(str(call.args[0]))
                dims = reduced_dims(call, operand)
                code, shape = unsqueezed(code, call), tuple(1 if d in dims else n for d, n in enumerate(operand))
                aligned[code] = str(call.args[0])
            upstream[symbol] = sympy.Symbol(code, real=True)
            shapes[code], sources[code] = shape, self.graph.sources[output]
        return upstream, shapes, sources, aligned


class _Planner(_CustomBackward):
    """Walks a structured program's nodes backward, writing each rule's code (stage 5c), and lays out
    forward, backward and jvp; :class:`_Keeping` decides from what backward reads what forward keeps."""

    zero_fills = False  # backward fills an unused output's gradient with zeros (see plan_program)
    hidden_alone = False  # a hidden output's gradient may come without any output's (see plan_program)

    # -- backward ------------------------------------------------------------------------------------------

    def plan(self) -> ProgramPlan:
        grad_names = {name: f"grad_{name}" for name in self.graph.values}
        if len(self.graph.visible) == 1:
            grad_names[self.graph.visible[0]] = GRAD_OUTPUT
        emitter = self.emitter = _Requests(self)
        lines: list[Line] = []
        # each gradient's example shape so far (it may broadcast)
        grad_shapes: dict[str, tuple[int, ...]] = {name: self.graph.shape(name) for name in self.graph.visible}
        partials_docs, rule_docs = [], []  # ("d tmp1 / d x", its formula); each rule's description
        hidden_grad_lines: dict[str, int] = {}

        only_returned: dict[str, int] = {}  # nodes whose gradient comes from a second derivative only
        self._start_skipping()
        for node in reversed(self.graph.nodes):
            guard = self.graph.upstream[node.name]
            targets = [r for r in node.reads if self.graph.upstream[r]]
            if guard and node.name in self.zero_summed and node.name not in grad_shapes:
                # every share of its gradient summed to zero (see _sums_to_zero): what remains is the one
                # a second derivative passes to it as a hidden output
                assert all(t in grad_shapes for t in targets), node.name  # its operand has a gradient to join
                only_returned[node.name] = len(lines)
                grad_shapes[node.name] = node.shape
            if not guard or node.name not in grad_shapes:
                continue
            # a hidden output's own gradient (in a second derivative) joins here; placed once known
            hidden_grad_lines[node.name] = len(lines)
            docs = (partials_docs, rule_docs)
            self._pass_on(node, targets, grad_names, grad_shapes, lines, docs, node.name not in only_returned)

        self._custom_backward(lines, grad_names, grad_shapes)
        self._flat_backward(lines, grad_names, grad_shapes)
        lines = _comments_with_their_code(lines)
        # what backward reads: saved, or recomputed from what is saved
        keeping = _Keeping(
            self.graph, self.policy, self.fused, self.masks, self.custom_reads, self._temporary, self.where
        )
        saved, recomputed, hidden, notes = keeping.resolve(emitter)
        self.for_memory, self.restated = keeping.for_memory, keeping.restated
        constants = [stat for stats in self.restated.values() for stat in stats]
        hidden_values = [h for h in hidden if h not in self.masks.values() and h not in constants]
        if self.skips_unused and hidden_values and not self.hidden_alone:
            raise _HiddenGradientAloneError
        upstream = [grad_names[v] for v in self.graph.visible] + [returned_grad(h) for h in hidden_values]
        lines = self._join_returned(lines, hidden_values, hidden_grad_lines, only_returned, grad_names, grad_shapes)
        shapes_read = set(emitter.shapes) | self._argument_shapes(lines, grad_names, grad_shapes)
        recompute_lines = self._backward_recompute_lines(recomputed, lines, saved, grad_names)
        forward = self._forward_lines(frozenset(self.graph.visible) | frozenset(hidden))
        forward += [f"{mask} = {self.print(condition)}" for condition, mask in self.masks.items()]
        jvp, jvp_returns, jvp_scalars = self._jvp(hidden)
        parameters = self._parameters(saved, grad_names, hidden_values)
        return ProgramPlan(
            forward=tuple(forward),
            returns=tuple(self.graph.visible) + tuple(hidden),
            visible=tuple(self.graph.visible),
            hidden=tuple(hidden),
            masks=tuple(self.masks.values()),
            mask_reads=tuple((m, tuple(sorted(s.name for s in c.free_symbols))) for c, m in self.masks.items()),
            saved=tuple(saved),
            saved_notes=tuple(notes),
            upstream=tuple(upstream),
            backward=tuple(recompute_lines + self._none_first_lines(grad_names) + lines),
            grads=tuple(grad_names[n] if n in grad_shapes else "None" for n in self.graph.tensor_args),
            shapes=tuple(n for n in self.graph.tensor_args if n in shapes_read),
            backward_scalars=tuple(sorted(emitter.scalars)),
            jvp=tuple(jvp),
            jvp_returns=tuple(jvp_returns),
            jvp_scalars=tuple(jvp_scalars),
            **self._printed(recompute_lines + lines),
            parameter_shapes=tuple(
                (p, self.graph.row_shape(v) if p in constants else self.graph.shape(v)) for p, v in parameters
            ),
            parameter_sources=tuple((p, self.graph.sources[v]) for p, v in parameters),
            elementwise_docs=tuple(partials_docs),
            rule_docs=tuple(rule_docs),
            constants=tuple(constants),
            recomputed=tuple(recomputed),
            double_backward=_SecondOrder(self).derive(saved, upstream, hidden_values),
            skips_unused=self.skips_unused,
        )

    def _pass_on(self, node, targets, grad_names, grad_shapes, lines, docs, may_skip: bool) -> None:
        """What ``node`` passes on to ``targets`` (its lines appended to ``lines``), by its partials or its
        rule; under ``if grad_node is not None`` where no output that reaches it may have been used."""
        start = len(lines)
        self.guarded = self.skips_unused and self.outputs_of[node.name] != self.every_output
        self._expand_uneven(node, grad_names, grad_shapes, lines)
        partials_docs, rule_docs = docs
        if node.kind == ELEMENTWISE:
            g = grad_names[node.name]
            self._elementwise_backward(node, targets, g, grad_names, grad_shapes, lines, self.emitter, partials_docs)
        else:
            rule_docs.append(describe(node))
            self._structural_backward(node, targets, grad_names, grad_shapes, lines)
        if self.guarded and may_skip:
            lines[start:] = _unless_none_lines(lines[start:], grad_names[node.name])
        self.guarded = False

    def _flat_backward(self, lines: list[Line], grad_names, grad_shapes) -> None:
        """A tensor argument the forward reads but no gradient reaches (``sum(sign(x))``: flat away from its
        jumps) gets zeros of its shape, as autograd gives, not None: None says the op does not depend on it."""
        anchor = grad_names[self.graph.visible[0]]
        for index, name in enumerate(self.graph.tensor_args):
            if name in grad_shapes or not self.graph.program.consumers(name) or name in self.graph.program.integers:
                continue
            if self.skips_unused:
                raise _NeedsEveryGradientError  # its zeros take their dtype and device from an output's gradient
            self.emitter.shapes.add(name)
            guard = frozenset({index})
            lines.append(Line(f"# The forward is flat in {name} (away from kinks): its gradient is zero.", guard))
            lines.append(Line(f"{grad_names[name]} = {anchor}.new_zeros({name}_shape)", guard))
            grad_shapes[name] = self.graph.shape(name)

    def _structural_backward(self, node: Value, targets: list[str], grad_names, grad_shapes, lines) -> None:
        """What a reduction, softmax, product or transpose passes on to each operand that needs it, by its
        rule (:mod:`.rules`)."""
        emitter, guard, g = self.emitter, self.graph.upstream[node.name], grad_names[node.name]
        gram = self.graph.gram(node)
        if gram is None:
            lines.append(Line(f"# {describe(node)}", guard))
        exact = g
        have = grad_shapes[node.name]
        # a rule that needs the gradient's exact shape, or its rank (a transpose of a 0-d gradient)
        if have != node.shape and (needs_exact_gradient(node.expr) or len(have) < len(node.shape)):
            exact = f"{g}.expand({emitter.shape(node.name)})"
        if gram is not None:  # one product of the sum of a's two shares, not two products
            a, first = gram
            emitter.value(a)
            both = f"({_atom(exact)} + {_atom(exact)}.mT)"
            code = f"{both} @ {a}" if first else f"{a} @ {both}"
            shares = f"g @ {a} + g^T @ {a}" if first else f"{a} @ g^T + {a} @ g"
            product = f"{node.name} = {structural.spelled(node.expr)}"
            lines.append(Line(f"# {product}: {a}'s gradient through both operands is {shares}", guard))
            self._contribute(lines, a, code, self.graph.shape(a), grad_names, grad_shapes, node=node.name)
            return
        for i, operand in enumerate(str(o) for o in node.expr.operand_exprs):
            if operand not in targets:
                continue
            code = backward_code(node, i, exact, emitter)
            lines += [Line(text, self.graph.upstream[operand]) for text in emitter.pending]
            emitter.pending.clear()
            static = self.graph.rule_shape(node, i, node.shape if exact != g else have)
            self._contribute(lines, operand, code, static, grad_names, grad_shapes, node=node.name)

    def _broadcast_later(self, name: str) -> bool:
        """Whether a step after the value ``name`` may have leading dimensions at call time that it has not,
        which the gradient then has."""
        later, after = {name}, []
        for v in self.graph.program.values:
            if v.expr is not None and set(v.reads) & later and v.name != name:
                later.add(v.name)
                after.append(v.name)
        return any(self.graph.outranks(v, name) for v in after)

    def _join_returned(
        self, lines, hidden_values, hidden_grad_lines, only_returned, grad_names, grad_shapes
    ) -> list[Line]:
        """``lines`` with each hidden output's own gradient (given in a second derivative) joined where its
        node's lines begin."""
        lines = list(lines)
        starts = sorted(hidden_grad_lines.values())  # where each node's lines begin
        for name, at in sorted(only_returned.items(), key=lambda item: -item[1]):
            assert name in hidden_values, name  # the centred value's formula reads it
            end = min((k for k in starts if k > at), default=len(lines))
            guard = self.graph.upstream[name]
            lines[at:end] = [
                Line(f"if {returned_grad(name)} is not None:  # only in a second derivative", guard),
                Line(f"{grad_names[name]} = {returned_grad(name)}", guard, 1),
                *(Line(line.text, line.guard, line.indent + 1) for line in lines[at:end]),
            ]
            hidden_grad_lines = {n: k + 2 if k > at else k for n, k in hidden_grad_lines.items()}
        for name in sorted(hidden_values, key=lambda n: -hidden_grad_lines.get(n, -1)):
            if name in hidden_grad_lines and name in grad_shapes and name not in only_returned:
                at = hidden_grad_lines[name]
                guard = self.graph.upstream[name]
                g, returned = grad_names[name], returned_grad(name)
                total = f"{g} + {returned}"
                if self.skips_unused and self.outputs_of[name] != self.every_output:
                    total = f"{returned} if {g} is None else {total}"
                lines[at:at] = [
                    Line(f"if {returned} is not None:  # only in a second derivative", guard),
                    Line(f"{g} = {total}", guard, 1),
                ]
        return lines

    def _backward_recompute_lines(self, recomputed: list[str], lines: list[Line], saved: list[str], grad_names):
        """:meth:`_recompute_lines`, a one_hot there in a saved floating-point tensor's dtype (an unused output's
        gradient may be None)."""
        floats = [n for n in saved if n in self.graph.values and n not in self.graph.program.integers]
        anchor = floats[0] if floats else grad_names[self.graph.visible[0]]
        self.one_hot_dtype, forward_dtype = f"{anchor}.dtype", self.one_hot_dtype
        try:
            return self._recompute_lines(recomputed, lines)
        finally:
            self.one_hot_dtype = forward_dtype

    def _recompute_lines(self, recomputed: list[str], lines: list[Line]) -> list[Line]:
        """backward's first lines: the values it computes again, each where some gradient reads it."""
        guards = self._recompute_guards(recomputed, lines)
        for name in recomputed:
            for s in self.graph.values[name].expr.free_symbols:
                if s.name in self.graph.scalars:
                    self.emitter.scalars.add(s.name)
        lines = []
        again = [v for v in recomputed if v in self.for_memory]
        if again:  # under the guard of the line after it, so that it never stands alone in an if-block
            comment = f'# policy "memory": {", ".join(again)} computed again, not kept from forward'
            lines.append(Line(comment, guards[recomputed[0]]))
        for v in recomputed:
            if v in self.graph.exp_of:
                lines.append(Line(f"{v} = torch.exp({self.graph.exp_of[v]})", guards[v]))
            elif v in self.restated:
                lines.append(Line(f"{v} = {self._restated(v)}", guards[v]))
            else:
                statements = self.forward_statements(self.graph.values[v], self.taken, forward=False)
                lines += [Line(line, guards[v]) for line in statements]
        return lines

    def _elementwise_backward(self, node, targets, g, grad_names, grad_shapes, lines, emitter, docs) -> None:
        """The gradient times each partial derivative, for each read; subexpressions they share (a norm's
        reciprocal square root) computed once, where some gradient that reads them is needed."""
        partials = self.partials(node)
        grad_symbol = sympy.Symbol(g, real=True)
        exprs = []
        docs += [(f"d {node.name} / d {read}", math_text(partials[read])) for read in targets]
        targets = [read for read in targets if partials[read] != 0]  # a value only a condition reads
        for read in targets:
            partial = self._masked(partials[read], node.name)
            emitter.request_symbols(partial)
            exprs.append(grad_symbol * partial)
        steps, reduced = straight_line(exprs, self.taken, self.scalars, self.fused, cheapest=True)
        temporaries = {step.name: step.expr for step in steps}
        tensors, finite = self._temporaries(steps, dict(zip(targets, reduced)), g, lines)
        if not steps and len(reduced) == 1 and derivative_kernel_alone(reduced[0], grad_symbol):
            self.kernel_alone = self.print(reduced[0], extra=tensors, finite=finite)

        conditions = {mask: condition for condition, mask in self.masks.items()}

        def shape_of(expr: sympy.Basic) -> tuple[int, ...]:
            names = _closure(expr.free_symbols, temporaries)
            names |= {s.name for n in names if n in conditions for s in conditions[n].free_symbols}  # a mask's
            shapes = [self.graph.shape(s) for s in names if s in self.graph.values and self.graph.is_tensor(s)]
            return broadcast(shapes + ([grad_shapes[node.name]] if g in names else []))

        for read, expr in zip(targets, reduced):
            have, want = shape_of(expr), self.graph.shape(read)
            if self.graph.positional:
                # dims counted from the front: which dimensions of node the gradient runs along at call time
                # is not the example's, so it is spread over node's whole shape there (a view), unless node's
                # gradient or a value of node's shape and leading dimensions is among its factors, and then
                # summed to read's shape (_contribute)
                names = _closure(expr.free_symbols, temporaries)
                full = (g in names and grad_shapes[node.name] == node.shape) or any(
                    n in self.graph.values
                    and self.graph.is_tensor(n)
                    and self.graph.shape(n) == node.shape
                    and not self.graph.outranks(node.name, n)
                    for n in names
                )
                code = self.print(expr, extra=tensors, finite=finite)
                if not full:
                    code, have = f"{_atom(code)}.expand({emitter.shape(node.name)})", node.shape
                self._contribute(lines, read, code, have, grad_names, grad_shapes, node=node.name)
                continue
            # node's gradient may be kept at a smaller shape than node (a mean's spread gradient, one value a
            # row); where neither it nor read runs along a dimension node runs along, read takes one share
            # from each of node's elements there: as many as the dimension is long
            copies = [
                f"{emitter.shape(node.name)}[{d}]"
                for d in range(-len(node.shape), 0)
                if node.shape[d] > 1 and _size_at(have, d) == 1 and _size_at(want, d) == 1
            ]
            outer = sympy.S.One
            if self.graph.values[read].kind != TENSOR and have != want:
                # factors constant along the dimensions summed over multiply the sum, not each term
                factors = sympy.Mul.make_args(expr)
                summed = _summed_dims(have, want)
                constant = _constant_factors(factors, summed, have, shape_of, temporaries, self.graph)
                if constant and len(constant) < len(factors):
                    outer = sympy.Mul(*constant)
                    expr = sympy.Mul(*[f for f in factors if f not in constant])
                if self._sums_to_zero(read, expr.xreplace(_resolved(temporaries)), have, summed, shape_of):
                    self.zero_summed.add(read)
                    continue
            code = self.print(expr, extra=tensors, finite=finite)
            if copies:
                negated = code.startswith("-") and code[1:].isidentifier()
                code = f"{'-' if negated else ''}{_atom(code[1:] if negated else code)} * {' * '.join(copies)}"
            outer = self.print(outer, extra=tensors, finite=finite)
            self._contribute(lines, read, code, have, grad_names, grad_shapes, outer=outer, node=node.name)

    def _temporaries(
        self, steps: tuple[Step, ...], reduced: dict[str, sympy.Expr], g: str, lines: list[Line]
    ) -> tuple[set[str], set[str]]:
        """Backward's lines for the temporaries ``steps`` that the gradients ``reduced`` (by read) share, each
        where some gradient that reads it is needed; the tensors among them (with ``g`` and the masks), and
        those known finite (printing.is_finite), which a step may multiply as a mask."""
        temporaries = {step.name: step.expr for step in steps}
        tensors = {g} | set(self.masks.values())
        finite = {g, *self.graph.tensor_args, *self.masks.values()}
        for step in steps:
            self.taken.add(step.name)
            users = [r for r, e in reduced.items() if step.name in _closure(e.free_symbols, temporaries)]
            guard = frozenset().union(*(self.graph.upstream[r] for r in users))
            if any(s.name in tensors or self.graph.is_tensor(s.name) for s in step.expr.free_symbols):
                tensors.add(step.name)
            lines.append(Line(f"{step.name} = {self.print(step.expr, extra=tensors, finite=finite)}", guard))
            if is_finite(step.expr, finite, tensors | {n for n in self.graph.values if self.graph.is_tensor(n)}):
                finite.add(step.name)
        return tensors, finite

    def _recompute_guards(self, recomputed: list[str], lines: list[Line]) -> dict[str, frozenset[int]]:
        """Where each recomputed value is needed: the tensors whose gradients read it (an empty guard,
        always, where some line that reads it runs always)."""
        guards: dict[str, frozenset[int]] = {}
        for name in reversed(recomputed):
            readers = [line.guard for line in lines if re.search(rf"\b{name}\b", line.text.split("#")[0])]
            # and the recomputed values computed from it: what it reads, or a softmax as exp of its log_softmax
            made = [r for r in guards if name in self.graph.values[r].reads or self.graph.exp_of.get(r) == name]
            readers += [guards[r] for r in made]
            if readers and all(readers):
                guards[name] = frozenset().union(*readers)
            else:
                guards[name] = frozenset()
        return guards


class _SecondOrder:
    """Backward's own backward, derived (:mod:`.double_backward`), from what the planner chose for backward."""

    def __init__(self, planner: _Planner) -> None:
        self.planner = planner

    def derive(self, saved: list[str], upstream: list[str], hidden: list[str]) -> DoubleBackward | None:
        """Backward's own backward (:mod:`.double_backward`), where every node is elementwise: each
        argument's gradient is then elementwise math in the upstream gradients (``upstream``, of the outputs
        and then of the ``hidden`` outputs) and the ``saved`` tensors. None (autograd differentiates
        backward's code) where a node reduces, normalizes or multiplies matrices, and where the spec gives
        custom gradients. In fused mode too, as the elementwise plan does: the derived backward's Function
        runs the compiled gradients as its forward."""
        planner = self.planner
        graph = planner.graph
        if graph.derivation.custom or planner.zero_summed or any(v.kind != ELEMENTWISE for v in graph.nodes):
            return None
        grads = [sympy.Symbol(g, real=True) for g in upstream]
        seeds: dict[str, list[sympy.Symbol]] = {}
        for value, g in zip([*graph.visible, *hidden], grads):
            seeds.setdefault(value, []).append(g)
        nodes = self._chain_rule_nodes(set(seeds))
        if nodes is None:
            return None
        parts = composed_gradients(nodes, seeds, graph.tensor_args, set(saved))
        read = {s.name for terms in parts for p in terms for s in p.free_symbols}
        if not read <= {*upstream, *saved, *planner.emitter.scalars}:
            return None  # a value backward does not have (never so far: a safeguard)
        masks = {sympy.Symbol(m) for m in planner.masks.values()}
        tensors = [sympy.Symbol(n, real=True) for n in saved if n not in planner.masks.values()]
        every = frozenset(sympy.Symbol(n, real=True) for n in graph.values if graph.is_tensor(n)) | {*grads, *masks}
        share = functools.partial(_share, scalars=planner.scalars)
        taken = planner.named | set(upstream) | set(saved)
        return derive_double_backward(parts, graph.tensor_args, [*grads, *tensors], every, taken, planner.where, share)

    def _chain_rule_nodes(self, reached: set[str]) -> list[Node] | None:
        """The nodes as backward multiplies by their partials (:meth:`_Writer.partials`, conditions read from
        masks), for the values some gradient reaches from ``reached``; None where that would need a mask
        backward does not read."""
        planner = self.planner
        graph, masks, nodes = planner.graph, dict(planner.masks), []
        for v in reversed(graph.nodes):
            node = graph.derivation.node(v.name)
            partials = planner.partials(v)
            wanted = [r for r in v.reads if v.name in reached and graph.upstream[r] and partials[r] != 0]
            reached |= set(wanted)
            masked = tuple((r, planner._masked(partials[r], v.name)) for r in wanted)
            nodes.insert(0, Node(v.name, node.forward, masked))
        if planner.masks != masks:
            planner.masks = masks
            return None
        return nodes


class _Keeping:
    """What backward keeps from forward and what it computes again, under the policy (stage 5's cost model
    for a structured program): from the values backward's code reads, once the planner has walked it."""

    def __init__(
        self,
        graph: _Graph,
        policy: str,
        fused: bool,
        masks: dict[sympy.Basic, str],
        custom_reads: set[str],
        temporary: Callable[[], str],
        where: str,
    ) -> None:
        self.graph = graph
        self.policy = policy  # "memory": products and softmaxes recomputed where that keeps fewer bytes
        self.fused = fused  # the code runs through torch.compile: see _restatable
        self.masks = masks
        self.custom_reads = custom_reads  # values custom gradients read that depend on a tensor they are given for
        self.temporary = temporary
        self.where = where
        self.for_memory: set[str] = set()  # values recomputed under the policy "memory"
        self.restated: dict[str, tuple[str, str]] = {}  # softmax -> (its maximum, its log-sum), per row

    def resolve(self, emitter: _Requests) -> tuple[list[str], list[str], list[str], list[str]]:
        """From the values backward reads: what is saved, what is recomputed (in order), the hidden
        outputs, and a note on each saved tensor."""
        wanted = set(emitter.values)
        # an elementwise intermediate of several inputs that backward reads instead of them (input - target)
        # is kept where that saves bytes: the inputs themselves are not read
        kept = {
            name
            for name in wanted
            if self.graph.values[name].kind == ELEMENTWISE
            and name not in self.graph.visible
            and len(arguments := [r for r in self.graph.values[name].reads if self.graph.values[r].kind == TENSOR]) >= 2
            and not set(arguments) & wanted
            and sum(_elements(self.graph.shape(r)) for r in arguments) > _elements(self.graph.shape(name))
        }
        recomputed: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name in sorted(wanted):  # sorted: the same temporaries in every process
                v = self.graph.values[name]
                if name in recomputed or v.kind in (TENSOR, SCALAR) or name in self.graph.visible:
                    continue
                if name in self.graph.exp_of:  # a softmax beside its log_softmax: exp(log_probs), not a tensor more
                    recomputed.add(name)
                    changed |= self.graph.exp_of[name] not in wanted
                    wanted.add(self.graph.exp_of[name])
                elif self._restatable(v):
                    # fused: recomputed from two per-row statistics forward keeps (_restated)
                    recomputed.add(name)
                    self.restated[name] = (self.temporary(), self.temporary())
                    changed |= str(v.expr.args[0]) not in wanted
                    wanted.add(str(v.expr.args[0]))
                # a one_hot is recomputed from its int64 indices, never kept: C times their elements, in float;
                # so are indices reshaped (unsqueeze(t, -1)): a view of what is kept
                elif (
                    (v.kind in (ELEMENTWISE, TRANSPOSE, SLICE, CAT, ONE_HOT) or name in self.graph.program.integers)
                    and v.kind != structural.ARG_INDEX
                    and name not in kept
                    and name not in self.graph.hoisted
                ):
                    recomputed.add(name)
                    for s in v.expr.free_symbols:
                        if s.name in self.graph.values and s.name not in wanted:
                            wanted.add(s.name)
                            changed = True
        self._recomputed_for_custom(wanted, recomputed)
        self._recomputed_for_memory(wanted, recomputed)
        for name in list(wanted):
            if self.graph.values[name].kind == SCALAR:
                wanted.discard(name)
                emitter.scalars.add(name)
        hidden = [
            v.name
            for v in self.graph.nodes
            if v.name in wanted and v.name not in recomputed and v.name not in self.graph.visible
        ]
        # those that carry no gradient last, beside the masks: backward takes no gradient for them
        hidden += [stat for stats in self.restated.values() for stat in stats]
        hidden += list(self.masks.values())
        saved, notes = [], []
        for v in self.graph.program.values:
            if v.name in wanted and v.name not in recomputed:
                saved.append(v.name)
                notes.append(_note(v, self.graph.visible, self.graph.hoisted))
        for name, (largest, log_sum) in self.restated.items():
            saved += [largest, log_sum]
            operand = self.graph.values[name].expr.args[0]
            notes += [
                f"{largest}: the maximum of {operand} along each row of {name}, {_size(self.graph.row_shape(name))}",
                f"{log_sum}: the log of the sum of exp({operand} - {largest}) along it: backward recomputes {name} "
                "from these, not a tensor of its size kept",
            ]
        for condition, mask in self.masks.items():
            saved.append(mask)
            notes.append(f"{mask}: a bool mask, one byte an element, instead of {_mask_instead(self.graph, condition)}")
        return saved, _in_order(self.graph, recomputed), hidden, notes

    def _recomputed_for_memory(self, wanted: set[str], recomputed: set[str]) -> None:
        """Each product or softmax backward reads (not an output) is recomputed in backward under the policy
        "memory" where that needs only what backward keeps anyway (the bilinear form's ``x @ m`` from ``x``
        and ``m``, attention's probabilities from ``q`` and ``k``): the tensor is not kept between forward
        and backward, at the cost of computing it again; under "time" it is kept, as forward computed it. So
        is a part hoisted out of a formula, of arguments that backward keeps anyway (snake's ``1/a`` beside
        ``a``), where the cost model ranks that first (:func:`_recomputed_first`). A reduction's result or a
        hoisted part of one (a norm's per-row statistics) stays saved: a few elements a row, as a
        hand-written Function keeps them."""
        changed = True
        while changed:
            changed = False
            for name in [v.name for v in self.graph.nodes if v.name in wanted and v.name not in recomputed]:
                v = self.graph.values[name]
                if v.kind in (MATMUL, SOFTMAX, SCAN):
                    again = self.policy == "memory"
                else:
                    again = _recomputed_first(v, self.graph, self.policy, self.fused)
                if not again or name in self.graph.visible:
                    continue
                chain = self._recomputable(name, wanted - {name}, recomputed)
                if chain is not None:
                    self.for_memory.add(name)
                    recomputed |= chain
                    wanted |= chain | {r for c in chain for r in self.graph.values[c].reads}
                    changed = True

    def _recomputed_for_custom(self, wanted: set[str], recomputed: set[str]) -> None:
        """The values a custom gradient reads that depend on a tensor it is given for (``exp(x - out)``
        for x) are recomputed in backward from the inputs, never kept: a second derivative then
        differentiates the gradient as written, through them, as autograd of its formula does. So are
        those only custom gradients read, which forward does not compute."""
        for name in sorted(self.custom_reads - recomputed):
            kept = set(self.graph.tensor_args) | {n for n in wanted if self.graph.depends[n] == self.graph.upstream[n]}
            chain = self._recomputable(name, kept, recomputed, forced=True)
            if chain is None:
                symbol = sympy.Symbol(name, real=True)
                gradients = ", ".join(n for n, e in self.graph.custom.items() if symbol in e.free_symbols)
                raise ExpressionError(
                    f"the custom gradient reads {name}, which backward cannot compute again from the inputs",
                    where=self.where.replace(": forward", f": gradients.{gradients}"),
                    hint="write the gradient over the arguments, grad and the forward's reductions and products",
                )
            recomputed |= chain
            wanted |= chain | {r for c in chain for r in self.graph.values[c].reads}

    def _recomputable(self, name: str, kept: set[str], recomputed: set[str], forced: bool = False) -> set[str] | None:
        """The values backward computes to recompute ``name`` from ``kept`` and ``recomputed`` values (its
        own operands, and theirs, where those are products, softmaxes, transposes or elementwise math; any
        node where ``forced``), or None where it would need another tensor kept."""
        chain: set[str] = set()

        def reach(value: str) -> bool:
            v = self.graph.values[value]
            if v.kind == SCALAR or value in recomputed or value in chain or (value in kept and value != name):
                return True
            if value in self.graph.exp_of or value in self.restated or v.kind == TENSOR:
                return False
            hoisted = value in self.graph.hoisted and value != name  # (name itself: _recomputed_for_memory)
            cheap = v.kind in (*_COPIES, MATMUL, SOFTMAX, SCAN, ONE_HOT) and not hoisted
            if not forced and (not cheap or value in self.graph.visible):
                return False
            chain.add(value)
            return all(reach(r) for r in v.reads)

        return chain if reach(name) else None

    def _restatable(self, v: Value) -> bool:
        """Whether fused backward recomputes the softmax (or log_softmax) ``v`` from two statistics per row
        instead of keeping it: its operand is an input or elementwise math of inputs (recomputed in backward's
        own loop), so that fused forward writes no tensor of its size (compiled plain math keeps those two
        statistics too). Eager forward computes the softmax whole anyway: it keeps it."""
        if (
            not self.fused
            or v.kind != SOFTMAX
            or v.name in self.graph.visible
            or v.name in self.graph.program.backward_only
        ):
            return False  # (forward computes no statistics of a softmax only a custom gradient reads)

        def from_inputs(name: str) -> bool:
            value = self.graph.values[name]
            return value.kind in (TENSOR, SCALAR) or (value.kind == ELEMENTWISE and all(map(from_inputs, value.reads)))

        return from_inputs(str(v.expr.args[0]))


def _in_order(graph: _Graph, recomputed: set[str]) -> list[str]:
    """The recomputed values, each after those its recomputation reads (a softmax recomputed as
    exp(log_probs) after log_probs, which may come later in forward)."""

    def reads(name: str) -> list[str]:
        return [graph.exp_of[name]] if name in graph.exp_of else list(graph.values[name].reads)

    ordered: list[str] = []

    def visit(name: str) -> None:
        if name in recomputed and name not in ordered:
            for read in reads(name):
                visit(read)
            ordered.append(name)

    for v in graph.program.values:
        visit(v.name)
    return ordered


class _Requests(Emitter):
    """Records what backward's rules read: values, and shapes at run time."""

    def __init__(self, planner: _Planner) -> None:
        self.planner = planner
        self.values: set[str] = set()
        self.shapes: set[str] = set()  # tensor arguments whose shapes are read
        self.scalars: set[str] = set()
        self.pending: list[str] = []  # temporaries a rule asked for, to assign before its result

    def value(self, name: str) -> str:
        self.values.add(name)
        return name

    def request_symbols(self, expr: sympy.Expr) -> None:
        for s in expr.free_symbols:
            if s.name in self.planner.graph.values:
                if self.planner.graph.values[s.name].kind == SCALAR:
                    self.scalars.add(s.name)
                else:
                    self.values.add(s.name)

    def shape(self, name: str) -> str:
        """The shape of ``name`` at run time: an argument's of the same shape where elementwise steps and
        softmaxes lead to one, else the value's own (which backward then reads)."""
        argument = self._argument_of_shape(name)
        if argument is not None:
            self.shapes.add(argument)
            return f"{argument}_shape"
        v = self.planner.graph.values[name]
        if v.kind == ELEMENTWISE:
            reads = [r for r in v.reads if self.planner.graph.values[r].kind != SCALAR]
            for r in reads:
                read = self.planner.graph.values[r]
                if read.shape == v.shape and read.kind != MATMUL and not self.planner.graph.outranks(name, r):
                    return self.shape(r)
            arguments = [self._argument_of_shape(r) for r in reads]
            if len(arguments) > 1 and None not in arguments:  # their shapes broadcast at call time
                self.shapes.update(arguments)
                return f"torch.broadcast_shapes({', '.join(f'{a}_shape' for a in arguments)})"
        if v.kind == MATMUL:
            # two (batches of) matrices: their batch dimensions broadcast, then a's rows and b's columns, so
            # that backward need not have the product (policy "memory" recomputes it only where read)
            a, b = (self._argument_of_shape(str(o)) for o in v.expr.operand_exprs)
            if (
                a is not None
                and b is not None
                and min(len(self.planner.graph.shape(a)), len(self.planner.graph.shape(b))) >= 2
            ):
                self.shapes.update((a, b))
                return f"torch.broadcast_shapes({a}_shape[:-1] + (1,), {b}_shape[:-2] + (1, {b}_shape[-1]))"
        return f"{self.value(name)}.shape"

    def _argument_of_shape(self, name: str) -> str | None:
        v = self.planner.graph.values[name]
        if v.kind == TENSOR:
            return name
        if v.kind in (ELEMENTWISE, SOFTMAX, SCAN):
            for s in sorted(v.expr.free_symbols, key=lambda s: s.name):
                read = self.planner.graph.values.get(s.name)
                same = read is not None and read.shape == v.shape and read.kind != SCALAR
                if same and not self.planner.graph.outranks(name, s.name):
                    argument = self._argument_of_shape(s.name)
                    if argument is not None:
                        return argument
        return None

    def example_shape(self, name: str) -> tuple[int, ...]:
        return self.planner.graph.shape(name)

    def module(self, alias: str) -> str:
        self.planner.imports.add(alias)
        return alias

    def softmax_of(self, name: str, call) -> str | None:
        if len(call.dims) != 1:
            return None
        for v in self.planner.graph.nodes:
            if v.kind == SOFTMAX and str(v.expr.args[0]) == name and v.expr.dim == call.dims[0]:
                return self.value(v.name) if not isinstance(v.expr, LogSoftmax) else f"torch.exp({self.value(v.name)})"
        return None

    def temporary(self, code: str) -> str:
        name = self.planner._temporary()
        self.pending.append(f"{name} = {code}")
        return name


class _Everything(_Requests):
    """jvp recomputes every value: each is at hand."""

    def shape(self, name: str) -> str:
        return f"{name}.shape"


def _recomputed_first(v: Value, graph: _Graph, policy: str, fused: bool) -> bool:
    """Whether ``v`` is a part hoisted out of a formula, of tensor arguments and scalars alone, that the cost
    model (:mod:`.cost`) would compute again in backward before it keeps it from forward: under "memory"
    (its elements not kept), not under "time" (the operations of computing it again)."""
    if v.name not in graph.hoisted or v.kind != ELEMENTWISE:
        return False
    if any(graph.values[r].kind not in (TENSOR, SCALAR) for r in v.reads):
        return False  # a norm's 1/sqrt(var + eps): a few elements a row, kept as a hand-written Function does
    elements = _elements(v.shape)
    again = cost.Cost(0, cost.operations_of(v.expr, {n for n in graph.values if graph.is_tensor(n)}))
    kept = cost.Cost(elements, 0, (1 + cost.WRITE_WEIGHT) * elements)
    return cost.rank(again, policy, fused) < cost.rank(kept, policy, fused)


def _argument_masks(
    graph: _Graph, node: str, unmasked: frozenset[str], taken: set[str], policy: str, fused: bool
) -> frozenset[sympy.Basic]:
    """The conditions on tensor arguments alone that the node ``node``'s gradients read from bool masks:
    of every set of them, the one the cost model (:mod:`.cost`) ranks first under the policy, as
    plan.make_plan chooses its masks. A mask costs a pass in forward and a byte an element, the argument
    it spares four: relu's ``x > 0`` is a mask under "memory", leaky_relu's under "time" too (backward's
    ``where`` on it costs as much as on ``x > 0``), elu's under neither (backward reads x anyway), nor
    one on arguments backward has anyway (``unmasked``)."""
    upstream = sympy.Symbol(f"grad_{node}", real=True)
    exprs = [upstream * p for read, p in graph.derivation.node(node).partials if graph.upstream[read] and p != 0]
    values = {n: v.shape for n, v in graph.values.items() if v.kind != SCALAR}
    arguments = {sympy.Symbol(n, real=True) for n in graph.tensor_args}
    tensors = {sympy.Symbol(n, real=True) for n in values}
    saved = {sympy.Symbol(n, real=True) for n in unmasked}
    found = [
        c
        for c in cost.conditions(exprs, tensors)
        if (c.free_symbols & tensors) <= arguments and not (c.free_symbols & tensors) <= saved
    ]
    sizes = cost.Sizes(shapes=values, outputs={}, upstream=frozenset({upstream.name}))

    def ranked(chosen: tuple[sympy.Basic, ...]) -> tuple[float, float]:
        return cost.rank(cost.with_masks(exprs, chosen, taken, sizes)[2], policy, fused)

    return frozenset(min(cost.subsets(found), key=ranked))


def _mask_instead(graph: _Graph, condition: sympy.Basic) -> str:
    """What a mask of ``condition`` stands in for, in its note: the intermediate it reads, or the tensor
    arguments (a mask on arguments where the cost model chose one, see _argument_masks)."""
    read = sorted(s.name for s in condition.free_symbols if s.name in graph.values)
    if any(graph.values[n].kind not in (TENSOR, SCALAR) for n in read):
        return "the intermediate its condition reads"
    tensors = [n for n in read if graph.values[n].kind == TENSOR]
    return f"{' and '.join(tensors)}, which its condition reads"


def _grad_of(code: str, upstream: dict[sympy.Symbol, sympy.Symbol]) -> sympy.Symbol:
    """The upstream gradient as the spec names it (``grad``) of its code in backward."""
    return next(grad for grad, symbol in upstream.items() if symbol.name == code)


def _in_terms_of(partial: sympy.Expr, expr: sympy.Expr, value: sympy.Symbol) -> sympy.Expr:
    """``partial`` with ``expr`` written as ``value`` (a hoisted part's derivative in terms of itself:
    ``-rsqrt**3/2``), unless that divides by something ``partial`` does not: K**h's derivative h*K**(h - 1)
    would be h*stat/K, 0/0 at K = 0 where it is 0."""
    written = partial.subs(expr, value)
    return written if _divisors(written) <= _divisors(partial) else partial


def _divisors(expr: sympy.Expr) -> set[sympy.Expr]:
    """The bases ``expr`` raises to a negative power."""
    return {p.base for p in sympy.preorder_traversal(expr) if p.is_Pow and p.exp.is_negative}


def _unless_none_lines(lines: list[Line], g: str) -> list[Line]:
    """``lines`` (what a node passes on) under ``if g is not None``, ``g`` being the node's gradient, None where
    no output it reaches was used: each run of lines under one guard of their own (they are nested in it)."""
    nested: list[Line] = []
    for k, line in enumerate(lines):
        if k == 0 or line.guard != lines[k - 1].guard:
            comment = "  # None where no output it reaches was used" if not nested else ""
            nested.append(Line(f"if {g} is not None:{comment}", line.guard))
        nested.append(Line(line.text, line.guard, line.indent + 1))
    return nested


def _comments_with_their_code(lines: list[Line]) -> list[Line]:
    """``lines`` with each comment under the guard of the statement after it (a rule's comment before code
    that only some gradients need), so that no guarded block holds a comment alone."""
    result = list(lines)
    for k in range(len(result) - 2, -1, -1):
        line, after = result[k], result[k + 1]
        if line.text.startswith("#") and line.indent == after.indent:
            result[k] = Line(line.text, after.guard, line.indent)
    return result


def _constant_factors(factors, summed, have, shape_of, temporaries, graph: _Graph) -> list[sympy.Expr]:
    """The ``factors`` constant along the dimensions ``summed`` over (by the example's shapes), which multiply
    the sum rather than each term; not one that reads a tensor argument elementwise
    (:meth:`_Graph.follows_arguments`): that may be larger at call time than in the example (a parameter
    declared [] given per element), and the sum would take it once for all its elements."""
    return [
        f
        for f in factors
        if all(d < 0 or shape_of(f)[d] == 1 for d in _aligned(summed, shape_of(f), have))
        and not any(graph.follows_arguments(n) for n in _closure(f.free_symbols, temporaries))
    ]


def _closure(symbols, temporaries: dict[str, sympy.Expr]) -> set[str]:
    """The names ``symbols`` read, through the temporaries they name."""
    names: set[str] = set()
    pending = [s.name for s in symbols]
    while pending:
        name = pending.pop()
        if name in names:
            continue
        names.add(name)
        if name in temporaries:
            pending += [s.name for s in temporaries[name].free_symbols]
    return names


def _size_at(shape: tuple[int, ...], dim: int) -> int:
    """``shape``'s size at ``dim`` (negative, counted from the end); 1 where it has no such dimension."""
    return shape[dim] if -dim <= len(shape) else 1


def _resolved(temporaries: dict[str, sympy.Expr]) -> dict[sympy.Symbol, sympy.Expr]:
    """Each temporary's symbol -> its expression over values (temporaries read earlier ones)."""
    resolved: dict[sympy.Symbol, sympy.Expr] = {}
    for name, expr in temporaries.items():
        resolved[sympy.Symbol(name, real=True)] = expr.xreplace(resolved)
    return resolved


def _fresh(taken: set[str]) -> str:
    """The first temporary name ``tmpK`` not in ``taken``, which gains it."""
    name = next(f"tmp{k}" for k in range(10**6) if f"tmp{k}" not in taken)
    taken.add(name)
    return name


def returned_grad(hidden: str) -> str:
    """backward's parameter for the gradient of a hidden output (not None only in a second derivative)."""
    return f"grad_{hidden}_returned"


def _transposed_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (*shape[:-2], shape[-1], shape[-2])


def _summed_to(
    code: str, have: tuple[int, ...], want: tuple[int, ...], shape, positional: bool
) -> tuple[str, tuple[int, ...]]:
    """``code`` (of example shape ``have``) summed over the dimensions it has beyond ``want``: leading
    ones, and those where ``want`` is 1 (kept). Where ``have`` is 1 and ``want`` not, it stays 1: it
    broadcasts.

    Where the dimensions summed depend on the rank at call time (leading ones, every one, or any where the
    program counts dims from the front), it is summed to the target's shape at call time (``shape()``, its
    code), where that takes a plain sum: every dimension of ``want`` is 1 or ``have``'s."""
    lead = len(have) - len(want)
    if have != want and lead >= 0 and all(w in (1, h) for h, w in zip(have[lead:], want)):
        if not want:
            return f"{_atom(code)}.sum()", want
        if lead or positional or all(w == 1 for w in want):
            return f"{_atom(code)}.sum_to_size({shape()})", want
    if lead > 0:
        code = f"{_atom(code)}.sum(dim={_dims(tuple(range(lead)))})"
        have = have[lead:]
    offset = len(want) - len(have)  # have aligns with want's last dimensions (it may have fewer)
    keep = tuple(d - len(have) for d, h in enumerate(have) if want[offset + d] == 1 and h > 1)
    if keep:
        code = f"{_atom(code)}.sum(dim={_dims(keep)}, keepdim=True)"
        have = tuple(1 if d - len(have) in keep else h for d, h in enumerate(have))
    return code, have


def _outgrows(have: tuple[int, ...], want: tuple[int, ...]) -> bool:
    """Whether a gradient of example shape ``have`` runs along a dimension that an argument of shape ``want``
    has not (one it must be summed over), rather than only broadcasting to it."""
    return len(have) > len(want) or any(h > w for h, w in _aligned_sizes(have, want))


def _brought_to(code: str, have: tuple[int, ...], want: tuple[int, ...], name: str) -> str:
    """``code``, a gradient of example shape ``have``, brought to the argument ``name``'s shape at call time
    (``want`` in the example): summed where it runs along more, expanded where it broadcasts, both where both."""
    smaller = len(have) < len(want) or any(h < w for h, w in _aligned_sizes(have, want))
    code = _atom(code)
    if _outgrows(have, want) and smaller:
        return f"{code}.expand(torch.broadcast_shapes({code}.shape, {name}_shape)).sum_to_size({name}_shape)"
    if _outgrows(have, want):
        return f"{code}.sum_to_size({name}_shape)"
    return f"{code}.expand({name}_shape)"


def _aligned_sizes(have: tuple[int, ...], want: tuple[int, ...]) -> list[tuple[int, int]]:
    """The sizes of ``have`` and ``want`` in the dimensions they share, aligned from the right."""
    return list(zip(have[-len(want) :], want[-len(have) :])) if have and want else []


def _summed_dims(have: tuple[int, ...], want: tuple[int, ...]) -> tuple[int, ...]:
    """The dimensions of ``have`` (counted from its front) that summing it to ``want`` removes or keeps as 1."""
    lead = len(have) - len(want)
    if lead < 0:  # have broadcasts to want's leading dimensions: none of them is summed
        return tuple(d + lead for d in _summed_dims((1,) * -lead + tuple(have), want) if d + lead >= 0)
    return tuple(range(lead)) + tuple(lead + d for d, w in enumerate(want) if w == 1 and have[lead + d] > 1)


def _aligned(dims: tuple[int, ...], shape: tuple[int, ...], full: tuple[int, ...]) -> list[int]:
    """``dims`` of ``full`` as dimensions of ``shape`` (aligned from the right; -1 where it has none)."""
    offset = len(full) - len(shape)
    return [d - offset if d >= offset else -1 for d in dims]


def _live(lines: list[str], returns: list[str]) -> list[str]:
    """The statements ``name = code`` that the returned names need, directly or through later statements
    (jvp computes each value beside its tangent; the last values, and masks, may feed no tangent)."""
    needed = {name for code in returns for name in _names(code)}
    kept = []
    for line in reversed(lines):
        name, code = line.split(" = ", 1)
        if name in needed:
            kept.append(line)
            needed |= _names(code)
    return kept[::-1]


def _names(code: str) -> set[str]:
    """The names an expression reads."""
    return {node.id for node in ast.walk(ast.parse(code, mode="eval")) if isinstance(node, ast.Name)}


def _positional(call: structural.Structural) -> bool:
    """Whether a structural call counts some dim from the front (a matrix product counts from the back)."""
    if isinstance(call, structural.Reduction):
        return any(d >= 0 for d in call.dims)
    if isinstance(call, (structural.Softmax, structural.Scan, structural.Sliced, structural.Concatenated)):
        return call.dim >= 0
    if isinstance(call, structural.Transposed):
        return any(d >= 0 for d in call.dims)
    if isinstance(call, (structural.Gather, structural.ArgIndex)):
        return call.dim >= 0
    if isinstance(call, (structural.Unsqueezed, structural.Flattened)):  # a squeeze too
        return call.dim >= 0 if isinstance(call, structural.Unsqueezed) else any(d >= 0 for d in call.dims)
    return isinstance(call, structural.Reshaped)  # its sizes count from the front


def _may_alias(code: str) -> bool:
    """Whether printed code may evaluate to one of the names it reads, not a new tensor: a name, or a
    Python case (``a if flag else b``) with a name among its branches."""

    def leaves(node: ast.expr) -> list[ast.expr]:
        return leaves(node.body) + leaves(node.orelse) if isinstance(node, ast.IfExp) else [node]

    return any(isinstance(leaf, ast.Name) for leaf in leaves(ast.parse(code, mode="eval").body))


def _bring(lines: list[Line], g: str, guard: frozenset[int], brought: Callable[[str], str]) -> None:
    """The gradient ``g`` brought to its argument's shape (``brought``: the code of that, from ``g``'s code),
    in its last assignment where that is a statement of its own under ``guard`` that nothing after it
    reads (``grad_w = (g * x).sum_to_size(w_shape)``, as a careful engineer writes it), else in a statement
    appended to ``lines`` (``g = brought(g)``, where ``brought`` reads ``g`` more than once)."""
    assigned = f"{g} = "
    read = re.compile(rf"\b{re.escape(g)}\b")
    for k in range(len(lines) - 1, -1, -1):
        line = lines[k]
        if not line.text.startswith(assigned):
            if read.search(line.text):
                break  # read (or assigned in a block) after its last statement of its own
            continue
        code = line.text[len(assigned) :]
        suffix = brought(g)[len(g) :] if brought(g).startswith(f"{g}.") else None
        if suffix and code.endswith(suffix):
            return  # brought there already (a custom gradient's own sum_to_size)
        once = len(read.findall(brought(g))) == 1
        if line.indent == 0 and line.guard == guard and "#" not in code and once:
            lines[k] = Line(assigned + brought(code), guard)
            return
        break
    lines.append(Line(assigned + brought(g), guard))


def _atom(code: str) -> str:
    """``code`` as the receiver of a method call: parenthesized unless it is a name, a call or an attribute
    (``(a * b).expand(shape)`` is one already)."""
    if code.isidentifier():
        return code
    try:
        node = ast.parse(code, mode="eval").body
    except SyntaxError:
        return f"({code})"
    return code if isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)) else f"({code})"


def _dims(dims: tuple[int, ...]) -> str:
    return str(dims[0]) if len(dims) == 1 else str(dims)


def _note(v: Value, visible: list[str], hoisted: frozenset[str]) -> str:
    if v.kind == TENSOR:
        return f"{v.name}: an input"
    if v.name in visible:
        return f"{v.name}: an output"
    what = {
        REDUCE: "a reduction's result",
        SOFTMAX: "a softmax",
        MATMUL: "a matrix product",
        SCAN: "a scan",
        structural.ARG_INDEX: "int64 indices (no gradient)",
    }.get(v.kind, "a part hoisted out of a formula" if v.name in hoisted else "read instead of the inputs it combines")
    return f"{v.name}: {what}, {_size(v.shape)}, returned by forward as a hidden output"


def _log_normalizer_lines(operand: str, dim: int, largest: str, shifted: str, log_sum: str) -> list[str]:
    """torch's stable log of a sum of exponentials along ``dim``: the maximum, ``operand`` shifted by it (at
    most 0: no exponential overflows), and the log of the sum of the shifted exponentials (at least 1)."""
    return [
        f"{largest} = {operand}.amax(dim={dim}, keepdim=True)",
        f"{shifted} = {operand} - {largest}",
        f"{log_sum} = torch.exp({shifted}).sum(dim={dim}, keepdim=True).log()",
    ]


def _log_normalizer(v: Value) -> tuple[str, int] | None:
    """(operand, dimension as written) of a log_softmax or a logsumexp over one dimension, else None: dims
    written differently (1 and -1) are different dimensions at some rank, and share nothing."""
    call = v.expr
    if isinstance(call, LogSoftmax) or (isinstance(call, LogSumExp) and len(call.dims) == 1):
        return str(call.args[0]), call.dim if v.kind == SOFTMAX else call.dims[0]
    return None


def _elements(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _size(shape: tuple[int, ...]) -> str:
    n = _elements(shape)
    return f"{n} element{'s' if n != 1 else ''} in the example"
