"""Stage 5d: fused mode's Triton target, for ops that work row by row along the last dimension.

Norms, softmaxes, logsumexp and cross-entropy reduce each row of their input alone. Where a program is
such an op, fused mode writes two Triton kernels from the same program and derivation as the eager code,
as Liger-Kernel writes them by hand:

* forward: one program per row; the row is loaded once (``BLOCK``, the next power of two of its
  length, lanes past the end masked), every step of the forward computed in registers, in float32
  (float64 for float64 inputs), the outputs stored in their own dtype;
* backward: a fixed number of programs, each looping over a block of rows. It recomputes the forward from
  the inputs (the row is in registers: a reduction again costs no memory traffic), then runs the steps in
  reverse, each passing the gradient on by its rule (an elementwise step by its partial derivatives, a
  reduction by broadcasting, a softmax by ``y * (g - sum(g * y))``), and stores the inputs' gradients. A
  vector broadcast along the rows (a norm's weight) and a 0-d tensor accumulate their gradient in the
  program's registers across its rows, in float32; the host sums the programs' partial sums once.

So forward reads the inputs and writes the outputs, and backward reads the inputs and the outputs'
gradients and writes the inputs' gradients: the minimal traffic. Nothing is saved beyond the inputs.

The roles, from the spec's example shapes (every tensor of the op's rank R has the row shape S, or S with
a last dimension 1):

* ``vector``: one value per element of a row (shape S);
* ``row``: one value per row, keepdim (S[:-1] + (1,)), or ``row_flat`` (S[:-1], an int64 class index);
* ``column``: a tensor of shape (N,), the same for every row (a weight);
* ``whole``: a 0-d tensor;
* ``number``: a scalar argument.

What is not such a program (a product, a transpose, a reduction over other dimensions, a custom gradient,
a function :mod:`.printing_triton` cannot print) gets no kernels: fused mode compiles it with
torch.compile, as before. :func:`row_kernels` says why, for the module's docstring.

The generated module runs the kernels only where they can stand in (CUDA tensors, or CPU tensors under
``TRITON_INTERPRET=1``; the shapes as the roles say; one floating dtype; no torch.func transform, tracer
or autocast at work): elsewhere the op's Function runs, so the result is the same wherever it runs. A
second derivative differentiates the op's derived Function, recomputed from the inputs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sympy

from .printing_triton import NotPrintableError, _wrapped, print_triton, value_name
from .program import ELEMENTWISE, SCALAR, TENSOR
from .rules import ProgramDerivation
from .structural import (
    AMax,
    AMin,
    Gather,
    LogSoftmax,
    LogSumExp,
    OneHot,
    ReduceMean,
    ReduceSum,
    Softmax,
    Squeezed,
    Unsqueezed,
)

VECTOR = "vector"
ROW = "row"
ROW_FLAT = "row_flat"
COLUMN = "column"
WHOLE = "whole"
NUMBER = "number"
TOTAL = "total"
#: the roles of one value per row (a scalar in the kernel)
ROWS = (ROW, ROW_FLAT)
#: the host code's own names around the kernels (templates/_rows.py.j2), which the program's may not take
HOST_NAMES = frozenset(
    {"n_rows", "n_cols", "settings", "programs", "rows_per_program", "totals", "inputs", "ctx", "torch", "tl"}
)
#: the longest row the kernels take: a row is held in registers (Liger-Kernel's limit too)
MAX_ROW = 65536
_INF = 'float("inf")'


def _live(lines: list[str], after: list[str]) -> list[str]:
    """``lines`` without the assignments whose targets neither a later line nor the lines ``after`` read
    (the other lines, stores and sums, stay)."""
    used = set(re.findall(r"\w+", "\n".join(after)))
    kept = []
    for line in reversed(lines):
        target, assigns, value = line.partition(" = ")
        if not assigns or not target.isidentifier():
            kept.append(line)
            used |= set(re.findall(r"\w+", line))
        elif target in used:
            kept.append(line)
            used |= set(re.findall(r"\w+", value))
    return kept[::-1]


class NotRowWiseError(Exception):
    """The program is not one the row kernels compute; the message says what stands in the way."""


@dataclass(frozen=True)
class RowArgument:
    name: str
    role: str
    integer: bool = False  # an int64 tensor (class indices)
    differentiable: bool = False  # a float tensor: backward computes its gradient


@dataclass(frozen=True)
class RowOutput:
    value: str  # the program's value the output is
    role: str  # VECTOR, ROW or ROW_FLAT


@dataclass(frozen=True)
class RowTotal:
    """A sum or mean over every row (a mean loss): the forward kernel writes each row's part, the host adds
    them up; backward's kernel reads the total's gradient, the same for every row."""

    name: str
    operand: str
    per_element: bool  # the operand has a value per element (its row's part is the row's sum), not per row
    mean: bool


@dataclass(frozen=True)
class RowKernels:
    """The op's two kernels as source lines, and what the host code around them needs."""

    arguments: tuple[RowArgument, ...]
    outputs: tuple[RowOutput, ...]
    lead: str  # the vector argument whose shape the rows take
    forward: tuple[str, ...]  # the forward kernel, ``def _forward_kernel(...)`` and its body
    backward: tuple[str, ...]  # the backward kernel
    # Python conditions, over the op's arguments, under which the kernels stand in for the op
    conditions: tuple[str, ...]
    totals: tuple[RowTotal, ...] = ()
    # the math on the totals, on the host: (value, its formula over the totals and the numbers), in order
    epilogue: tuple[tuple[str, sympy.Expr], ...] = ()

    @property
    def tensors(self) -> tuple[RowArgument, ...]:
        return tuple(a for a in self.arguments if a.role != NUMBER)

    @property
    def numbers(self) -> tuple[RowArgument, ...]:
        return tuple(a for a in self.arguments if a.role == NUMBER)

    @property
    def accumulated(self) -> tuple[RowArgument, ...]:
        """The differentiable tensors whose gradient sums over the rows (columns, 0-d tensors)."""
        return tuple(a for a in self.arguments if a.differentiable and a.role in (COLUMN, WHOLE))


def row_kernels(derivation: ProgramDerivation, dtypes: dict[str, str]) -> RowKernels | str:
    """The row kernels of the derived program, or why it gets none. ``dtypes``: each tensor argument's
    dtype as the spec gives it ("float", "int64", "bool")."""
    try:
        roles = _Roles(derivation, dtypes)
        writer = _KernelWriter(roles)
        return RowKernels(
            roles.arguments,
            roles.outputs,
            roles.lead,
            writer.forward(),
            writer.backward(),
            roles.conditions(),
            roles.totals,
            roles.epilogue,
        )
    except NotRowWiseError as exc:
        return str(exc)
    except NotPrintableError as exc:
        return f"Triton's interpreter has no faithful form of a part of it: {exc}"


class _Roles:
    """Each value's role in a row (the module's docstring lists them), the arguments and outputs the kernels
    take and write, and the conditions on the call's shapes; NotRowWiseError where a value has none."""

    def __init__(self, derivation: ProgramDerivation, dtypes: dict[str, str]) -> None:
        self.derivation = derivation
        self.program = derivation.program
        self.dtypes = dtypes
        self.roles: dict[str, str] = {}
        self.integers = set(self.program.integers)
        self.positive_dims = False  # a dim written from the front (dim=1): the last only at the example's rank
        self.totals: list[RowTotal] = []
        self.epilogue: list[tuple[str, sympy.Expr]] = []
        self._find()
        self.totals, self.epilogue = tuple(self.totals), tuple(self.epilogue)

    def _find(self) -> None:
        program = self.program
        if not program.structured:
            raise NotRowWiseError("it is elementwise: torch.compile fuses it into one pass at the copy bandwidth")
        if program.gradients or program.backward_only:
            raise NotRowWiseError("it has custom gradients")
        if any(d == "bool" for d in self.dtypes.values()):
            raise NotRowWiseError("it takes a bool tensor")
        shapes = [v.shape for v in program.values if v.kind == TENSOR]
        rank = max((len(s) for s in shapes), default=0)
        leads = [v for v in program.values if v.kind == TENSOR and len(v.shape) == rank and v.name not in self.integers]
        if rank < 2 or not leads:
            raise NotRowWiseError("it has no float tensor of two or more dimensions whose rows it could take")
        self.shape = leads[0].shape
        if self.shape[-1] == 1:
            raise NotRowWiseError("its rows have length 1")
        for value in program.values:
            self.roles[value.name] = self._role(value)
        outputs = []
        for output in program.outputs:
            role = self.roles.get(output.value, "")
            if role not in (VECTOR, *ROWS, TOTAL) or output.value in self.integers:
                raise NotRowWiseError(f"an output is not one value per element or per row: {output.value!r}")
            if program.value(output.value).kind == TENSOR:
                raise NotRowWiseError(f"an output is an input as it is: {output.value!r}")
            outputs.append(RowOutput(output.value, role))
        arguments = []
        for value in program.values:
            if value.kind == TENSOR:
                integer = value.name in self.integers
                arguments.append(RowArgument(value.name, self.roles[value.name], integer, not integer))
            elif value.kind == SCALAR:
                arguments.append(RowArgument(value.name, NUMBER))
        self.arguments = tuple(arguments)
        self.outputs = tuple(outputs)
        self.lead = leads[0].name
        self._check_names()

    def _check_names(self) -> None:
        """The kernels name their own values after the program's (a softmax's ``v_<name>_max``, a weight's
        ``d_<name>_sum``) and the host code has locals of its own: a program whose names meet those gets none."""
        names = set(self.roles)
        derived = {f"{n}_{suffix}" for n in names for suffix in ("max", "exp", "sum", "hits")}
        host = {n for n in names if re.fullmatch(r"out\d+|part_\w+", n)}  # the outputs' and totals' locals
        clash = sorted(names & (derived | HOST_NAMES) | host)
        if clash:
            raise NotRowWiseError(f"its names {', '.join(map(repr, clash))} are names the kernels' code uses")

    def _last(self, dims: tuple[int, ...]) -> bool:
        """Whether ``dims`` is the last dimension alone, noting a dim counted from the front."""
        if dims == (len(self.shape) - 1,):
            self.positive_dims = True
        return dims in ((-1,), (len(self.shape) - 1,))

    def _role(self, value) -> str:  # noqa: C901 - one case per kind of node
        shape, rank = value.shape, len(self.shape)
        if value.kind == SCALAR:
            return NUMBER
        if value.kind == TENSOR:
            if value.name in self.integers:
                if shape == self.shape[:-1]:
                    return ROW_FLAT
                if shape == (*self.shape[:-1], 1):
                    return ROW
                raise NotRowWiseError(f"the index {value.name!r} is not one per row")
            if shape == self.shape:
                return VECTOR
            if shape == (*self.shape[:-1], 1):
                return ROW
            if shape == self.shape[-1:]:
                return COLUMN
            if shape == ():
                return WHOLE
            raise NotRowWiseError(f"{value.name!r} of shape {shape} is neither a row, one per row, nor a weight")
        expr = value.expr
        if value.kind == ELEMENTWISE:
            reads = [self.roles[s.name] for s in expr.free_symbols if s.name in self.roles]
            if TOTAL in reads:
                if set(reads) - {TOTAL, NUMBER}:
                    raise NotRowWiseError(f"{value.name!r} reads a total over the rows beside values of a row")
                self.epilogue.append((value.name, self.derivation.node(value.name).forward))
                return TOTAL
            if any(r == ROW_FLAT for r in reads) and len(shape) == rank:
                raise NotRowWiseError(f"{value.name!r} broadcasts a value per row along the last dimension")
            role = (
                VECTOR if {VECTOR, COLUMN} & set(reads) else
                ROW if ROW in reads else ROW_FLAT if ROW_FLAT in reads else WHOLE if WHOLE in reads else NUMBER
            )  # fmt: skip
            expected = {VECTOR: self.shape, ROW: (*self.shape[:-1], 1), ROW_FLAT: self.shape[:-1]}.get(role, shape)
            if shape != expected:  # (a value per row beside another: the rows broadcast against each other)
                raise NotRowWiseError(f"{value.name!r} of shape {shape} is neither a row nor one value per row")
            return role  # WHOLE or NUMBER: computed once per program, a kernel's scalar
        operand = expr.args[0]
        operand_role = self.roles.get(getattr(operand, "name", ""), "")
        total = self._total(value, operand_role)
        if total:
            return total
        if isinstance(expr, (ReduceSum, ReduceMean, LogSumExp, AMax, AMin)):
            if operand_role != VECTOR or not self._last(expr.dims):
                raise NotRowWiseError(f"{value.name!r} reduces over other dimensions than the last")
            return ROW if expr.keepdim else ROW_FLAT
        if isinstance(expr, Softmax):  # LogSoftmax too
            if operand_role != VECTOR or not self._last((expr.dim,)):
                raise NotRowWiseError(f"{value.name!r} normalizes along another dimension than the last")
            return VECTOR
        if isinstance(expr, OneHot):
            if operand_role != ROW_FLAT or not expr.classes.is_Integer or int(expr.classes) != self.shape[-1]:
                raise NotRowWiseError(f"{value.name!r} is not a row of classes of the rows' length")
            return VECTOR
        if isinstance(expr, Gather):
            index_role = self.roles.get(expr.args[1].name, "")
            if operand_role != VECTOR or index_role != ROW or not self._last((expr.dim,)):
                raise NotRowWiseError(f"{value.name!r} gathers other than one element per row")
            return ROW
        if isinstance(expr, Squeezed) and operand_role == ROW and self._last((expr.dim,)):
            return ROW_FLAT
        if isinstance(expr, Unsqueezed) and operand_role == ROW_FLAT and expr.dim in (-1, rank - 1):
            if expr.dim == rank - 1:
                self.positive_dims = True
            return ROW
        raise NotRowWiseError(f"{value.name!r} is a {type(expr).__name__}, which the row kernels do not compute")

    def _total(self, value, operand_role: str) -> str:
        """TOTAL for a sum or mean over every dimension of values of a row (each row's part summed on the
        host), else ""."""
        expr = value.expr
        if not isinstance(expr, (ReduceSum, ReduceMean)) or operand_role not in (VECTOR, *ROWS):
            return ""
        rank = len(self.program.value(expr.args[0].name).shape)
        if expr.dims and len({d % rank for d in expr.dims}) < rank:
            return ""
        if expr.keepdim:
            raise NotRowWiseError(f"{value.name!r} sums over every row with keepdim")
        if expr.dims:
            self.positive_dims = True  # every dimension at the example's rank alone
        self.totals.append(
            RowTotal(value.name, expr.args[0].name, operand_role == VECTOR, isinstance(expr, ReduceMean))
        )
        return TOTAL

    def conditions(self) -> tuple[str, ...]:
        """Python conditions on the op's arguments under which the kernels take them."""
        lead = self.lead
        shapes = {
            VECTOR: f"{lead}.shape",
            ROW: f"{lead}.shape[:-1] + (1,)",
            ROW_FLAT: f"{lead}.shape[:-1]",
            COLUMN: f"{lead}.shape[-1:]",
            WHOLE: "()",
        }
        # a dim counted from the front is the last one at the example's rank alone
        conditions = [f"{lead}.dim() == {len(self.shape)}"] if self.positive_dims else []
        for a in self.arguments:
            if a.role == NUMBER or a.name == lead:
                continue
            conditions.append(f"{a.name}.shape == {shapes[a.role]}")
        return tuple(conditions)


class _RowCode:
    """The kernels' shared pieces, from the roles: their parameters, the loads of the arguments and the
    forward's steps in a row."""

    def __init__(self, roles: _Roles) -> None:
        self.derivation = roles.derivation
        self.program = roles.program
        self.roles = roles.roles
        self.integers = roles.integers
        self.arguments = roles.arguments
        self.outputs = roles.outputs
        self.totals = roles.totals

    @property
    def accumulated(self) -> tuple[RowArgument, ...]:
        return tuple(a for a in self.arguments if a.differentiable and a.role in (COLUMN, WHOLE))

    def _parameters(self, backward: bool) -> list[str]:
        tensors = [f"p_{a.name}" for a in self.arguments if a.role != NUMBER]
        numbers = [value_name(a.name) for a in self.arguments if a.role == NUMBER]
        rows = [i for i, o in enumerate(self.outputs) if o.role != TOTAL]  # the host computes the totals' math
        if backward:
            upstream = [f"p_g{i}" for i in rows]
            grads = [f"p_d_{a.name}" for a in self.arguments if a.differentiable]
            totals = [f"p_d_{t.name}" for t in self.totals]
            needs = [f"need_{a.name}: tl.constexpr" for a in self.arguments if a.differentiable]
            rest = ["n_rows", "n_cols", "rows_per_program", *needs]
            return [*tensors, *upstream, *grads, *totals, *numbers, *rest]
        outputs = [f"p_out{i}" for i in rows]
        parts = [f"p_part_{t.name}" for t in self.totals]
        return [*tensors, *outputs, *parts, *numbers, "n_cols"]

    def _loads(self, roles: tuple[str, ...]) -> list[str]:
        """Load the tensor arguments of ``roles``, as the computation's dtype (int64 indices as they are)."""
        lines = []
        for a in self.arguments:
            if a.role not in roles or a.role == NUMBER:
                continue
            name, pointer = value_name(a.name), f"p_{a.name}"
            cast = "" if a.integer else ".to(ACC)"
            if a.role == VECTOR:
                lines.append(f"{name} = tl.load({pointer} + offsets, mask=inside, other=0.0){cast}")
            elif a.role == COLUMN:
                lines.append(f"{name} = tl.load({pointer} + cols, mask=inside, other=0.0){cast}")
            elif a.role in ROWS:
                lines.append(f"{name} = tl.load({pointer} + row){cast}")
            else:
                lines.append(f"{name} = tl.load({pointer}){cast}")
        return lines

    def _steps(self) -> list[str]:
        """The forward's steps, each value by its kernel name."""
        lines = []
        for value in self.program.values:
            if value.kind in (TENSOR, SCALAR) or self.roles[value.name] == TOTAL:
                continue
            lines.extend(self._step(value))
        return lines

    def _step(self, value) -> list[str]:
        name, expr = value_name(value.name), value.expr
        if value.kind == ELEMENTWISE:
            forward = self.derivation.node(value.name).forward
            text = print_triton(forward)
            if self.roles[value.name] == VECTOR and not any(
                self.roles.get(s.name) in (VECTOR, COLUMN) for s in forward.free_symbols
            ):
                text = f"tl.zeros([BLOCK], dtype=ACC) + {text}"  # a row's constant, spread along it
            return [f"{name} = {text}"]
        a = value_name(expr.args[0].name) if isinstance(expr.args[0], sympy.Symbol) else None
        if isinstance(expr, (ReduceSum, ReduceMean)):
            total = f"tl.sum(tl.where(inside, {a}, 0.0), axis=0)"
            return [f"{name} = {total}" + (" / n_cols" if isinstance(expr, ReduceMean) else "")]
        if isinstance(expr, AMax):
            return [f"{name} = tl.max(tl.where(inside, {a}, -{_INF}), axis=0)"]
        if isinstance(expr, AMin):
            return [f"{name} = tl.min(tl.where(inside, {a}, {_INF}), axis=0)"]
        if isinstance(expr, LogSumExp):
            # torch.logsumexp's shift: the row's maximum, or 0 where that is infinite
            largest = f"{name}_max"
            return [
                f"{largest} = tl.max(tl.where(inside, {a}, -{_INF}), axis=0)",
                f"{largest} = tl.where(tl.abs({largest}) == {_INF}, 0.0, {largest})",
                f"{name} = {largest} + tl.log(tl.sum(tl.where(inside, tl.exp({a} - {largest}), 0.0), axis=0))",
            ]
        if isinstance(expr, Softmax):
            largest, exps = f"{name}_max", f"{name}_exp"
            lines = [
                f"{largest} = tl.max(tl.where(inside, {a}, -{_INF}), axis=0)",
                f"{exps} = tl.where(inside, tl.exp({a} - {largest}), 0.0)",
            ]
            if isinstance(expr, LogSoftmax):
                return [*lines, f"{name} = {a} - {largest} - tl.log(tl.sum({exps}, axis=0))"]
            return [*lines, f"{name} = {exps} / tl.sum({exps}, axis=0)"]
        if isinstance(expr, OneHot):
            return [f"{name} = tl.where(cols == {a}, 1.0, 0.0).to(ACC)"]
        if isinstance(expr, Gather):
            index = value_name(expr.args[1].name)
            return [f"{name} = tl.sum(tl.where(inside & (cols == {index}), {a}, 0.0), axis=0)"]
        return [f"{name} = {a}"]  # a squeeze or unsqueeze of one value per row


class _KernelWriter(_RowCode):
    """The two kernels' source lines: forward's steps in a row, then backward's, which recomputes what it
    reads of the forward and passes the gradient back step by step."""

    def forward(self) -> tuple[str, ...]:
        body = [
            "row = tl.program_id(0).to(tl.int64)",
            "cols = tl.arange(0, BLOCK)",
            "inside = cols < n_cols",
            "offsets = row * n_cols + cols",
            *self._loads((VECTOR, COLUMN, ROW, ROW_FLAT, WHOLE)),
            *self._steps(),
        ]
        for t in self.totals:  # each row's part of a total
            part = value_name(t.operand)
            if t.per_element:
                part = f"tl.sum(tl.where(inside, {part}, 0.0), axis=0)"
            body.append(f"tl.store(p_part_{t.name} + row, {part})")
        for i, output in enumerate(self.outputs):
            pointer, name = f"p_out{i}", value_name(output.value)
            if output.role == TOTAL:
                continue
            if output.role == VECTOR:
                body.append(f"tl.store({pointer} + offsets, {name}.to({pointer}.dtype.element_ty), mask=inside)")
            else:
                body.append(f"tl.store({pointer} + row, {name}.to({pointer}.dtype.element_ty))")
        parameters = [*self._parameters(backward=False), "ACC: tl.constexpr", "BLOCK: tl.constexpr"]
        return (f"def _forward_kernel({', '.join(parameters)}):", *(f"    {line}" for line in body))

    def backward(self) -> tuple[str, ...]:
        accumulators = []
        for a in self.accumulated:
            size = "[BLOCK]" if a.role == COLUMN else "[1]"
            accumulators.append(f"d_{a.name}_sum = tl.zeros({size}, dtype=ACC)")
        # what backward reads of the forward, and the gradients it stores or sums: nothing else is loaded,
        # recomputed or computed
        steps = [*self._loads((VECTOR, ROW, ROW_FLAT)), *self._steps(), *self._reverse()]
        loop = ["offsets = row * n_cols + cols", *_live(steps, [])]
        ends = []
        for a in self.accumulated:
            pointer, total = f"p_d_{a.name}", f"d_{a.name}_sum"
            ends.append(f"if need_{a.name}:")
            if a.role == COLUMN:
                ends.append(f"    tl.store({pointer} + program * n_cols + cols, {total}, mask=inside)")
            else:
                ends.append(f"    tl.store({pointer} + program + tl.arange(0, 1), {total})")
        body = [
            "program = tl.program_id(0)",
            "cols = tl.arange(0, BLOCK)",
            "inside = cols < n_cols",
            *_live(
                [*self._loads((COLUMN, WHOLE)), *(f"d_{t.name} = tl.load(p_d_{t.name}).to(ACC)" for t in self.totals)],
                loop,
            ),
            *accumulators,
            "first = program.to(tl.int64) * rows_per_program",
            "for row in range(first, tl.minimum(first + rows_per_program, n_rows)):",
            *(f"    {line}" for line in loop),
            *ends,
        ]
        parameters = [*self._parameters(backward=True), "ACC: tl.constexpr", "BLOCK: tl.constexpr"]
        return (f"def _backward_kernel({', '.join(parameters)}):", *(f"    {line}" for line in body))

    def _reverse(self) -> list[str]:  # noqa: C901 - one case per kind of node
        """Backward's steps in a row: each value's gradient, the sum of what its readers pass it."""
        terms: dict[str, list[tuple[str, str]]] = {}  # value -> [(term, its role)]

        def add(target: str, term: str, role: str) -> None:
            target_role = self.roles[target]
            if target in self.integers or target_role == NUMBER:
                return
            if role == VECTOR and target_role in (*ROWS, WHOLE):
                term, role = f"tl.sum(tl.where(inside, {term}, 0.0), axis=0)", ROW
            terms.setdefault(target, []).append((term, role))

        lines = []
        for i, output in enumerate(self.outputs):
            upstream = f"g{i}"
            if output.role == TOTAL:
                continue  # the host passes its gradient on to the totals (_runtime.total_gradients)
            if output.role == VECTOR:
                lines.append(f"{upstream} = tl.load(p_g{i} + offsets, mask=inside, other=0.0).to(ACC)")
            else:
                lines.append(f"{upstream} = tl.load(p_g{i} + row).to(ACC)")
            add(output.value, upstream, output.role)
        totals = {t.name: t for t in self.totals}
        for value in reversed(self.program.values):
            if value.name in totals:  # the same for every row: loaded before the loop
                t = totals[value.name]
                share = ("(n_rows * n_cols)" if t.per_element else "n_rows") if t.mean else ""
                add(t.operand, f"d_{t.name} / {share}" if share else f"d_{t.name}", ROW)
                continue
            if value.name not in terms or self.roles[value.name] == TOTAL:
                continue
            grad = f"d_{value.name}"
            lines.append(f"{grad} = {self._sum(terms.pop(value.name), self.roles[value.name])}")
            if value.kind == TENSOR:
                lines.extend(self._gradient_out(value.name, grad))
                continue
            role = self.roles[value.name]
            expr, v = value.expr, value_name(value.name)
            if value.kind == ELEMENTWISE:
                for read, partial in self.derivation.node(value.name).partials:
                    if partial == 0 or read not in self.roles:
                        continue
                    add(read, grad if partial == 1 else f"{grad} * {_wrapped(print_triton(partial))}", role)
                continue
            a = expr.args[0].name
            x = value_name(a)
            if isinstance(expr, ReduceSum):
                add(a, grad, ROW)
            elif isinstance(expr, ReduceMean):
                add(a, f"{grad} / n_cols", ROW)
            elif isinstance(expr, (AMax, AMin)):
                hits = f"{grad}_hits"
                lines.append(f"{hits} = tl.sum(tl.where(inside & ({x} == {v}), 1.0, 0.0), axis=0)")
                add(a, f"tl.where({x} == {v}, {grad} / {hits}, 0.0)", VECTOR)
            elif isinstance(expr, LogSumExp):
                add(a, f"{grad} * tl.exp({x} - {v})", VECTOR)
            elif isinstance(expr, LogSoftmax):
                add(a, f"{grad} - tl.exp({v}) * tl.sum(tl.where(inside, {grad}, 0.0), axis=0)", VECTOR)
            elif isinstance(expr, Softmax):
                add(a, f"{v} * ({grad} - tl.sum(tl.where(inside, {grad} * {v}, 0.0), axis=0))", VECTOR)
            elif isinstance(expr, Gather):
                add(a, f"tl.where(cols == {value_name(expr.args[1].name)}, {grad}, 0.0)", VECTOR)
            elif isinstance(expr, (Squeezed, Unsqueezed)):
                add(a, grad, role)
        for a in self.arguments:  # a tensor the outputs do not depend on (sign(x)'s x): zeros, as the Function's
            if a.differentiable and not any(line.startswith(f"d_{a.name} = ") for line in lines):
                zero = "tl.zeros([BLOCK], dtype=ACC)" if a.role in (VECTOR, COLUMN) else "tl.zeros([], dtype=ACC)"
                lines.extend([f"d_{a.name} = {zero}", *self._gradient_out(a.name, f"d_{a.name}")])
        return lines

    def _sum(self, terms: list[tuple[str, str]], role: str) -> str:
        text = " + ".join(f"({t})" if " " in t and len(terms) > 1 else t for t, _ in terms)
        if role == VECTOR and all(r != VECTOR for _, r in terms):
            return f"tl.zeros([BLOCK], dtype=ACC) + {text}"  # a gradient the same along the row
        return text

    def _gradient_out(self, name: str, grad: str) -> list[str]:
        """Store (or accumulate) the gradient of the tensor argument ``name``."""
        a = next(a for a in self.arguments if a.name == name)
        if not a.differentiable:
            return []
        pointer, need = f"p_d_{name}", f"need_{name}"
        if a.role == VECTOR:
            store = f"tl.store({pointer} + offsets, {grad}.to({pointer}.dtype.element_ty), mask=inside)"
            return [f"if {need}:", f"    {store}"]
        if a.role in ROWS:
            return [f"if {need}:", f"    tl.store({pointer} + row, {grad}.to({pointer}.dtype.element_ty))"]
        if a.role == COLUMN:
            return [f"d_{name}_sum += tl.where(inside, {grad}, 0.0)"]
        return [f"d_{name}_sum += {grad}"]
