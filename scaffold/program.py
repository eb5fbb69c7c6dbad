"""Stage 3: the forward as a program, a small graph of named values, each with a shape.

The op's arguments are its first values (tensors with the spec's example shapes, scalars); each step of
the forward is a value computed from earlier ones by a node; the outputs are the values the op returns,
in order. An elementwise node is a sympy formula over the values it reads, its shape theirs broadcast
together; its derivative is the symbolic partial derivative (:mod:`.derivation`). A forward of elementwise
steps only is differentiated as a whole, each output with the steps before it substituted, so that sympy
simplifies across steps.

A forward that reduces, normalizes, multiplies matrices or transposes (:mod:`.structural`) is *structured*:
each such operation is lifted out into a node of its own kind, whose derivative is its rule
(:mod:`.rules`, as PyTorch's derivatives.yaml gives one per op), and the elementwise math between them
into elementwise nodes (the operand of a reduction, the formula of an output). Every node's shape is
known from the spec's example shapes; shapes that do not fit together are refused here, naming the line.

A costly part of an elementwise formula that reads only reductions' results, or values smaller than the
formula (a norm's ``1/sqrt(var + eps)``), is hoisted into a node of its own, as a loop-invariant
expression is hoisted out of a loop: computed once per row, not once per element of the broadcast result
(a compiler fusing the formula into one loop recomputes it at every element otherwise), and a value
backward can keep instead of recomputing (:mod:`.dataflow`: a hand-written LayerNorm keeps ``rstd``).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

import sympy

from . import structural
from .errors import ExpressionError
from .expression import ParsedExpression
from .functions import step_classes
from .spec import RESERVED_ARGUMENT_NAMES, RESERVED_PREFIXES, RESERVED_SUFFIXES, OpSpec
from .stable import stabilize
from .structural import Structural

#: Kinds of value: an argument of the op, or the kind of node that computes it.
TENSOR = "tensor"
SCALAR = "scalar"
ELEMENTWISE = "elementwise"


@dataclass(frozen=True)
class Value:
    """One named value of the program: an argument, or a step computed by a node of kind ``kind``."""

    name: str
    kind: str
    shape: tuple[int, ...]  # the example shape; () for a scalar argument
    expr: sympy.Expr | None = None  # a node's formula over the symbols of the values it reads
    line: int = 0  # where the forward assigns it (0: an argument, or a forward of one line)

    @property
    def reads(self) -> tuple[str, ...]:
        """The values the node reads, by name, sorted."""
        return tuple(sorted(s.name for s in self.expr.free_symbols)) if self.expr is not None else ()


@dataclass(frozen=True)
class Output:
    """A value the op returns: ``name`` ("" for a forward's unnamed last line), its formula over the
    arguments (every step substituted) and its shape."""

    name: str
    expr: sympy.Expr
    shape: tuple[int, ...]
    value: str = ""  # in a structured program, the node that computes it


@dataclass(frozen=True)
class Program:
    parsed: ParsedExpression
    values: tuple[Value, ...]  # arguments first, then the steps in order
    outputs: tuple[Output, ...]
    hoisted: frozenset[str] = frozenset()  # elementwise nodes hoisted out of formulas (see _Lifter.hoisted)
    # A structured program's custom gradients: tensor name -> what backward returns for it, over the values
    # (each reduction, softmax or product the forward computes, by its value's name) and the upstream
    # gradients (ParsedExpression.grads)
    gradients: tuple[tuple[str, sympy.Expr], ...] = ()
    # the nodes only custom gradients read (``softmax(x, dim=-1)`` in a straight-through amax's): backward
    # computes them, forward does not
    backward_only: frozenset[str] = frozenset()
    # the discrete values: int64 and bool tensor arguments (class indices, masks), which backward returns None
    # for, and the int64 indices the forward computes (an argmax, an unsqueeze of one); no gradient reaches them
    # or passes through them
    integers: frozenset[str] = frozenset()

    def value(self, name: str) -> Value:
        return next(v for v in self.values if v.name == name)

    def formula(self, name: str) -> sympy.Expr:
        """The value ``name`` over the arguments: its node's formula with the steps it reads substituted."""
        value = self.value(name)
        if value.expr is None:
            return self.parsed.symbols[name]
        return value.expr.xreplace(
            {sympy.Symbol(n, real=True): self.formula(n) for n in value.reads if n in self.steps}
        )

    @property
    def steps(self) -> tuple[str, ...]:
        """The names of the values the forward computes, in order."""
        return tuple(v.name for v in self.values if v.expr is not None)

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return self.parsed.tensor_names

    @property
    def several_outputs(self) -> bool:
        return len(self.outputs) > 1

    @property
    def structured(self) -> bool:
        """Whether some node is not elementwise (a reduction, softmax, product or transpose)."""
        return any(v.kind not in (TENSOR, SCALAR, ELEMENTWISE) for v in self.values)

    def consumers(self, name: str) -> tuple[Value, ...]:
        return tuple(v for v in self.values if name in v.reads)


def spread_reduction(program: Program, output: str) -> structural.Reduction | None:
    """The reduction whose removed dimensions a custom gradient's upstream gradient of the output value
    ``output`` has back as size 1 (``grad * posterior`` spreads it over them, as the reduction's own
    derivative does): the output's node, where it reduces given dims without keepdim; else None."""
    value = program.value(output)
    if value.kind == structural.REDUCE and not value.expr.keepdim and value.expr.dims:
        return value.expr
    return None


def broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The shape ``shapes`` broadcast to (the spec checks that its example shapes broadcast)."""
    rank = max((len(s) for s in shapes), default=0)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    return tuple(max((s[d] for s in padded), default=1) for d in range(rank))


def build_program(parsed: ParsedExpression, spec: OpSpec) -> Program:
    """The program of ``parsed``: the spec's arguments, the forward's steps and its outputs, with shapes."""
    values: list[Value] = [Value(t.name, TENSOR, tuple(t.shape)) for t in spec.tensors]
    values += [Value(s.name, SCALAR, ()) for s in spec.scalars]
    return _Lifter(parsed, spec, values).program()


class _Shapes:
    """The lifter's shape rules: each node's shape from its operands', and the index checks of one_hot and
    gather (their int64 operand's domain must hold valid indices)."""

    spec: OpSpec
    shapes: dict[str, tuple[int, ...]]
    written: dict[str, sympy.Basic]
    defaults: dict

    def shape(self, formula: sympy.Basic, written: sympy.Basic, line: int) -> tuple[int, ...]:
        self.check_integer_reads(formula, written, line)
        if isinstance(formula, (structural.OneHot, structural.Gather)):
            self.check_indices(formula, written, line)
        if isinstance(formula, Structural):
            operands = [str(o) for o in formula.operand_exprs]
            described = tuple(f"{structural.spelled(self.written[o])} (shape {list(self.shapes[o])})" for o in operands)
            try:
                at_defaults = formula.xreplace(self.defaults)
                return structural.result_shape(at_defaults, tuple(self.shapes[o] for o in operands), described)
            except structural.ShapeError as exc:
                raise ExpressionError(str(exc), where=self.at(line), hint=_SHAPE_HINT[formula.kind]) from None
        shapes = {s.name: self.shapes[s.name] for s in formula.free_symbols}
        try:
            return _broadcast_checked(list(shapes.values()))
        except ValueError:
            listed = ", ".join(f"{structural.spelled(self.written[n])} {list(s)}" for n, s in sorted(shapes.items()))
            raise ExpressionError(
                f"the shapes of {structural.spelled(written)} do not broadcast together: {listed}",
                where=self.at(line),
                hint="each dimension must have the same size or 1; keepdim=True keeps a reduced dimension as 1",
            ) from None

    def index_domain(self, formula: sympy.Basic) -> tuple[int, int] | None:
        """The indices an int64 node may hold (None: a floating-point node): an argmax or argmin over a
        dimension of size n (the example's) [0, n - 1]; a reshape, unsqueeze, squeeze or slice of int64
        indices theirs."""
        if isinstance(formula, structural.ArgIndex):
            shape = self.shapes[str(formula.args[0])]
            return 0, shape[formula.dim % len(shape)] - 1
        if isinstance(formula, (structural.Reshaping, structural.Sliced)):
            return self.index_domains.get(str(formula.args[0]))
        if isinstance(formula, sympy.Symbol):  # an int64 argument returned as it is
            return self.index_domains.get(formula.name)
        return None

    def check_integer_reads(self, formula: sympy.Basic, written: sympy.Basic, line: int) -> None:
        """Computed int64 indices (an argmax's) are read only as indices: by one_hot, as gather's index, by
        a reshape, unsqueeze, squeeze or slice (or returned as they are)."""
        if isinstance(formula, (structural.OneHot, structural.Reshaping, structural.Sliced)):
            return
        reads = formula.operand_exprs[:1] if isinstance(formula, structural.Gather) else formula.free_symbols
        if isinstance(formula, structural.ArgIndex):
            reads = formula.operand_exprs
        computed = self.index_domains.keys() - {t.name for t in self.spec.tensors}
        for read in sorted(str(r) for r in reads if str(r) in computed):
            raise ExpressionError(
                f"{structural.spelled(written)} reads {structural.spelled(self.written[read])}, int64 indices, as a "
                "number",
                where=self.at(line),
                hint=_INDEX_USES,
            )

    def _ignoring(self, domain: tuple[int, int], ignore: sympy.Expr | None) -> tuple[int, int]:
        """The indices a one_hot or gather reads from indices of ``domain`` where ``ignore`` (at its default)
        reads as 0 (:class:`structural.Indexing`): an end of the domain that is the ignored value drops."""
        if ignore is None:
            return domain
        low, high, k = *domain, int(ignore.xreplace(self.defaults))
        low, high = (low + 1, high) if k == low else (low, high - 1) if k == high else (low, high)
        return (min(low, 0), max(high, 0)) if low <= high else (0, 0)

    def check_indices(self, formula: structural.OneHot | structural.Gather, written: sympy.Basic, line: int) -> None:
        """one_hot's operand and gather's index are int64 indices (:data:`_INDEX_USES`) whose domains are valid
        indices."""
        one_hot = isinstance(formula, structural.OneHot)
        operand = str(formula.args[0] if one_hot else formula.args[1])
        if operand not in self.index_domains:
            declared = any(t.integer for t in self.spec.tensors)
            raise ExpressionError(
                f"{structural.spelled(written)}: {formula.spelling} takes an int64 tensor argument of "
                f"{'class indices' if one_hot else 'indices'}, an argmax or argmin, or a reshape or slice of those, "
                f"and {structural.spelled(self.written[operand])} is not one",
                where=self.at(line),
                hint=_INDEX_USES
                if declared
                else 'declare the indices in the spec: [tensors.t] dtype = "int64", domain = [0, C - 1]',
            )
        low, high = self._ignoring(self.index_domains[operand], formula.ignore)
        if one_hot:
            count = int(formula.classes.xreplace(self.defaults))
            if count < 1:
                raise ExpressionError(
                    f"{structural.spelled(written)}: num_classes is {count} (its default), not a positive integer",
                    where=self.at(line),
                    hint="give the int scalar a positive default",
                )
        else:
            shape = self.shapes[str(formula.args[0])]
            count = shape[structural.normalized_dim(formula.dim, len(shape), "the operand")] if shape else 1
        index = self.written[operand]  # t, unsqueeze(t, -1), argmax(z, dim=-1): its domain is declared, or not
        declared = set() if index.has(structural.ArgIndex) else {s.name for s in index.free_symbols}
        if (low < 0 or high >= count) and not declared:
            raise ExpressionError(
                f"{structural.spelled(written)}: {structural.spelled(self.written[operand])} holds indices up to "
                f"{high} (in the example), outside 0 to {count - 1}, which {formula.spelling} refuses",
                where=self.at(line),
                hint=f"an argmax or argmin over a dimension of size n gives indices 0 to n - 1: "
                f"{'num_classes' if one_hot else f'the size of dim={formula.dim}'} must be at least n",
            )
        if low < 0 or high >= count:
            where = "num_classes" if one_hot else f"the size of dim={formula.dim}"
            raise ExpressionError(
                f"{structural.spelled(written)}: the domain of {structural.spelled(index)}, [{low}, {high}], has "
                f"indices outside 0 to {count - 1}, which {formula.spelling} refuses",
                where=self.at(line),
                hint=f"declare domain = [0, {count - 1}] for {', '.join(sorted(declared))}, or raise {where}",
            )


class _Lifter(_Shapes):
    """Builds a structured program: each structural call of the outputs' formulas becomes a node (one per
    distinct call), its operands elementwise nodes where they are not values already, and each output an
    elementwise node where it is not one of those."""

    def __init__(self, parsed: ParsedExpression, spec: OpSpec, arguments: list[Value]) -> None:
        self.parsed, self.spec = parsed, spec
        self.values = list(arguments)
        self.shapes = {v.name: v.shape for v in arguments}
        self.by_expr: dict[sympy.Basic, sympy.Symbol] = {}  # a node's formula -> its value
        self.written: dict[str, sympy.Basic] = {n: s for n, s in parsed.symbols.items()}  # value -> as written
        self.taken = {*parsed.symbols, *(s.name for s in parsed.steps), *parsed.output_names}
        self.code_names: dict[str, str] = {}  # a step's or output's name -> its value's (see code_name)
        self.where = f"{spec.source}: forward"
        self.tensors = {parsed.symbols[n] for n in parsed.tensor_names}
        self.scalars = {s.name for s in spec.scalars}
        # reductions' results, and the parts hoisted from formulas (see hoisted)
        self.statistics: set[str] = set()
        # the int scalars at their defaults: the example's sizes (one_hot(t, num_classes=C))
        self.defaults = {parsed.symbols[s.name]: sympy.Integer(s.default) for s in spec.scalars if s.type == "int"}
        # each int64 value (see _Shapes.index_domain) -> the indices it may hold, both ends included
        self.index_domains: dict[str, tuple[int, int]] = {t.name: t.domain for t in spec.tensors if t.integer}

    def program(self) -> Program:
        outputs = []
        for name, written in zip(self.parsed.output_names, self.parsed.exprs):
            expr = structural.stable_forms(written)  # log(sum(exp(x))) -> logsumexp(x)
            if isinstance(expr, Structural):
                symbol = self.node(expr.with_operands(*map(self.operand, expr.operand_exprs)), name, expr, "out")
            else:
                lifted = self.lift(expr)
                fresh = lifted.is_Symbol and lifted.name not in self.parsed.symbols
                symbol = lifted if fresh else self.node(self.combined(lifted, output=True), name, expr, "out")
            outputs.append(Output(name, written, self.shapes[symbol.name], symbol.name))
        if len({o.value for o in outputs}) < len(outputs):
            twins = [o.name for o in outputs if sum(p.value == o.value for p in outputs) > 1]
            raise ExpressionError(
                f"outputs {', '.join(map(repr, twins))} are the same value",
                where=f"{self.spec.source}: outputs",
                hint="return each value once; the caller can use it twice",
            )
        if all(o.value in self.index_domains for o in outputs):
            raise ExpressionError(
                "every output is int64 indices, which have no gradient: there is nothing for a Function to "
                "differentiate",
                where=f"{self.spec.source}: outputs",
                hint='return a floating-point value too (outputs = ["y", "idx"]), or call torch.argmax directly',
            )
        hoisted = frozenset(self.statistics) - {v.name for v in self.values if v.kind != ELEMENTWISE}
        count = len(self.values)
        gradients = tuple((name, self.gradient(name, expr)) for name, expr in self.parsed.gradients)
        hoisted -= {o.value for o in outputs}
        backward_only = frozenset(v.name for v in self.values[count:])
        integers = frozenset(self.index_domains) | {t.name for t in self.spec.tensors if t.discrete}
        return Program(self.parsed, tuple(self.values), tuple(outputs), hoisted, gradients, backward_only, integers)

    def gradient(self, name: str, expr: sympy.Expr) -> sympy.Expr:
        """The custom gradient ``expr`` of ``name`` over the program's values: each reduction, softmax or
        product in it a node, the forward's where it computes one (else a node only backward computes)."""
        where = f"{self.spec.source}: gradients.{name}"
        grads = set(self.parsed.grads)
        for node in sympy.preorder_traversal(expr):
            if isinstance(node, Structural) and node.free_symbols & grads:
                raise ExpressionError(
                    f"the gradient reads {structural.spelled(node)}, a reduction, softmax or product of the upstream "
                    "gradient: backward computes a custom gradient elementwise from grad and the forward's values",
                    where=where,
                    hint="write the gradient as grad times (elementwise math of) the forward's values",
                )
        return self.lift(structural.stable_forms(expr))

    def lift(self, expr: sympy.Basic) -> sympy.Basic:
        """``expr`` with each structural call replaced by its node's value."""
        if isinstance(expr, Structural):
            return self.node(expr.with_operands(*map(self.operand, expr.operand_exprs)), None, expr)
        if not expr.args or not expr.has(Structural):
            return expr
        return expr.func(*[self.lift(a) for a in expr.args])

    def operand(self, written: sympy.Basic) -> sympy.Symbol:
        """The value an operand of a structural call is: a value already, or a new elementwise node (two,
        where it combines several tensors through one subexpression: see :func:`_combination`)."""
        lifted = self.lift(written)
        if lifted.is_Symbol:
            return lifted
        return self.node(self.combined(lifted), None, written)

    def combined(self, lifted: sympy.Basic, output: bool = False) -> sympy.Basic:
        """An operand's or output's ``lifted`` with its :func:`_combination` (``input - target``) a node."""
        arguments = {*self.tensors, *(self.parsed.symbols[n] for n in self.scalars)} if output else None
        combination = _combination(lifted, self.tensors, arguments, self.shapes if output else None)
        # fused backward reads two arguments in the time forward writes the node and backward reads it
        if combination is None or (output and self.spec.fuse and len(combination.free_symbols & self.tensors) < 3):
            return lifted
        inner = self.node(combination, None, combination)
        return lifted.xreplace({combination: inner, -combination: -inner})

    def node(self, formula: sympy.Basic, name: str | None, written: sympy.Basic, stem: str = "tmp") -> sympy.Symbol:
        """The value of the node computing ``formula`` (over values), added unless there is one; ``written``
        is the formula over the arguments, for messages and for naming it after the step that assigns it
        (else ``name``, else ``stem`` numbered, an output's before a call's own), renamed by :func:`code_name`."""
        if not isinstance(formula, Structural):
            formula = self.hoisted(formula, formula)
        if formula in self.by_expr:
            return self.by_expr[formula]
        line = self.line_of(written)
        reads = sorted(formula.free_symbols, key=lambda s: s.name)
        if not reads or not any(r in self.tensors or r.name not in self.parsed.symbols for r in reads):
            raise ExpressionError(
                f"{structural.spelled(written)} does not depend on any tensor",
                where=self.at(line),
                hint="reduce, normalize or multiply expressions of the tensor arguments",
            )
        given = _step_name(self.parsed, written, self.code_names) or name
        if given:
            name = self.code_names.setdefault(given, code_name(given, self.taken))
        else:
            name = self.fresh(formula.stem if isinstance(formula, Structural) and stem == "tmp" else stem)
        self.taken.add(name)
        kind = formula.kind if isinstance(formula, Structural) else ELEMENTWISE
        shape = self.shape(formula, written, line)
        symbol = sympy.Symbol(name, real=True)
        self.values.append(Value(name, kind, shape, formula, line))
        self.shapes[name] = shape
        domain = self.index_domain(formula)
        if domain is not None:
            self.index_domains[name] = domain
        self.by_expr[formula] = symbol
        self.written[name] = written
        if kind == structural.REDUCE:
            self.statistics.add(name)
        return symbol

    def hoisted(self, expr: sympy.Basic, whole: sympy.Basic) -> sympy.Basic:
        """``expr`` (part of the elementwise formula ``whole``) with each part worth computing once replaced
        by a node of its own (see :meth:`hoistable`): a norm's ``1/sqrt(var + eps)`` in ``(x - mu)/sqrt(var +
        eps)*weight``, the ``1/sqrt(total*total1)`` of a cosine similarity. The factors (terms) of a product
        (sum) that have one such shape are one part."""
        if expr is not whole and self.hoistable(expr, whole):
            return self.statistic(expr)
        if not expr.args or not _costly(expr) or isinstance(expr, step_classes()):
            # nothing inside a step (round(x/s), sign(x/s)): no gradient passes through it to share a part
            # with, and a part of its own would be a hidden output that backward never differentiates
            return expr
        args = list(expr.args)
        if isinstance(expr, (sympy.Mul, sympy.Add)):
            groups: dict[tuple[int, ...], list[sympy.Basic]] = {}
            for arg in args:
                if self.reads_tensors(arg):
                    groups.setdefault(self.broadcast_shape(arg), []).append(arg)
            for group in groups.values():
                part = expr.func(*group)
                if len(group) > 1 and part != whole and self.hoistable(part, whole):
                    args = [a for a in args if a not in group] + [self.statistic(part)]
        rebuilt = [self.hoisted(a, whole) for a in args]
        return expr if rebuilt == list(expr.args) else expr.func(*rebuilt)

    def hoistable(self, expr: sympy.Basic, whole: sympy.Basic) -> bool:
        """Whether ``expr`` is worth a node of its own: costly (a function, a root, a quotient) and the same
        along some dimension ``whole`` runs over (it has fewer elements), or a root or a function of
        reductions' results alone (backward keeps it, its derivative in terms of itself, and takes no root
        at every element of a larger loop: a cosine similarity's ``1/sqrt(total*total1)``)."""
        if not _costly(expr) or not self.reads_tensors(expr):
            return False
        if _elements(self.broadcast_shape(expr)) < _elements(self.broadcast_shape(whole)):
            return True
        reads = {s.name for s in expr.free_symbols} - self.scalars
        return reads <= self.statistics and _root_or_function(expr)

    def reads_tensors(self, expr: sympy.Basic) -> bool:
        return any(s.name not in self.scalars and s.name in self.shapes for s in expr.free_symbols)

    def broadcast_shape(self, expr: sympy.Basic) -> tuple[int, ...]:
        return broadcast([self.shapes[s.name] for s in expr.free_symbols if s.name in self.shapes])

    def statistic(self, formula: sympy.Basic) -> sympy.Symbol:
        """The node of a hoisted part (named after the step that assigns it, if one does)."""
        written = formula.xreplace({sympy.Symbol(n, real=True): w for n, w in self.written.items()})
        symbol = self.node(formula, None, written, _stem(formula))
        self.statistics.add(symbol.name)
        return symbol

    def line_of(self, written: sympy.Basic) -> int:
        """The first line of the forward whose value contains ``written`` (0: a forward of one line)."""
        for step in self.parsed.steps:
            if step.value.has(written):
                return step.line
        return len(self.parsed.steps) + 1 if self.parsed.steps else 0

    def fresh(self, stem: str) -> str:
        """``stem`` numbered (tmp0, tmp1; probs, probs1) so that no value has it yet."""
        k = 0
        while (f"{stem}{k}" if k or stem == "tmp" else stem) in self.taken:
            k += 1
        return f"{stem}{k}" if k or stem == "tmp" else stem

    def at(self, line: int) -> str:
        return f"{self.where}, line {line}" if line else self.where


#: Endings of the names the generated code builds from a value's (x_shape, x_tangent, grad_h_returned).
_SUFFIXES = (*RESERVED_SUFFIXES, "_returned")


def _step_name(parsed: ParsedExpression, written: sympy.Basic, named: dict[str, str]) -> str | None:
    """The name of the step whose value is ``written``, unless a node has it already (is in ``named``)."""
    for step in parsed.steps:
        if step.value == written and step.name not in named:
            return step.name
    return None


def code_name(given: str, taken: set[str]) -> str:
    """The generated code's name of a value the user named ``given`` (a step or an output of a structured
    program), none of ``taken`` unless ``given`` itself: ``given``, renamed where it would take a name the
    generated code builds (the gradient ``grad_x`` of an argument x, whose own gradient in a second derivative
    is ``grad_grad_x``; a temporary tmp0, a mask, a shape ``x_shape``, a tangent) or uses (ctx, output,
    torch), as plan names several outputs: ``out_`` in front of a name that starts as generated ones do,
    ``_`` after one it uses."""
    name = given
    if name.startswith(RESERVED_PREFIXES) or re.fullmatch(r"mask\d*", name):
        name = f"out_{name}"
    while name != given and name in taken or name in RESERVED_ARGUMENT_NAMES or name.endswith(_SUFFIXES):
        name += "_"
    return name


#: The parts of an output's formula that :func:`_combination` weighs (most arguments first): every part of a
#: formula written by hand, not every term of a sum of 64 (two minutes of derivatives).
MAX_COMBINATIONS_TRIED = 12


def _combination(
    formula: sympy.Basic,
    tensors: set[sympy.Symbol],
    arguments_only: set[sympy.Symbol] | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> sympy.Expr | None:
    """The smallest part of ``formula`` through which it reads all of its (two or more) tensor arguments,
    where there is one and it is not the whole: ``input - target`` in ``(input - target)**2``; given
    ``arguments_only`` (the arguments), failing that, the part of arguments alone through which it reads the
    most of them, two or more (gaussian_nll's ``input - target`` beside ``var``). Given the values' ``shapes``
    too (an output's formula), another of those parts instead where backward reads fewer elements through it
    (:func:`_backward_elements`): lerp's ``y - x`` (the output, ``x + weight*(y - x)``, is flat in the ``x``
    outside it), barron's ``y_pred - y`` (not ``((y_pred - y)/c)**2``, whose derivative reads both).

    Computed as a node of its own, it is all backward needs of them (``2*(input - target)``): saving it
    costs one tensor where recomputing it costs them all (:mod:`.dataflow` decides which).
    """
    arguments = formula.free_symbols & tensors
    if len(arguments) < 2:
        return None
    marker = sympy.Dummy()
    least = 2 if arguments_only is not None else len(arguments)
    candidates = sorted(
        {
            node
            for node in sympy.preorder_traversal(formula)
            if isinstance(node, sympy.Expr)
            and not node.is_Atom
            and node != formula
            and len(node.free_symbols & arguments) >= least
            and (node.free_symbols >= arguments or node.free_symbols <= (arguments_only or set()))
        },
        # by sort key last: a set's order varies between processes, and so would the node on a tie
        key=lambda node: (-len(node.free_symbols & arguments), sympy.count_ops(node), sympy.default_sort_key(node)),
    )

    # a part the formula's stable form rewrites (exp(x) + exp(y) under a log: logaddexp) stays inside it (asked
    # lazily: a stable form of the whole formula for each part)
    def usable(c: sympy.Expr) -> bool:
        return _outside_stable_forms(formula, c, tensors)

    chosen = next(
        (
            c
            for c in candidates
            if not formula.xreplace({c: marker, -c: -marker}).free_symbols & c.free_symbols & arguments and usable(c)
        ),
        None,
    )
    candidates = list(itertools.islice(filter(usable, candidates), MAX_COMBINATIONS_TRIED))
    if (
        arguments_only is None
        or shapes is None
        or (fewest := _backward_elements(formula, chosen, tensors, shapes)) is None
    ):
        return chosen
    # the first few only: each costs a derivative in every argument, and a sum of 64 terms has 192 parts
    for candidate in candidates:
        elements = _backward_elements(formula, candidate, tensors, shapes)
        if elements is not None and elements < fewest:
            fewest, chosen = elements, candidate
    # a node that spares backward nothing only hides the formula from its derivatives' accurate forms
    # (tanh(w*x)'s 4*sigmoid(2*w*x)*sigmoid(-2*w*x), exact where 1 - tanh(w*x)**2 rounds to 0)
    alone = _backward_elements(formula, None, tensors, shapes)
    return None if alone is not None and fewest >= alone else chosen


def _outside_stable_forms(formula: sympy.Basic, part: sympy.Expr, tensors: set[sympy.Symbol]) -> bool:
    """Whether ``formula``'s stable form (:func:`.stable.stabilize`) is the same with ``part`` a value of its
    own: ``log(cosh(x - y))`` keeps ``x - y``; ``log(exp(x) + exp(y))`` becomes logaddexp only where it sees
    the exponentials."""
    marker = sympy.Dummy(real=True)
    split = formula.xreplace({part: marker, -part: -marker})
    whole = stabilize(formula, frozenset(tensors))
    return stabilize(split, frozenset(tensors) | {marker}).xreplace({marker: part}) == whole


def _backward_elements(
    formula: sympy.Basic, part: sympy.Expr | None, tensors: set[sympy.Symbol], shapes: dict[str, tuple[int, ...]]
) -> int | None:
    """The elements of the tensor arguments, and of ``part`` as a node of its own, that backward reads to
    differentiate ``formula`` (the partials of the formula over the node, and of the node): what it keeps of
    them at best. The node counts where backward reads none of its arguments besides; else backward
    computes it again from them (:mod:`.dataflow` keeps such a node only so). None where sympy cannot
    differentiate it."""
    marker = sympy.Dummy(real=True)
    outer = formula.xreplace({part: marker, -part: -marker}) if part is not None else formula
    inner = part.free_symbols & tensors if part is not None else set()
    shapes = {**shapes, marker.name: broadcast([shapes[s.name] for s in inner])}
    pairs = [(outer, s) for s in outer.free_symbols & (tensors | {marker})] + [(part, s) for s in inner]
    reads: set[sympy.Symbol] = set()
    for expr, symbol in pairs:
        try:
            partial = _partial(expr, symbol)
        except (TypeError, ValueError, NotImplementedError):
            return None
        if partial.has(sympy.Derivative, sympy.Subs):
            return None
        reads |= partial.free_symbols
    reads &= tensors | {marker}
    if marker in reads and reads & inner:
        reads = (reads | inner) - {marker}
    return sum(math.prod(shapes[s.name]) for s in reads)


def _partial(expr: sympy.Expr, symbol: sympy.Symbol) -> sympy.Expr:
    """``sympy.diff(expr, symbol)``, a sum's from its terms that read ``symbol`` alone (as sympy would, without
    asking each of 64 terms)."""
    if isinstance(expr, sympy.Add):
        return sympy.Add(*(sympy.diff(term, symbol) for term in expr.args if symbol in term.free_symbols))
    return sympy.diff(expr, symbol)


def _costly(expr: sympy.Basic) -> bool:
    """Whether ``expr`` computes more than sums and products of its values: a function, a quotient, a
    root."""
    return any(
        isinstance(node, (sympy.Function, sympy.Max, sympy.Min))
        or (isinstance(node, sympy.Pow) and not _positive_integer(node.exp))
        for node in sympy.preorder_traversal(expr)
    )


def _root_or_function(expr: sympy.Basic) -> bool:
    """Whether ``expr``'s outermost operation is a function or a root (not a sum, product or quotient)."""
    if isinstance(expr, sympy.Pow):
        return not expr.exp.is_Integer
    return isinstance(expr, (sympy.Function, sympy.Max, sympy.Min))


def _positive_integer(exponent: sympy.Basic) -> bool:
    return bool(exponent.is_Integer and exponent > 0)


def _stem(formula: sympy.Basic) -> str:
    """A hoisted part's name: after its outermost operation where that is a root or a reciprocal."""
    if isinstance(formula, sympy.Pow):
        stems = {sympy.Rational(-1, 2): "rsqrt", sympy.Rational(1, 2): "root", sympy.Integer(-1): "inverse"}
        return stems.get(formula.exp, "stat")
    return "stat"


def _elements(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


_INDEX_USES = (
    "int64 indices are an int64 tensor argument, argmax(e, dim=D) or argmin(e, dim=D), or a reshape, unsqueeze, "
    "squeeze or slice of those; one_hot and gather's index take them, and an output may return them (no "
    "arithmetic on them)"
)

_SHAPE_HINT = {
    structural.REDUCE: "dim counts from 0, or from -1 for the last dimension",
    structural.SOFTMAX: "dim counts from 0, or from -1 for the last dimension",
    structural.TRANSPOSE: "the dimensions count from 0, or from -1 for the last one",
    structural.SCAN: "dim counts from 0, or from -1 for the last dimension",
    structural.SLICE: "x[..., a:b] slices the last dimension, x[a:b] the first; the slice must take elements",
    structural.RESHAPE: "reshape keeps the number of elements (one size may be -1); squeeze removes a dimension "
    "of size 1",
    structural.CAT: "cat joins operands of one shape but along dim (dim counts from 0, or from -1 for the last)",
    structural.ONE_HOT: "one_hot(t, num_classes=C) adds a last dimension of size C",
    structural.GATHER: "gather(e, dim=D, index=t): t has e's rank, and no larger size than e away from D",
    structural.ARG_INDEX: "dim counts from 0, or from -1 for the last dimension",
    structural.MATMUL: "a @ b needs a's last dimension to equal b's second-to-last (b's only one for a vector); "
    "transpose(b, -1, -2) swaps b's last two",
}


def _broadcast_checked(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The shapes broadcast together, or ValueError."""
    result = broadcast(shapes)
    rank = len(result)
    for shape in shapes:
        padded = (1,) * (rank - len(shape)) + tuple(shape)
        if any(n not in (1, m) for n, m in zip(padded, result)):
            raise ValueError(shape)
    return result


# -- ranks at call time ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankRequirement:
    """What a tensor argument's rank must be at call time for the forward's dims to mean what they say:
    at least ``rank`` dimensions (exactly ``rank`` where ``exact``), because of ``reason`` (the call, as
    written)."""

    tensor: str
    rank: int
    exact: bool
    reason: str


def rank_requirements(program: Program) -> tuple[RankRequirement, ...]:
    """Each tensor argument's rank requirement, in the order of the arguments: the dims a reduction, a
    softmax or a transpose names must exist (dim=1 needs 2 dimensions, dim=-3 needs 3); a matrix operand of
    ``@`` stays a matrix (2 or more dimensions) and a vector stays a vector (exactly 1), so that the product
    is the one the example's shapes describe. A requirement on an intermediate falls on the arguments that
    give it its rank: those of the same rank as it in the example (a tensor of fewer dimensions broadcasts
    into it), through the reductions, softmaxes and transposes before it."""
    values = {v.name: v for v in program.values}
    found: dict[str, RankRequirement] = {}

    def require(name: str, rank: int, exact: bool, reason: str) -> None:
        value = values[name]
        if value.kind == SCALAR:
            return
        if value.kind == TENSOR:
            known = found.get(name)
            if known is None or (exact and not known.exact) or (known.exact == exact and rank > known.rank):
                found[name] = RankRequirement(name, rank, exact, reason)
            return
        here = len(value.shape)
        call = value.expr
        if value.kind == ELEMENTWISE:
            for read in value.reads:
                if values[read].kind != SCALAR and len(values[read].shape) == here:
                    require(read, rank, exact, reason)
        elif isinstance(call, structural.Reduction):
            if call.dims:  # a reduction over every dimension has rank 0 (or its operand's, kept) at any rank
                removed = 0 if call.keepdim else len(call.dims)
                require(str(call.args[0]), rank + removed, exact, reason)
        elif isinstance(call, (structural.Softmax, structural.Scan, structural.Transposed, structural.Sliced)):
            require(str(call.args[0]), rank, exact, reason)
        elif isinstance(call, structural.ArgIndex):
            require(str(call.args[0]), rank + (0 if call.keepdim else 1), exact, reason)
        elif isinstance(call, structural.Stacked):
            for operand in call.operand_exprs:
                require(str(operand), max(rank - 1, 0), exact, reason)
        elif isinstance(call, structural.Reshaping):
            change = _rank_change(call)
            if change is not None:
                require(str(call.args[0]), max(rank - change, 0), exact, reason)
        elif isinstance(call, structural.Gather):  # the index and the operand have one rank
            for operand in call.operand_exprs:
                require(str(operand), rank, exact, reason)
        else:
            for operand in call.operand_exprs:
                if len(values[str(operand)].shape) == here:
                    require(str(operand), rank, exact, reason)

    for value in program.values:
        for name, rank, exact, reason in _named_requirements(program, value.expr, values):
            require(name, rank, exact, reason)
    return tuple(found[t] for t in program.tensor_names if t in found)


def _named_requirements(program: Program, call: sympy.Basic, values: dict) -> list[tuple[str, int, bool, str]]:
    """What a structural ``call`` requires of its operands' ranks itself, as (name, rank, exact, why): the dims
    it names must exist; a matrix product's operands stay matrices or vectors."""
    needs: list[tuple[str, int, bool, str]] = []
    if isinstance(call, structural.Reduction) and call.dims:
        reason = f"{call.spelling} over dim={call.dims[0] if len(call.dims) == 1 else call.dims}"
        needs.append((str(call.args[0]), max(d + 1 if d >= 0 else -d for d in call.dims), False, reason))
    elif isinstance(call, (structural.Gather, structural.Softmax, structural.Scan, structural.ArgIndex)):
        rank, reason = call.dim + 1 if call.dim >= 0 else -call.dim, f"{call.spelling} over dim={call.dim}"
        needs += [(str(operand), rank, False, reason) for operand in call.operand_exprs]
    elif isinstance(call, structural.Transposed):
        reason = structural.spelled(_written(program, call))
        needs.append((str(call.args[0]), max(d + 1 if d >= 0 else -d for d in call.dims), False, reason))
    elif isinstance(call, (structural.Sliced, structural.Concatenated)):
        reason = structural.spelled(_written(program, call))
        rank = call.dim + 1 if call.dim >= 0 else -call.dim
        if isinstance(call, structural.Stacked):  # the dim is the result's, which has one more
            rank -= 1
        needs += [(str(operand), rank, False, reason) for operand in call.operand_exprs if rank]
    elif isinstance(call, structural.Reshaping) and not isinstance(call, structural.Reshaped):
        if _rank_needed(call):
            needs.append((str(call.args[0]), _rank_needed(call), False, structural.spelled(_written(program, call))))
    elif isinstance(call, structural.MatrixProduct):
        product = structural.spelled(_written(program, call)).removeprefix("(").removesuffix(")")
        for operand in call.operand_exprs:
            if len(values[str(operand)].shape) == 1:
                needs.append((str(operand), 1, True, f"a vector in {product}"))
            else:
                needs.append((str(operand), 2, False, f"a matrix in {product}"))
    return needs


def _rank_change(call: structural.Reshaping) -> int | None:
    """How many dimensions ``call`` adds (removes: negative) at every rank; None where its result's rank
    is the same at every rank (a reshape, a flatten from the front to the back)."""
    if isinstance(call, structural.Squeezed):
        return -1
    if isinstance(call, structural.Unsqueezed):
        return 1
    if isinstance(call, structural.Flattened) and (call.dims[0] < 0) == (call.dims[1] < 0):
        return call.dims[0] - call.dims[1]
    return None


def _rank_needed(call: structural.Reshaping) -> int:
    """The operand's rank an unsqueeze, squeeze or flatten needs for its dims to exist."""
    if isinstance(call, structural.Flattened):
        return max(d + 1 if d >= 0 else -d for d in call.dims)
    if isinstance(call, structural.Squeezed):
        return call.dim + 1 if call.dim >= 0 else -call.dim
    return call.dim if call.dim >= 0 else -call.dim - 1  # an unsqueeze: the result has one more


def _written(program: Program, call: structural.Structural) -> sympy.Basic:
    """``call`` over the arguments (its operands' formulas substituted)."""
    return call.with_operands(*(program.formula(str(o)) for o in call.operand_exprs))
