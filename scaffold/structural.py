"""The language's operations that are not elementwise: reductions, softmax, matrix products, transpose, scans.

Stage 2 (:mod:`.expression`) parses ``sum(e, dim=-1, keepdim=True)``, ``softmax(e, dim=-1)``, ``a @ b``,
``transpose(e, 0, 1)`` and ``cumsum(e, dim=-1)`` into the placeholders below: sympy functions that sympy
treats as opaque real numbers, so that the elementwise math around them (``x - mean(x, dim=-1,
keepdim=True)``) is ordinary sympy. Stage 3 (:mod:`.program`) lifts each placeholder out into a node of its
own kind, with its shape; stage 4b (:mod:`.rules`) holds each kind's derivative rule, as PyTorch's
derivatives.yaml does.

A placeholder's arguments are its operands (expressions) and its parameters (sympy integers, tuples,
booleans), which have no free symbols: ``expr.free_symbols`` of a lifted node is what it reads.
"""

from __future__ import annotations

import sympy
import sympy.printing.str

#: Node kinds (stage 3): a reduction over dimensions, softmax/log_softmax along one, a matrix product, a
#: transpose of two dimensions, a scan (cumsum/cumprod) along one.
REDUCE = "reduce"
SOFTMAX = "softmax"
MATMUL = "matmul"
TRANSPOSE = "transpose"
SCAN = "scan"
#: Shape operations: a slice along one dimension, a concatenation.
SLICE = "slice"
CAT = "cat"
#: reshape, unsqueeze, squeeze, flatten: the same elements in another shape
RESHAPE = "reshape"
ONE_HOT = "one_hot"
GATHER = "gather"
#: argmax/argmin along one dimension: int64 indices, no gradient
ARG_INDEX = "arg_index"


class Structural(sympy.Function):
    """A non-elementwise operation, opaque to sympy: never differentiated or simplified into."""

    kind = ""
    spelling = ""
    stem = "tmp"  # what the generated code calls an unnamed one (probs, probs1, ...)
    operands = 1  # the leading arguments that are expressions; the rest are parameters

    @classmethod
    def eval(cls, *args):  # noqa: D102 - sympy's hook: leave the call unevaluated
        return None

    def _eval_is_real(self) -> bool:
        return True

    def _eval_is_finite(self) -> bool | None:
        return None

    def fdiff(self, argindex=1):
        raise TypeError(f"{self.spelling} is differentiated by its rule (scaffold.rules), not by sympy")

    @property
    def operand_exprs(self) -> tuple[sympy.Expr, ...]:
        return self.args[: self.operands]

    def with_operands(self, *operands: sympy.Expr) -> Structural:
        return type(self)(*operands, *self.args[self.operands :])

    def spelled(self, printer: sympy.printing.str.StrPrinter) -> str:
        """The call as the language writes it."""
        return f"{self.spelling}({printer._print(self.args[0])}{self._parameters()})"

    def _parameters(self) -> str:
        return ""


class Reduction(Structural):
    """``name(e, dim=D, keepdim=K)``: arguments (e, Tuple of dims or () for all dimensions, keepdim)."""

    kind = REDUCE
    nargs = 3

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.args[1])

    @property
    def keepdim(self) -> bool:
        return bool(self.args[2])

    def _parameters(self) -> str:
        dims = self.dims
        text = "" if not dims else f", dim={dims[0]}" if len(dims) == 1 else f", dim={dims}"
        return text + (", keepdim=True" if self.keepdim else "")


class ReduceSum(Reduction):
    stem = "total"
    spelling = "sum"


class ReduceMean(Reduction):
    stem = "average"
    spelling = "mean"


class LogSumExp(Reduction):
    stem = "lse"
    spelling = "logsumexp"


class AMax(Reduction):
    stem = "largest"
    spelling = "amax"


class AMin(Reduction):
    stem = "smallest"
    spelling = "amin"


class AlongOneDim(Structural):
    """A call of one expression along the one dimension its ``dim=`` keyword names (softmax, a scan):
    arguments (e, D)."""

    nargs = 2

    @property
    def dim(self) -> int:
        return int(self.args[1])

    def _parameters(self) -> str:
        return f", dim={self.dim}"


class Softmax(AlongOneDim):
    """``softmax(e, dim=D)``: arguments (e, D)."""

    kind = SOFTMAX
    spelling = "softmax"
    stem = "probs"


class LogSoftmax(Softmax):
    spelling = "log_softmax"
    stem = "log_probs"


class MatrixProduct(Structural):
    """``a @ b``, as torch.matmul: arguments (a, b)."""

    kind = MATMUL
    spelling = "@"
    stem = "product"
    operands = 2
    nargs = 2

    def spelled(self, printer: sympy.printing.str.StrPrinter) -> str:
        return f"({printer._print(self.args[0])} @ {printer._print(self.args[1])})"


class Transposed(Structural):
    """``transpose(e, d0, d1)``: arguments (e, d0, d1)."""

    kind = TRANSPOSE
    spelling = "transpose"
    stem = "transposed"
    nargs = 3

    @property
    def dims(self) -> tuple[int, int]:
        return int(self.args[1]), int(self.args[2])

    def _parameters(self) -> str:
        return f", {self.dims[0]}, {self.dims[1]}"


class Scan(AlongOneDim):
    """``cumsum(e, dim=D)`` and ``cumprod(e, dim=D)``: arguments (e, D); the result has e's shape."""

    kind = SCAN


class CumSum(Scan):
    spelling = "cumsum"
    stem = "running_sum"


class CumProd(Scan):
    spelling = "cumprod"
    stem = "running_product"


class Sliced(Structural):
    """``e[..., start:stop]``, a slice along one dimension with step 1: arguments (e, dim, start, stop), a
    bound an empty Tuple where it is left out, else a Tuple of it (``e[1:-1, 2:]`` is two slices, one per dimension)."""

    kind = SLICE
    spelling = "[]"
    stem = "part"
    nargs = 4

    @property
    def dim(self) -> int:
        return int(self.args[1])

    @property
    def bounds(self) -> tuple[int | None, int | None]:
        return tuple(int(b[0]) if b else None for b in self.args[2:])  # type: ignore[return-value]

    def spelled(self, printer: sympy.printing.str.StrPrinter) -> str:
        operand = printer._print(self.args[0])
        return sliced(
            operand if self.args[0].is_Symbol or isinstance(self.args[0], Structural) else f"({operand})", self
        )


def sliced(code: str, call: Sliced) -> str:
    """``code`` (an atom) indexed as ``call`` slices: ``x[..., 2:]``, ``x[:, 1:-1]``."""
    start, stop = call.bounds
    part = f"{'' if start is None else start}:{'' if stop is None else stop}"
    if call.dim >= 0:
        return f"{code}[{', '.join([':'] * call.dim + [part])}]"
    return f"{code}[{', '.join(['...', part] + [':'] * (-call.dim - 1))}]"


class Concatenated(Structural):
    """``cat((a, b, ...), dim=D)``: arguments (a, b, ..., D)."""

    kind = CAT
    spelling = "cat"
    stem = "joined"

    @property
    def operands(self) -> int:  # type: ignore[override]
        return len(self.args) - 1

    @property
    def dim(self) -> int:
        return int(self.args[-1])

    def spelled(self, printer: sympy.printing.str.StrPrinter) -> str:
        parts = ", ".join(printer._print(o) for o in self.operand_exprs)
        return f"cat(({parts}), dim={self.dim})"


class Stacked(Concatenated):
    """``stack((a, b, ...), dim=D)``: arguments (a, b, ..., D); operands of one shape, joined along a new
    dimension (a cat's kind of node: each operand's gradient is its part of g)."""

    spelling = "stack"
    stem = "stacked"

    def spelled(self, printer: sympy.printing.str.StrPrinter) -> str:
        return "stack" + super().spelled(printer).removeprefix("cat")


class Reshaping(Structural):
    """The operand's elements in another shape, in the same order: its gradient is g reshaped back."""

    kind = RESHAPE
    nargs = 2


class Reshaped(Reshaping):
    """``reshape(e, (d0, d1, ...))``, one of them -1: arguments (e, Tuple of the sizes)."""

    spelling = "reshape"
    stem = "reshaped"

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.args[1])

    def _parameters(self) -> str:
        return f", {self.sizes}" if len(self.sizes) != 1 else f", ({self.sizes[0]},)"


class Unsqueezed(Reshaping):
    """``unsqueeze(e, d)``: arguments (e, d)."""

    spelling = "unsqueeze"
    stem = "unsqueezed"

    @property
    def dim(self) -> int:
        return int(self.args[1])

    def _parameters(self) -> str:
        return f", {self.dim}"


class Squeezed(Unsqueezed):
    """``squeeze(e, d)``, of a dimension of size 1: arguments (e, d)."""

    spelling = "squeeze"
    stem = "squeezed"


class Flattened(Reshaping):
    """``flatten(e, start_dim=a, end_dim=b)``: arguments (e, a, b)."""

    spelling = "flatten"
    stem = "flat"
    nargs = 3

    @property
    def dims(self) -> tuple[int, int]:
        return int(self.args[1]), int(self.args[2])

    def _parameters(self) -> str:
        return f", start_dim={self.dims[0]}, end_dim={self.dims[1]}"


RESHAPES: dict[str, type[Reshaping]] = {c.spelling: c for c in (Reshaped, Unsqueezed, Squeezed, Flattened)}


class Indexing(Structural):
    """one_hot and gather: their index may carry an ignored value k (:meth:`ignoring`), a last argument.

    Inside ``where(t == k, a, b)``'s ``b`` (or ``where(t != k, a, b)``'s ``a``) only elements where t is not
    k are used, so there the index reads ``torch.where(t == k, 0, t)``: a valid index wherever t is k (an
    ignore_index such as -100, outside [0, C)), t itself elsewhere. Cross-entropy with ignore_index is then
    torch's, whatever the caller passes at the ignored positions."""

    index_position = 0

    @property
    def ignore(self) -> sympy.Expr | None:
        """The value the index may hold where the result is not used (an Integer or an int scalar's symbol)."""
        return self.args[self.nargs_fixed] if len(self.args) > self.nargs_fixed else None

    def ignoring(self, value: sympy.Expr) -> Indexing:
        return type(self)(*self.args[: self.nargs_fixed], value)

    def index_code(self, index: str) -> str:
        """Torch code of the index named ``index`` as this call reads it."""
        return index if self.ignore is None else f"torch.where({index} == {self.ignore}, 0, {index})"


class OneHot(Indexing):
    """``one_hot(t, num_classes=C)``: arguments (t, C). t holds int64 class indices in [0, C); the result is
    float (the dtype of the op's floating-point inputs), t's shape with a last dimension C. It has no
    gradient: its operand is an integer tensor. C is a literal, or an int scalar's symbol (a value it reads,
    whose default is the example's)."""

    kind = ONE_HOT
    spelling = "one_hot"
    stem = "one_hot"
    nargs = (2, 3)
    nargs_fixed = 2

    @property
    def classes(self) -> sympy.Expr:
        """The number of classes: an Integer, or an int scalar's symbol."""
        return self.args[1]

    def _parameters(self) -> str:
        return f", num_classes={self.classes}"


class Gather(Indexing):
    """``gather(e, dim=D, index=t)``, as torch.gather: arguments (e, t, D). t is an int64 tensor argument of
    e's rank, each index in [0, e.size(D)); the result has t's shape. e's gradient scatters g back to the
    positions read (summed where an index repeats); t has none."""

    kind = GATHER
    spelling = "gather"
    stem = "gathered"
    operands = 2
    nargs = (3, 4)
    nargs_fixed = 3
    index_position = 1

    @property
    def dim(self) -> int:
        return int(self.args[2])

    def spelled(self, printer: sympy.printing.str.StrPrinter) -> str:
        return f"gather({printer._print(self.args[0])}, dim={self.dim}, index={printer._print(self.args[1])})"


class ArgIndex(Structural):
    """``argmax(e, dim=D, keepdim=K)`` and ``argmin``, as torch's: arguments (e, D, K). The result is int64,
    the position of the first largest (smallest) element along D, e's shape without D (1 there where
    keepdim): indices in [0, e.size(D)), usable by one_hot and gather. It has no gradient (zero for e)."""

    kind = ARG_INDEX
    nargs = 3

    @property
    def dim(self) -> int:
        return int(self.args[1])

    @property
    def keepdim(self) -> bool:
        return bool(self.args[2])

    def _parameters(self) -> str:
        return f", dim={self.dim}" + (", keepdim=True" if self.keepdim else "")


class ArgMax(ArgIndex):
    spelling = "argmax"
    stem = "index"


class ArgMin(ArgIndex):
    spelling = "argmin"
    stem = "index"


ARG_INDICES: dict[str, type[ArgIndex]] = {c.spelling: c for c in (ArgMax, ArgMin)}
REDUCTIONS: dict[str, type[Reduction]] = {c.spelling: c for c in (ReduceSum, ReduceMean, LogSumExp, AMax, AMin)}
SOFTMAXES: dict[str, type[Softmax]] = {c.spelling: c for c in (Softmax, LogSoftmax)}
SCANS: dict[str, type[Scan]] = {c.spelling: c for c in (CumSum, CumProd)}
#: The calls of one expression along one required dim (``softmax(e, dim=-1)``, ``cumsum(e, dim=0)``).
ALONG_ONE_DIM: dict[str, type[Softmax] | type[Scan]] = {**SOFTMAXES, **SCANS}
#: Every spelling a forward may call, besides the elementwise functions of :mod:`.functions`.
SPELLINGS = (
    frozenset(REDUCTIONS)
    | frozenset(ALONG_ONE_DIM)
    | frozenset(RESHAPES)
    | frozenset(ARG_INDICES)
    | {"transpose", "cat", "stack", "one_hot", "gather"}
)


#: Every placeholder class. (sympy's printers look a Function subclass's method up by its own class name
#: only, so a printer names each.)
CLASSES: tuple[type[Structural], ...] = (
    *REDUCTIONS.values(),
    *SOFTMAXES.values(),
    *SCANS.values(),
    MatrixProduct,
    Transposed,
    Sliced,
    Concatenated,
    Stacked,
    *RESHAPES.values(),
    OneHot,
    Gather,
    *ARG_INDICES.values(),
)


class _LanguagePrinter(sympy.printing.str.StrPrinter):
    def _print_Structural(self, expr: Structural) -> str:
        return expr.spelled(self)

    def _print_Piecewise(self, expr: sympy.Piecewise) -> str:
        """A condition used as a number (``m``, ``x > 0`` times something) as ``where(c, 1, 0)``."""
        if len(expr.args) == 2 and (expr.args[0].expr, expr.args[1]) == (1, (0, sympy.true)):
            condition = expr.args[0].cond
            text = self._print(condition)
            return f"where({text[1:-1] if isinstance(condition, (sympy.Eq, sympy.Ne)) else text}, 1, 0)"
        return self._print_Basic(expr)

    def _print_Relational(self, expr: sympy.core.relational.Relational) -> str:
        """Comparisons as Python writes them: ``(m != 0)`` (a bool tensor's condition), ``(t == 0)``, in
        parentheses, which ``&`` and ``|`` need."""
        if expr.rel_op not in ("==", "!="):
            return super()._print_Relational(expr)
        return f"({self._print(expr.lhs)} {expr.rel_op} {self._print(expr.rhs)})"


for _class in CLASSES:
    setattr(_LanguagePrinter, f"_print_{_class.__name__}", _LanguagePrinter._print_Structural)


def spelled(expr: sympy.Basic) -> str:
    """``expr`` as the language writes it (sympy's str, with reductions and products in their spelling)."""
    return _LanguagePrinter().doprint(expr)


def has_structural(expr: sympy.Basic) -> bool:
    return expr.has(Structural)


def example(spelling: str) -> str:
    """How the language writes a call to ``spelling``."""
    if spelling in REDUCTIONS:
        return f"{spelling}(x, dim=-1, keepdim=True)"
    if spelling in ALONG_ONE_DIM:
        return f"{spelling}(x, dim=-1)"
    if spelling in ("cat", "stack"):
        return f"{spelling}((x, y), dim=-1)"
    if spelling in RESHAPES:
        return {
            "reshape": "reshape(x, (-1, 12))",
            "flatten": "flatten(x, start_dim=-2, end_dim=-1)",
        }.get(spelling, f"{spelling}(x, -1)")
    if spelling in ARG_INDICES:
        return f"{spelling}(x, dim=-1)"
    if spelling == "gather":
        return "gather(x, dim=-1, index=t), t an int64 tensor of x's rank"
    if spelling == "one_hot":
        return "one_hot(t, num_classes=10), t an int64 tensor"
    return "transpose(x, -1, -2)"


# -- shapes -------------------------------------------------------------------------------------------------


class ShapeError(ValueError):
    """Shapes that do not fit together; the message names them (stage 3 adds the line)."""


def normalized_dim(dim: int, rank: int, what: str) -> int:
    """``dim`` counted from the front of a value of rank ``rank``, or a ShapeError."""
    if not -rank <= dim < rank:
        valid = f"-{rank} to {rank - 1}" if rank else "none: it has no dimensions"
        raise ShapeError(f"dim={dim} is out of range for {what} (valid: {valid})")
    return dim % rank


def result_shape(call: Structural, shapes: tuple[tuple[int, ...], ...], what: tuple[str, ...]) -> tuple[int, ...]:
    """The shape of ``call`` applied to operands of ``shapes`` (described as ``what`` in messages)."""
    if isinstance(call, Reduction):
        (shape,) = shapes
        dims = _reduced_dims(call, shape, what[0])
        if call.keepdim:
            return tuple(1 if i in dims else n for i, n in enumerate(shape))
        return tuple(n for i, n in enumerate(shape) if i not in dims)
    if isinstance(call, (Softmax, Scan)):
        normalized_dim(call.dim, len(shapes[0]), what[0])
        return shapes[0]
    if isinstance(call, ArgIndex):
        (shape,) = shapes
        d = normalized_dim(call.dim, len(shape), what[0])
        return tuple(1 if i == d else n for i, n in enumerate(shape) if i != d or call.keepdim)
    if isinstance(call, OneHot):
        return (*shapes[0], int(call.classes))  # (the caller puts an int scalar's default in)
    if isinstance(call, Gather):
        return gather_shape(call, *shapes, *what)
    if isinstance(call, Transposed):
        (shape,) = shapes
        d0, d1 = (normalized_dim(d, len(shape), what[0]) for d in call.dims)
        swapped = list(shape)
        swapped[d0], swapped[d1] = shape[d1], shape[d0]
        return tuple(swapped)
    if isinstance(call, Sliced):
        return sliced_shape(call, shapes[0], what[0])
    if isinstance(call, Stacked):
        different = [w for s, w in zip(shapes[1:], what[1:]) if s != shapes[0]]
        if different:
            raise ShapeError(f"stack needs operands of one shape: {what[0]} and {different[0]} differ")
        d = normalized_dim(call.dim, len(shapes[0]) + 1, "the stacked result")
        return (*shapes[0][:d], len(shapes), *shapes[0][d:])
    if isinstance(call, Concatenated):
        return cat_shape(call, shapes, what)
    if isinstance(call, Reshaping):
        return reshaped_shape(call, shapes[0], what[0])
    return matmul_shape(*shapes, *what)


def reshaped_shape(call: Reshaping, shape: tuple[int, ...], what: str) -> tuple[int, ...]:
    """The shape ``call`` gives a value of ``shape``, as torch's; a squeeze of a dimension that is not 1,
    or sizes that do not hold the elements, refused."""
    if isinstance(call, Squeezed):
        d = normalized_dim(call.dim, len(shape), what)
        if shape[d] != 1:
            raise ShapeError(f"squeeze at dim={call.dim} of {what}: that dimension has size {shape[d]}, not 1")
        return shape[:d] + shape[d + 1 :]
    if isinstance(call, Unsqueezed):
        d = normalized_dim(call.dim, len(shape) + 1, what + " unsqueezed")
        return (*shape[:d], 1, *shape[d:])
    if isinstance(call, Flattened):
        start, end = (normalized_dim(d, max(len(shape), 1), what) for d in call.dims)
        if start > end:
            raise ShapeError(f"flatten of {what}: start_dim={call.dims[0]} comes after end_dim={call.dims[1]}")
        return (*shape[:start], _count(shape[start : end + 1]), *shape[end + 1 :])
    assert isinstance(call, Reshaped)
    total, known = _count(shape), _count(tuple(d for d in call.sizes if d != -1))
    fits = total % known == 0 if -1 in call.sizes else total == known
    if not fits:
        raise ShapeError(
            f"reshape of {what}, {total} elements, to {call.sizes}: "
            + (f"{total} is not a multiple of {known}" if -1 in call.sizes else f"that holds {known}")
        )
    return tuple(total // known if d == -1 else d for d in call.sizes)


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


def sliced_shape(call: Sliced, shape: tuple[int, ...], what: str) -> tuple[int, ...]:
    """The shape of ``call`` of a value of ``shape``: Python's slice of the sliced dimension; an empty
    slice is refused."""
    d = normalized_dim(call.dim, len(shape), what)
    size = len(range(shape[d])[slice(*call.bounds)])
    if size == 0:
        start, stop = call.bounds
        raise ShapeError(
            f"{start if start is not None else ''}:{stop if stop is not None else ''} at dim={call.dim} of {what} "
            f"takes no elements (that dimension has {shape[d]})"
        )
    return (*shape[:d], size, *shape[d + 1 :])


def cat_shape(call: Concatenated, shapes: tuple[tuple[int, ...], ...], what: tuple[str, ...]) -> tuple[int, ...]:
    """torch.cat's result shape: operands of one rank, the same sizes but along dim, where they add up."""
    ranks = {len(s) for s in shapes}
    if len(ranks) > 1:
        listed = ", ".join(what)
        raise ShapeError(f"cat needs operands with the same number of dimensions: {listed}")
    d = normalized_dim(call.dim, len(shapes[0]), what[0])
    for shape, described in zip(shapes[1:], what[1:]):
        if shape[:d] + shape[d + 1 :] != shapes[0][:d] + shapes[0][d + 1 :]:
            raise ShapeError(f"cat along dim={call.dim}: {what[0]} and {described} differ in another dimension")
    return (*shapes[0][:d], sum(s[d] for s in shapes), *shapes[0][d + 1 :])


def gather_shape(call: Gather, shape: tuple[int, ...], index: tuple[int, ...], what: str, index_what: str):
    """torch.gather's result shape: the index's, which has the operand's rank and, away from dim, no larger
    sizes."""
    dim = normalized_dim(call.dim, len(shape), what)
    if len(index) != len(shape):
        raise ShapeError(f"gather of {what} by {index_what}: the index must have as many dimensions as the operand")
    if any(m > n for d, (m, n) in enumerate(zip(index, shape)) if d != dim):
        raise ShapeError(
            f"gather of {what} by {index_what}: the index is larger than the operand in a dimension other "
            f"than dim={call.dim}"
        )
    return index


def reduced_dims(call: Reduction, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The dimensions ``call`` reduces, counted from the front, sorted (all of them where dim is omitted)."""
    return _reduced_dims(call, shape, "the operand")


def _reduced_dims(call: Reduction, shape: tuple[int, ...], what: str) -> tuple[int, ...]:
    if not call.dims:
        return tuple(range(len(shape)))
    dims = [normalized_dim(d, len(shape), what) for d in call.dims]
    if len(set(dims)) < len(dims):
        raise ShapeError(f"dim={tuple(call.dims)} names a dimension of {what} twice")
    return tuple(sorted(dims))


def matmul_shape(a: tuple[int, ...], b: tuple[int, ...], a_what: str, b_what: str) -> tuple[int, ...]:
    """torch.matmul's result shape: vectors are promoted and their dimension removed again, batch
    dimensions broadcast."""
    if not a or not b:
        zero = a_what if not a else b_what
        raise ShapeError(f"@ needs operands with at least one dimension; {zero} has none")
    left = (1, *a) if len(a) == 1 else a
    right = (*b, 1) if len(b) == 1 else b
    if left[-1] != right[-2]:
        raise ShapeError(f"@ of {a_what} and {b_what}: the inner dimensions {left[-1]} and {right[-2]} differ")
    batch = _broadcast_batch(left[:-2], right[:-2], a, b, a_what, b_what)
    shape = (*batch, left[-2], right[-1])
    if len(a) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(b) == 1:
        shape = shape[:-1]
    return shape


def _broadcast_batch(left, right, a, b, a_what, b_what) -> tuple[int, ...]:
    rank = max(len(left), len(right))
    left, right = (1,) * (rank - len(left)) + tuple(left), (1,) * (rank - len(right)) + tuple(right)
    batch = []
    for m, n in zip(left, right):
        if m != n and 1 not in (m, n):
            raise ShapeError(
                f"@ of {a_what} and {b_what}: the batch dimensions {list(left)} and {list(right)} do not broadcast"
            )
        batch.append(max(m, n))
    return tuple(batch)


# -- stable forms ------------------------------------------------------------------------------------------


def stable_forms(expr: sympy.Basic) -> sympy.Basic:
    """``expr`` with the textbook forms of logsumexp, softmax and log_softmax replaced by the operations
    themselves, which are finite where their textbook forms overflow (x = 1000), in forward and backward:

    * ``log(sum(exp(e), dim))`` -> ``logsumexp(e, dim)``;
    * ``exp(e) / sum(exp(e), dim=d, keepdim=True)`` and ``exp(e - logsumexp(e, dim=d, keepdim=True))``
      -> ``softmax(e, dim=d)``;
    * ``log(softmax(e, dim=d))`` and ``e - logsumexp(e, dim=d, keepdim=True)`` -> ``log_softmax(e, dim=d)``
      (``e - logsumexp`` is finite too, but loses e's digits to the cancellation: at e = 1000 float32 keeps
      1e-4), and ``exp(log_softmax(e, dim=d))`` -> ``softmax(e, dim=d)``.
    """
    if not expr.args:
        return expr
    args = [stable_forms(a) for a in expr.args]
    if any(a is not b for a, b in zip(args, expr.args)):
        expr = expr.func(*args)
    return _stable_form(expr)


def _stable_form(expr: sympy.Basic) -> sympy.Basic:
    if isinstance(expr, sympy.log):
        (inner,) = expr.args
        if isinstance(inner, ReduceSum) and isinstance(inner.args[0], sympy.exp):
            return LogSumExp(inner.args[0].args[0], *inner.args[1:])
        if type(inner) is Softmax:
            return LogSoftmax(*inner.args)
    if isinstance(expr, sympy.exp):
        (inner,) = expr.args
        if isinstance(inner, LogSoftmax):
            return Softmax(*inner.args)
        along = _minus_logsumexp(inner)
        if along is not None:
            return Softmax(*along)
    if isinstance(expr, sympy.Add):
        along = _minus_logsumexp(expr)
        if along is not None:
            return LogSoftmax(*along)
    if isinstance(expr, sympy.Mul):
        for factor in expr.args:
            base, exponent = factor.as_base_exp()
            if exponent != -1 or not _one_dim_kept(base, ReduceSum) or not isinstance(base.args[0], sympy.exp):
                continue
            numerator = base.args[0]
            if numerator in expr.args:
                # By equality, not identity: the numerator and the sum's exp are one object only while
                # sympy's cache holds it (a full cache made this Softmax(x)*exp(x)).
                rest = list(expr.args)
                rest.remove(factor)
                rest.remove(numerator)
                return sympy.Mul(Softmax(numerator.args[0], base.args[1][0]), *rest)
    return expr


def _one_dim_kept(expr: sympy.Basic, kind: type[Reduction]) -> bool:
    return isinstance(expr, kind) and len(expr.args[1]) == 1 and expr.keepdim


def _minus_logsumexp(expr: sympy.Basic) -> tuple[sympy.Expr, sympy.Integer] | None:
    """(e, d) where ``expr`` is ``e - logsumexp(e, dim=d, keepdim=True)``."""
    if not isinstance(expr, sympy.Add):
        return None
    for term in expr.args:
        if term.could_extract_minus_sign() and _one_dim_kept(-term, LogSumExp):
            lse = -term
            if sympy.Add(*[t for t in expr.args if t is not term]) == lse.args[0]:
                return lse.args[0], lse.args[1][0]
    return None
