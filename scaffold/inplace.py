"""Stage 6b: printed code reuses its own temporaries' memory (in-place operations) where nobody records it.

Eager PyTorch allocates every result: ``x * torch.sigmoid(c * (k * x**3 + x))`` allocates five tensors of
x's size for one it returns. On a CPU each fresh allocation of that size is fresh pages for the kernel to
fault in, and at 4M float32 elements that costs as much as the arithmetic (gelu_tanh's fwd+bwd, measured:
1.08x of plain autograd out of place, 0.51x in place). Plain autograd cannot reuse a temporary: it keeps
them for backward. A custom Function's forward and backward are not recorded, so they can:
``(x**3).mul_(k).add_(x).mul_(c).sigmoid_().mul_(x)`` allocates once.

The rewrite works on the printed source of one function (``ast``), statement by statement, and turns an
operation in place only where that cannot change a result:

* the tensor it overwrites is the operation's own operand and is *fresh*: the result of an arithmetic or
  elementwise torch operation of the same statement, or a temporary that such an operation assigned, read
  here for the last time, once in the statement, and never passed anywhere it could be kept (returned,
  assigned to another name, ``sum_to_size``d: those may alias it);
* it is a float tensor (never a bool mask), and the result has its shape and dtype: the other operand is a
  Python number, or a tensor computed from a subset of the arguments it was computed from. Every printed
  operation is elementwise, so a tensor's shape is the broadcast of its arguments' shapes, and its dtype
  their promotion: a subset broadcasts into it and promotes to it. Under ``torch.func.vmap`` a subset is
  batched only where the receiver is;
* the operation has an in-place form (``mul_``, ``sigmoid_``, ``clamp_``, ...); ``a * b`` and ``a + b``
  may write into ``b``; ``torch.where(mask, 0, t)`` is ``t.masked_fill_(mask, 0)``.

Forward and backward of a Function run unrecorded, except that torch.func transforms differentiate
backward's code themselves: the generated backward then runs it through ``torch.func.functionalize``,
which makes its in-place operations out-of-place again (see ``templates/op.py.j2``). torch.compile traces
the forward, and torch 2.11's Dynamo loses the gradient of an output an in-place operation wrote
(pytorch#180642): the Function's twin for torch.compile (``templates/_apply.py.j2``) has the forward as
written, before this rewrite.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass, field

from . import functions
from .printing import PRINTED_FUNCTIONS, PRINTED_MASK_FUNCTIONS, PRINTED_METHODS

#: torch functions whose result is a fresh float tensor (given float tensor arguments): the registry's, and
#: what the printer writes besides them.
_FRESH_CALLS = (
    frozenset({f.torch for f in functions.ENTRIES if f.torch} | {f.kernel for f in functions.ENTRIES if f.kernel})
    | PRINTED_FUNCTIONS
)
#: torch functions of one tensor with an in-place method of that tensor (the other arguments unchanged).
_METHODS = {
    name: name.rsplit(".", 1)[1] + "_"
    for name in (
        "torch.exp", "torch.expm1", "torch.exp2", "torch.log", "torch.log1p", "torch.log2", "torch.log10",
        "torch.sin", "torch.cos", "torch.tan", "torch.asin", "torch.acos", "torch.atan", "torch.sinh",
        "torch.cosh", "torch.tanh", "torch.asinh", "torch.acosh", "torch.atanh", "torch.erf", "torch.erfc",
        "torch.erfinv", "torch.lgamma", "torch.digamma", "torch.abs", "torch.sign", "torch.sigmoid",
        "torch.clamp", "torch.logit", "torch.atan2", "torch.hypot", "torch.sqrt", "torch.rsqrt",
    )
}  # fmt: skip
#: torch.nn.functional activations that take ``inplace=True``.
_INPLACE_KEYWORD = frozenset({"torch.nn.functional.silu", "torch.nn.functional.mish"})
_BINARY = {ast.Add: "add_", ast.Sub: "sub_", ast.Mult: "mul_", ast.Div: "div_", ast.Pow: "pow_"}
_COMMUTATIVE = (ast.Add, ast.Mult)

TENSOR, BOOL, NUMBER, OTHER = "tensor", "bool", "number", "other"


@dataclass(frozen=True)
class Kind:
    """What a value is: a float ``tensor`` (with the arguments its shape broadcasts from), a ``bool`` mask,
    a Python ``number``, or anything ``other`` (a shape, a list, a view of something unknown)."""

    kind: str
    deps: frozenset[str] = frozenset()


OPAQUE = Kind(OTHER)
A_NUMBER = Kind(NUMBER)


@dataclass
class _Names:
    """What the function's statements do with each name: where it is read, and whether it may be kept
    by something (an escape) anywhere."""

    kinds: dict[str, Kind]
    assigned: set[str] = field(default_factory=set)
    owned: set[str] = field(default_factory=set)  # assigned from a fresh tensor operation
    escaped: set[str] = field(default_factory=set)
    last_read: dict[str, int] = field(default_factory=dict)  # name -> index of the last statement reading it
    reads: dict[tuple[int, str], int] = field(default_factory=dict)  # (statement, name) -> times read there


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


class _Rewriter:
    def __init__(self, kinds: Mapping[str, Kind]) -> None:
        self.names = _Names(dict(kinds))
        self.statement = -1

    # -- what each expression is ------------------------------------------------------------------------
    def kind(self, node: ast.expr) -> Kind:
        kinds = self.names.kinds
        if isinstance(node, ast.Constant):
            return A_NUMBER if isinstance(node.value, (int, float)) and not isinstance(node.value, bool) else OPAQUE
        if isinstance(node, ast.Name):
            return kinds.get(node.id, OPAQUE)
        if isinstance(node, ast.UnaryOp):
            inner = self.kind(node.operand)
            if isinstance(node.op, ast.USub) and inner.kind in (TENSOR, NUMBER):
                return inner
            return Kind(BOOL, inner.deps) if inner.kind == BOOL and isinstance(node.op, ast.Invert) else OPAQUE
        if isinstance(node, ast.BinOp):
            return self._binary_kind(node)
        if isinstance(node, ast.Compare):
            parts = [self.kind(n) for n in (node.left, *node.comparators)]
            if any(isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for op in node.ops):
                return OPAQUE
            if any(p.kind == TENSOR for p in parts) and all(p.kind in (TENSOR, NUMBER) for p in parts):
                return Kind(BOOL, frozenset().union(*(p.deps for p in parts)))
            return OPAQUE
        if isinstance(node, ast.Call):
            if (mask := _converted_mask(node)) is not None:  # (x > 0).to(x.dtype): a new float tensor
                inner = self.kind(mask)
                return Kind(TENSOR, inner.deps) if inner.kind == BOOL else OPAQUE
            return self._call_kind(node)
        return OPAQUE

    def _binary_kind(self, node: ast.BinOp) -> Kind:
        left, right = self.kind(node.left), self.kind(node.right)
        deps = left.deps | right.deps
        if isinstance(node.op, (ast.BitAnd, ast.BitOr)):
            return Kind(BOOL, deps) if left.kind == right.kind == BOOL else OPAQUE
        if type(node.op) not in _BINARY:
            return OPAQUE
        kinds = {left.kind, right.kind}
        if kinds == {NUMBER}:
            return A_NUMBER
        # a float tensor with numbers, other float tensors, or bool masks (which promote to it)
        if TENSOR in kinds and kinds <= {TENSOR, NUMBER, BOOL}:
            return Kind(TENSOR, deps)
        return OPAQUE

    def _call_kind(self, node: ast.Call) -> Kind:
        name = _dotted(node.func)
        if name is not None and name.startswith("math."):
            return A_NUMBER
        operands = _operands(node)
        if operands is None:
            return OPAQUE
        parts = [self.kind(a) for a in operands]
        if any(p.kind == OTHER for p in parts):
            return OPAQUE
        if name in PRINTED_MASK_FUNCTIONS:  # torch.logical_or(x, y): a new mask
            return Kind(BOOL, frozenset().union(*(p.deps for p in parts))) if parts else OPAQUE
        values = parts[1:] if name == "torch.where" else parts  # where's condition is a mask
        if not any(p.kind == TENSOR for p in values):
            return OPAQUE  # torch.where(mask, 1.0, 0.0) is float32 whatever the inputs are
        return Kind(TENSOR, frozenset().union(*(p.deps for p in parts)))

    def fresh(self, node: ast.expr) -> bool:
        """Whether ``node`` computes a new float tensor that nothing else refers to."""
        if self.kind(node).kind != TENSOR:
            return False
        if isinstance(node, ast.BinOp | ast.UnaryOp):
            return True
        return isinstance(node, ast.Call) and (_operands(node) is not None or _converted_mask(node) is not None)

    # -- first pass: reads and escapes ------------------------------------------------------------------
    def record(self, statement: int, node: ast.AST, consumed: bool) -> None:
        """Record the names read under ``node``; ``consumed``: as an operand of a fresh operation (read,
        not kept)."""
        if isinstance(node, ast.Name):
            key = (statement, node.id)
            self.names.reads[key] = self.names.reads.get(key, 0) + 1
            self.names.last_read[node.id] = statement
            if not consumed:
                self.names.escaped.add(node.id)
            return
        operands = _operands(node)
        operands_consumed = operands is not None or isinstance(node, ast.BinOp | ast.UnaryOp | ast.Compare)
        children = operands if operands is not None else list(ast.iter_child_nodes(node))
        for child in children:
            if isinstance(child, ast.expr):
                self.record(statement, child, operands_consumed)

    # -- second pass: the rewrite -----------------------------------------------------------------------
    def writable(self, node: ast.expr, original: ast.expr) -> bool:
        """Whether the value of ``original`` (rewritten as ``node``) may be overwritten here."""
        if self.kind(original).kind != TENSOR:
            return False
        if isinstance(original, ast.Name):
            name, names = original.id, self.names
            return (
                name in names.owned
                and name not in names.escaped
                and names.last_read.get(name) == self.statement
                and names.reads.get((self.statement, name)) == 1
            )
        return self.fresh(original)

    def fits(self, receiver: ast.expr, other: ast.expr) -> bool:
        """Whether ``receiver op other`` has the receiver's shape and dtype."""
        mine, theirs = self.kind(receiver), self.kind(other)
        return theirs.kind == NUMBER or (theirs.kind in (TENSOR, BOOL) and theirs.deps <= mine.deps)

    def rewrite(self, node: ast.expr) -> ast.expr:
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY and self.kind(node).kind == TENSOR:
            left, right = self.rewrite(node.left), self.rewrite(node.right)
            method = _BINARY[type(node.op)]
            if self.writable(left, node.left) and self.fits(node.left, node.right):
                return _method(left, method, [right])
            if (
                isinstance(node.op, _COMMUTATIVE)
                and self.writable(right, node.right)
                and self.fits(node.right, node.left)
            ):
                return _method(right, method, [left])
            return ast.BinOp(left, node.op, right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and self.kind(node).kind == TENSOR:
            operand = self.rewrite(node.operand)
            if self.writable(operand, node.operand):
                return _method(operand, "neg_", [])
            return ast.UnaryOp(node.op, operand)
        if _operands(node) is not None and self.kind(node).kind == TENSOR:
            return self._rewrite_call(node)
        if isinstance(node, ast.Call | ast.Attribute | ast.BinOp | ast.UnaryOp | ast.Compare | ast.Tuple | ast.BoolOp):
            # other calls, tuples, conditions: their operands may still be rewritten inside
            return _map_children(node, self.rewrite)
        return node

    def _rewrite_call(self, node: ast.Call) -> ast.expr:
        name = _dotted(node.func)
        args = [self.rewrite(a) for a in node.args]
        keywords = [ast.keyword(k.arg, self.rewrite(k.value)) for k in node.keywords]
        if name not in _FRESH_CALLS:  # a method: tensor.clamp(min=0)
            receiver = self.rewrite(node.func.value)
            others = [*node.args, *(k.value for k in node.keywords)]
            if self.writable(receiver, node.func.value) and all(self.fits(node.func.value, o) for o in others):
                return _method(receiver, node.func.attr + "_", args, keywords)
            return _method(receiver, node.func.attr, args, keywords)
        if name == "torch.where" and (filled := self._masked_fill(node, args)) is not None:
            return filled
        if node.args and self.writable(args[0], node.args[0]):
            others = [*node.args[1:], *(k.value for k in node.keywords)]
            if all(self.fits(node.args[0], o) for o in others):
                if name in _METHODS:
                    return _method(args[0], _METHODS[name], args[1:], keywords)
                if name in _INPLACE_KEYWORD and not node.keywords:
                    return ast.Call(node.func, args, [ast.keyword("inplace", ast.Constant(True))])
        return ast.Call(node.func, args, keywords)

    def _masked_fill(self, node: ast.Call, args: list[ast.expr]) -> ast.expr | None:
        """``torch.where(mask, number, t)`` as ``t.masked_fill_(mask, number)`` (``~mask`` for the number
        second) where ``t`` may be overwritten and the mask fits it: where() allocates its result and on a
        CPU takes 2.5x the time (log(p) with a guard, 4M float32 elements, one thread)."""
        if len(node.args) != 3 or node.keywords:
            return None
        mask, first, second = node.args
        if self.kind(mask).kind != BOOL or not self.fits(first if self.kind(second).kind == NUMBER else second, mask):
            return None
        if self.kind(first).kind == NUMBER and self.writable(args[2], second):
            return _method(args[2], "masked_fill_", [args[0], args[1]])
        if self.kind(second).kind == NUMBER and self.writable(args[1], first):
            return _method(args[1], "masked_fill_", [ast.UnaryOp(ast.Invert(), args[0]), args[2]])
        return None


def _converted_mask(node: ast.Call) -> ast.expr | None:
    """The mask of ``mask.to(dtype)`` (a step printed as a comparison), else None."""
    if isinstance(node.func, ast.Attribute) and node.func.attr == "to" and len(node.args) == 1 and not node.keywords:
        return node.func.value
    return None


def _operands(node: ast.AST) -> list[ast.expr] | None:
    """What a call of an elementwise operation with a fresh result computes from (the tensor first, for a
    method); None for anything else."""
    if not isinstance(node, ast.Call):
        return None
    values = [*node.args, *(k.value for k in node.keywords)]
    if _dotted(node.func) in _FRESH_CALLS | PRINTED_MASK_FUNCTIONS:
        return values
    if isinstance(node.func, ast.Attribute) and node.func.attr in PRINTED_METHODS:
        return [node.func.value, *values]
    return None


def _method(receiver: ast.expr, name: str, args: list[ast.expr], keywords: list[ast.keyword] | None = None) -> ast.Call:
    return ast.Call(ast.Attribute(receiver, name, ast.Load()), args, keywords or [])


def _map_children(node: ast.expr, function) -> ast.expr:
    new = type(node)(**{f: getattr(node, f) for f in node._fields})
    for field_name, value in ast.iter_fields(node):
        if isinstance(value, ast.expr):
            setattr(new, field_name, function(value))
        elif isinstance(value, list):
            setattr(new, field_name, [function(v) if isinstance(v, ast.expr) else v for v in value])
    return new


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The simple statements of ``body`` in order, those inside ``if`` blocks included."""
    found = []
    for statement in body:
        if isinstance(statement, ast.If):
            found.append(statement)  # its condition is read here
            found.extend(_statements(statement.body))
            found.extend(_statements(statement.orelse))
        else:
            found.append(statement)
    return found


def _assigned_name(statement: ast.stmt) -> str | None:
    """The name ``statement`` assigns, where it is ``name = expression``."""
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
        return statement.targets[0].id
    return None


def reuse_temporaries(source: str, function: str, kinds: Mapping[str, Kind]) -> str:
    """``source`` (a module) with ``function`` (``"name"`` or ``"Class.method"``) rewritten to compute in
    place where it can; ``kinds``: what its parameters are (the others are treated as opaque)."""
    tree = ast.parse(source)
    target = _find(tree, function)
    rewriter = _Rewriter(kinds)
    statements = _statements(target.body)
    names = rewriter.names
    for index, statement in enumerate(statements):
        if isinstance(statement, ast.If):
            rewriter.record(index, statement.test, True)
        elif (name := _assigned_name(statement)) is not None:
            rewriter.record(index, statement.value, False)
            if name in names.assigned or name in kinds:
                # assigned again (grad_x = grad_x + part): which value a read sees depends on the path
                # taken, and the first may alias an argument (a sum_to_size of grad_output itself)
                names.escaped.add(name)
                names.kinds[name] = OPAQUE
            else:
                names.kinds[name] = rewriter.kind(statement.value)
            names.assigned.add(name)
            if rewriter.fresh(statement.value):
                names.owned.add(name)
        elif isinstance(statement, ast.Return | ast.Expr) and statement.value is not None:
            rewriter.record(index, statement.value, False)
        else:  # anything else keeps every name it mentions
            for node in ast.walk(statement):
                if isinstance(node, ast.Name):
                    names.escaped.add(node.id)
                    if isinstance(node.ctx, ast.Store):
                        names.assigned.add(node.id)
                        names.kinds[node.id] = OPAQUE
    # The second pass sees each name's kind as the first pass left it: as assigned, or opaque where a name
    # is assigned twice.
    lines = source.splitlines(keepends=True)
    replacements = []
    for index, statement in enumerate(statements):
        name = _assigned_name(statement)
        if name is None and not (isinstance(statement, ast.Return) and statement.value is not None):
            continue
        rewriter.statement = index
        value = rewriter.rewrite(statement.value)
        if ast.dump(value) == ast.dump(statement.value):
            continue
        if isinstance(value, ast.Tuple):  # as printed: return a, b (ast.unparse adds parentheses)
            code = ", ".join(ast.unparse(element) for element in value.elts)
        else:
            code = ast.unparse(value)
        keyword = "return" if name is None else f"{name} ="
        text = f"{lines[statement.lineno - 1][: statement.col_offset]}{keyword} {code}\n"
        replacements.append((statement.lineno, statement.end_lineno, text))
    for start, end, text in reversed(replacements):
        lines[start - 1 : end] = [text]
    return "".join(lines)


def _find(tree: ast.Module, function: str) -> ast.FunctionDef:
    scope: list[ast.stmt] = tree.body
    *classes, name = function.split(".")
    for class_name in classes:
        scope = next(n for n in scope if isinstance(n, ast.ClassDef) and n.name == class_name).body
    return next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)
