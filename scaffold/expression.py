"""Stage 2: parse the forward expression into sympy, safely.

The text is parsed with Python's :mod:`ast` and every node is checked against an allow-list before a sympy
object is built from it; user text is never passed to ``eval``, ``sympify`` or ``parse_expr``. Numbers are
bounded so that no input makes sympy compute for ever (``2**10**10``).

A forward may be written in steps, one per line (or separated by ``;``): every line but the last is
``name = expression``, the last a bare expression or an assignment, and a name can be used on the lines
after it (``h = x*w + b`` then ``h*sigmoid(h)``). The op returns the last line's value, or the steps the
spec's ``outputs`` name (several: a tuple). Each output is the expression of its step with the steps before
it substituted; :mod:`.program` builds the graph of named values the later stages work on.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import math
import re
import warnings
from dataclasses import dataclass

import sympy

from . import functions, structural
from .errors import ExpressionError
from .limits import MAX_DEPTH, MAX_LENGTH
from .spec import OpSpec

#: Operators that chain: a sum or a product of many terms is one level of nesting, not one per term.
_CHAINS = ((ast.Add, ast.Sub), (ast.Mult, ast.Div))
MAX_NODES = 4000
MAX_INTEGER_DIGITS = 30
MAX_EXPONENT = 64
MAX_POWER_DIGITS = 300
#: Parts of a forward written in steps once they are substituted (each use of a step copies it).
MAX_SUBSTITUTED_NODES = 20000

CONSTANTS: dict[str, sympy.Expr] = {"pi": sympy.pi, "E": sympy.E, "e": sympy.E}
#: Every name a forward may call: the registry's functions, the structural nodes, Piecewise and where.
FUNCTION_NAMES = frozenset(functions.spellings()) | structural.SPELLINGS | {"Piecewise", "where"}
KNOWN_NAMES = FUNCTION_NAMES | frozenset(CONSTANTS) | {"True", "False"}

_COMPARISONS = {
    ast.Lt: sympy.StrictLessThan,
    ast.LtE: sympy.LessThan,
    ast.Gt: sympy.StrictGreaterThan,
    ast.GtE: sympy.GreaterThan,
    ast.Eq: sympy.Eq,
    ast.NotEq: sympy.Ne,
}


@dataclass(frozen=True)
class NamedStep:
    """A named intermediate of a forward written in steps, as written: ``h = x*w + b`` on line 1."""

    name: str
    text: str
    line: int
    value: sympy.Expr  # over the arguments, earlier steps substituted
    expr: sympy.Expr | None = None  # as written: over the arguments and earlier steps' symbols


#: The upstream gradient in a custom gradient's expression (``gradients.x = "grad"``).
GRAD = sympy.Symbol("grad", real=True)


@dataclass(frozen=True)
class ParsedExpression:
    """The forward as sympy, with the symbol of every argument (in call order). A forward written in steps
    has them in ``steps`` (for messages and docstrings); ``exprs``, one per output, have them substituted."""

    exprs: tuple[sympy.Expr, ...]  # one per output, over the arguments
    symbols: dict[str, sympy.Symbol]
    tensor_names: tuple[str, ...]
    scalar_names: tuple[str, ...]
    steps: tuple[NamedStep, ...] = ()
    output_text: str = ""  # the last line's expression as written, the name it assigns, or the outputs' names
    # Custom gradients: tensor name -> what backward returns for it, over the arguments and ``grads``.
    gradients: tuple[tuple[str, sympy.Expr], ...] = ()
    #: The names of the outputs, as the spec's ``outputs`` gives them ("" for one unnamed output).
    output_names: tuple[str, ...] = ("",)

    @property
    def expr(self) -> sympy.Expr:
        """The forward of an op with one output."""
        if len(self.exprs) != 1:
            raise ValueError(f"the op has {len(self.exprs)} outputs: use exprs")
        return self.exprs[0]

    @property
    def grads(self) -> tuple[sympy.Symbol, ...]:
        """The upstream gradient of each output in a custom gradient's expression: ``grad`` for one output,
        ``grad_<output>`` for several."""
        if len(self.exprs) == 1:
            return (GRAD,)
        return tuple(sympy.Symbol(f"{GRAD.name}_{name}", real=True) for name in self.output_names)

    @property
    def written(self) -> str:
        """The forward on one line, as written: ``h*sigmoid(h), where h = x*w + b``."""
        if not self.steps:
            return ""
        return f"{self.output_text}, where " + "; ".join(f"{s.name} = {s.text}" for s in self.steps)


def make_symbols(spec: OpSpec) -> dict[str, sympy.Symbol]:
    """One sympy symbol per argument: tensors and float scalars are real, int scalars integer."""
    symbols = {t.name: sympy.Symbol(t.name, real=True) for t in spec.tensors}
    for s in spec.scalars:
        assumptions = {"float": {"real": True}, "int": {"integer": True}, "bool": {}}[s.type]
        symbols[s.name] = sympy.Symbol(s.name, **assumptions)
    return symbols


def masked(spec: OpSpec, symbols: dict[str, sympy.Basic]) -> dict[str, sympy.Basic]:
    """``symbols`` with each bool tensor's name standing for the condition ``Ne(m, 0)`` (its symbol is
    real, as every tensor's): a condition in ``where``, ``&``, ``~``, 0/1 where a number is needed."""
    return {**symbols, **{t.name: sympy.Ne(symbols[t.name], 0) for t in spec.tensors if t.boolean}}


def parse_forward(spec: OpSpec) -> ParsedExpression:
    """Parse ``spec.forward`` into a sympy expression over the spec's arguments."""
    where = f"{spec.source}: forward"
    symbols = make_symbols(spec)
    for name in symbols:
        if name in KNOWN_NAMES and name not in structural.SPELLINGS:  # an argument may be called mean
            raise ExpressionError(
                f"argument name {name!r} is also the name of a function or constant in expressions",
                where=where,
                hint=f"rename the argument, e.g. to {name + '_'!r}",
            )
    exprs, steps, output_text = parse_steps(spec.forward, masked(spec, symbols), where=where, outputs=spec.outputs)
    sizes = dict(spec.sizes)
    for step in steps:
        if step.name in sizes:
            raise ExpressionError(
                f"step {step.name!r} has the name of a size in [sizes]",
                where=f"{where}, line {step.line}",
                hint=f"name the step differently, e.g. {step.name + '_1'!r}, or rename the size",
            )
    tensor_names = tuple(t.name for t in spec.tensors)
    named = [
        (f"output {n!r}" if n else f"the forward {spec.forward!r}", e) for n, e in zip(spec.outputs or ("",), exprs)
    ]
    for what, expr in named:
        if not isinstance(expr, sympy.Expr) or (isinstance(expr, sympy.logic.boolalg.Boolean) and not expr.is_Symbol):
            raise ExpressionError(
                f"{what} is a condition (a comparison or a bool tensor), not a number: an op returns "
                "floating-point values",
                where=where,
                hint="return it as 0/1 numbers, e.g. where(x > 0, 1.0, 0.0) or 1*(x > 0), and compare with 0.5 "
                "outside; or use Piecewise((value, condition), (other, True)) for an op defined by cases",
            )
        if not any(symbols[n] in expr.free_symbols for n in tensor_names):
            raise ExpressionError(
                f"{what} does not depend on any tensor argument ({', '.join(tensor_names)})",
                where=where,
                hint="use the declared tensors in the expression, or declare the names it uses with --tensor",
            )
        if expr.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo, sympy.I):
            raise ExpressionError(
                f"{what} simplifies to something infinite, undefined or complex",
                where=where,
                hint="check for a division by zero or a log of a negative constant",
            )
        _check_constants(expr, spec, symbols, where)
    parsed = ParsedExpression(
        exprs=exprs,
        symbols=symbols,
        tensor_names=tensor_names,
        scalar_names=tuple(s.name for s in spec.scalars),
        steps=steps,
        output_text=output_text,
        output_names=spec.outputs or ("",),
    )
    parsed = dataclasses.replace(parsed, gradients=_parse_gradients(spec, parsed))
    used = set().union(*(e.free_symbols for e in exprs))
    # a backward may read a tensor its forward does not (fairseq's LogSumExpMoE's posterior)
    used |= set().union(*(e.free_symbols for _, e in parsed.gradients))
    unused = [n for n in tensor_names if symbols[n] not in used]
    if unused:
        raise ExpressionError(
            f"tensor argument{'s' if len(unused) > 1 else ''} {', '.join(map(repr, unused))} "
            f"{'are' if len(unused) > 1 else 'is'} declared but not used in the forward",
            where=where,
            hint="remove the declaration or use it in the expression",
        )
    return parsed


def _parse_gradients(spec: OpSpec, parsed: ParsedExpression) -> tuple[tuple[str, sympy.Expr], ...]:
    """The custom gradients, parsed over the arguments, the forward's steps and the upstream gradients
    (``grad``, or ``grad_<output>`` for each of several outputs)."""
    if not spec.gradients:
        return ()
    names: dict[str, sympy.Basic] = {**masked(spec, parsed.symbols), **{s.name: s.value for s in parsed.steps}}
    for grad in parsed.grads:
        if grad.name in names:
            raise ExpressionError(
                f"{grad.name!r} names the upstream gradient in custom gradients, and also an argument or step",
                where=f"{spec.source}: gradients",
                hint=f"rename the argument or step {grad.name!r}",
            )
        names[grad.name] = grad
    gradients = []
    for name, text in spec.gradients:
        where = f"{spec.source}: gradients.{name}"
        if len(parsed.grads) > 1 and GRAD.name not in names and re.search(rf"\b{GRAD.name}\b", text):
            each = ", ".join(g.name for g in parsed.grads)
            raise ExpressionError(
                f"{GRAD.name!r} is the upstream gradient of an op with one output; this op has "
                f"{len(parsed.grads)}, each with its own: {each}",
                where=where,
                hint=f"write the gradient over those, e.g. {' + '.join(g.name for g in parsed.grads)}",
            )
        expr = parse_expression(text, names, where=where)
        if parsed.steps:
            _check_substituted_depth(_tree_measure((expr,))[1], "the gradient", where)
        if not isinstance(expr, sympy.Expr) or (isinstance(expr, sympy.logic.boolalg.Boolean) and not expr.is_Symbol):
            raise ExpressionError(f"the gradient {text!r} is a condition, not a number", where=where)
        _check_constants(expr, spec, parsed.symbols, where)
        gradients.append((name, expr))
    return tuple(gradients)


def _check_constants(expr: sympy.Basic, spec: OpSpec, symbols: dict[str, sympy.Symbol], where: str) -> None:
    """Every sub-expression without tensors is a finite real number (atanh(2) is not), also with the
    scalar arguments at their defaults (sqrt(alpha) with alpha = -1 is not)."""
    tensors = {symbols[t.name] for t in spec.tensors}
    numeric = [s for s in spec.scalars if s.type != "bool"]
    defaults = {symbols[s.name]: sympy.Number(s.default) for s in numeric}
    for node in sympy.preorder_traversal(expr):
        if node.free_symbols & tensors or node.is_Atom or not isinstance(node, sympy.Expr):
            continue
        value = node.xreplace(defaults).evalf(15)
        if not (value.is_real and value.is_finite) or value.has(sympy.nan, sympy.zoo):
            used = [f"{s.name} = {s.default!r}" for s in numeric if symbols[s.name] in node.free_symbols]
            context = f"with the default {', '.join(used)}, " if used else ""
            raise ExpressionError(
                f"{context}{sympy.sstr(node)} is not a finite real number",
                where=where,
                hint="keep constants and scalar defaults inside each function's domain",
            )


def parse_expression(text: str, symbols: dict[str, sympy.Symbol], *, where: str = "forward") -> sympy.Expr:
    """Parse ``text`` into sympy, allowing only arithmetic, known functions and the given names."""
    _check_length(text, where)
    if not text.strip():
        raise ExpressionError("the expression is empty", where=where)
    try:
        tree = _syntax_tree(text, "eval", where)
    except SyntaxError as exc:
        pointer = f" at column {exc.offset}" if exc.offset else ""
        raise ExpressionError(
            f"cannot parse {text.strip()!r}{pointer}: {exc.msg}",
            where=where,
            hint="write Python-style math, e.g. x / (1 + exp(-x)); powers are written **",
        ) from None
    count = sum(1 for _ in ast.walk(tree))
    if count > MAX_NODES:
        raise ExpressionError(f"the expression has more than {MAX_NODES} parts", where=where)
    return _Builder(text.strip(), symbols, where).build(tree.body, 0)


def _check_length(text: str, where: str) -> None:
    """Refuse text longer than :data:`.limits.MAX_LENGTH`, before anything parses it."""
    if len(text) > MAX_LENGTH:
        raise ExpressionError(f"the expression is longer than {MAX_LENGTH} characters", where=where)


def _syntax_tree(text: str, mode: str, where: str) -> ast.AST:
    """``text`` parsed by Python's parser (only parsed: nothing runs). Its SyntaxWarnings ("invalid decimal
    literal" and the like) are dropped: the error scaffold raises says it better. The parser recurses: text
    nested thousands of levels deep (``----x``) exhausts it long before the :data:`MAX_DEPTH` check."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(text.strip(), mode=mode)
    except (RecursionError, MemoryError):
        tree = None
    # where the parser got through (the recursion limit raised, by torch.compile for one), the same refusal
    if tree is None or _deeper_than(tree, PARSER_DEPTH):
        raise ExpressionError(
            f"the expression is nested more than {MAX_DEPTH} levels deep",
            where=where,
            hint="write it with fewer nested operations, or in steps, one per line",
        ) from None
    return tree


#: Nesting that the parser refuses at Python's default recursion limit, refused so whatever the limit is.
PARSER_DEPTH = 500


def _deeper_than(tree: ast.AST, depth: int) -> bool:
    """Whether ``tree`` is nested more than ``depth`` levels deep (walked without recursion)."""
    stack = [(tree, 0)]
    while stack:
        node, level = stack.pop()
        if level > depth:
            return True
        stack.extend((child, level + 1) for child in ast.iter_child_nodes(node))
    return False


def parse_steps(
    text: str, symbols: dict[str, sympy.Symbol], *, where: str = "forward", outputs: tuple[str, ...] = ()
) -> tuple[tuple[sympy.Expr, ...], tuple[NamedStep, ...], str]:
    """Parse a forward written in one expression or in steps: the value of each output (the steps
    ``outputs`` names, or else the last line) with every step substituted, the steps as written, and the
    returned value as written ("" for one expression)."""
    _check_length(text, where)
    try:
        _syntax_tree(text, "eval", where)
    except SyntaxError as exc:
        program = _parse_program(text, exc, where)
        if program is not None:
            return _build_program(text.strip(), program, symbols, where, outputs)
    if outputs:
        raise ExpressionError(
            f"outputs names {', '.join(map(repr, outputs))}, but the forward is one expression and names nothing",
            where=where,
            hint=f"write the forward in steps, one per line, e.g. {outputs[0]} = ..., or remove outputs",
        )
    return (parse_expression(text, symbols, where=where),), (), ""


def _parse_program(text: str, error: SyntaxError, where: str) -> ast.Module | None:
    """``text`` as statements, or None where it is no program (one expression with a syntax error, reported
    as such); a program with a syntax error is reported at its line."""
    if not text.strip():
        return None
    try:
        return _syntax_tree(text, "exec", where)
    except SyntaxError as exc:
        if "\n" not in text.strip() and ";" not in text:
            return None
        column = f", column {exc.offset}" if exc.offset else ""
        raise ExpressionError(
            f"cannot parse line {exc.lineno}{column}: {exc.msg}",
            where=where,
            hint="write one step per line, name = expression, and the result last, e.g. h = x*w + b then h*tanh(h)",
        ) from None


def _build_program(
    text: str, program: ast.Module, symbols: dict[str, sympy.Symbol], where: str, outputs: tuple[str, ...]
) -> tuple[tuple[sympy.Expr, ...], tuple[NamedStep, ...], str]:
    """The statements of a forward written in steps, checked, and the value of each output."""
    if sum(1 for _ in ast.walk(program)) > MAX_NODES:
        raise ExpressionError(f"the forward has more than {MAX_NODES} parts", where=where)
    values: dict[str, sympy.Basic] = dict(symbols)
    local: dict[str, sympy.Basic] = dict(symbols)  # the steps as symbols of their own
    steps: list[NamedStep] = []
    last, output_text = None, ""
    statements = program.body
    for i, statement in enumerate(statements):
        at = f"{where}, line {statement.lineno}"
        if isinstance(statement, ast.Expr) and i == len(statements) - 1:
            last = _Builder(text, values, at).build(statement.value, 0)
            output_text = ast.get_source_segment(text, statement.value) or ""
            if outputs:
                raise ExpressionError(
                    "the last line is a bare expression, but the op returns the steps outputs names",
                    where=at,
                    hint="name its value (value = ...) and list it in outputs, or remove the line",
                )
            continue
        name = _step_name(statement, values, symbols, at)
        values[name] = _Builder(text, values, at).build(statement.value, 0)
        written = _Builder(text, local, at).build(statement.value, 0)
        local[name] = sympy.Symbol(name, real=True)
        segment = ast.get_source_segment(text, statement.value) or ""
        steps.append(NamedStep(name, segment, statement.lineno, values[name], written))
    if outputs:
        assigned = [s.name for s in steps]
        for name in outputs:
            if name not in assigned:
                raise ExpressionError(
                    f"output {name!r} is not assigned in the forward (its steps: {', '.join(assigned)})",
                    where=where,
                    hint=f"add a line {name} = ..., or list only the steps the forward has",
                )
        exprs = tuple(values[name] for name in outputs)
        output_text = ", ".join(outputs)
    elif last is None:  # the last line assigns: its name is the result
        exprs, output_text = (values[steps[-1].name],), steps[-1].name
    else:
        exprs = (last,)
    returned = set(outputs) if outputs else ({steps[-1].name} if last is None else set())
    used = {n.id for s in statements for n in ast.walk(s.value) if isinstance(n, ast.Name)}
    listed = ", or list it in outputs" if outputs else ""
    for step in steps:
        if step.name not in used and step.name not in returned:
            raise ExpressionError(
                f"{step.name!r} is assigned but never used",
                where=f"{where}, line {step.line}",
                hint=f"use {step.name} on a later line{listed}, or remove the line",
            )
    size, depth = _tree_measure(exprs)
    if size > MAX_SUBSTITUTED_NODES:
        raise ExpressionError(
            f"the forward has more than {MAX_SUBSTITUTED_NODES} parts once its steps are substituted",
            where=where,
            hint="each use of a step copies it: use a step fewer times, or write the op in fewer steps",
        )
    _check_substituted_depth(depth, "the forward", where)
    return exprs, tuple(steps), output_text


def _check_substituted_depth(depth: int, what: str, where: str) -> None:
    """Steps nest in the steps that use them: the whole is bounded as one expression on one line is."""
    if depth > MAX_DEPTH:
        raise ExpressionError(
            f"{what} is nested more than {MAX_DEPTH} levels deep once its steps are substituted ({depth})",
            where=where,
            hint="each step nests in the steps that use it: write the op with fewer steps inside one another",
        )


def _step_name(
    statement: ast.stmt, values: dict[str, sympy.Basic], symbols: dict[str, sympy.Symbol], where: str
) -> str:
    """The name a line assigns: one new name that is no argument, function or constant."""
    hint = "each line but the last is name = expression, the last a bare expression or an assignment"
    if isinstance(statement, ast.Expr):
        raise ExpressionError("only the last line may be a bare expression", where=where, hint=hint)
    if isinstance(statement, ast.AugAssign):
        raise ExpressionError("+= and the like are not allowed: each step assigns a new name", where=where, hint=hint)
    if not isinstance(statement, ast.Assign):
        kind = type(statement).__name__.lower()
        raise ExpressionError(f"a Python {kind} statement is not allowed in a forward", where=where, hint=hint)
    if len(statement.targets) != 1 or not isinstance(statement.targets[0], ast.Name):
        raise ExpressionError("a step assigns one name (no tuples, no a = b = ...)", where=where, hint=hint)
    name = statement.targets[0].id
    if name in symbols:
        raise ExpressionError(
            f"{name!r} is an argument of the op; a step cannot assign it",
            where=where,
            hint=f"name the step differently, e.g. {name + '_1'!r}",
        )
    if name in KNOWN_NAMES and name not in structural.SPELLINGS:
        raise ExpressionError(
            f"{name!r} is the name of a function or constant in expressions",
            where=where,
            hint="name the step differently",
        )
    if name in values:
        raise ExpressionError(
            f"{name!r} is assigned twice", where=where, hint="give each step a name of its own, e.g. h1, h2"
        )
    return name


def _tree_measure(exprs: tuple[sympy.Basic, ...]) -> tuple[int, int]:
    """The number of parts of ``exprs`` written out as trees, and the depth of the deepest, each distinct
    subexpression measured once; without recursion, as the trees may be deeper than Python's stack."""
    sizes: dict[sympy.Basic, int] = {}
    depths: dict[sympy.Basic, int] = {}
    todo = [(e, False) for e in exprs]
    while todo:
        expr, ready = todo.pop()
        if expr in sizes:
            continue
        if ready:  # its arguments are measured
            sizes[expr] = 1 + sum(sizes[a] for a in expr.args)
            depths[expr] = 1 + max((depths[a] for a in expr.args), default=0)
        else:
            todo.append((expr, True))
            todo += [(a, False) for a in expr.args if a not in sizes]
    return sum(sizes[e] for e in exprs), max((depths[e] for e in exprs), default=0)


class _BuilderBase:
    """The walk over Python's syntax tree: each allowed node has a ``build_<node type>`` method (in the
    classes below), any other node is refused; errors quote the part of the text at fault. A value is checked
    to be a number or a condition where the context needs one."""

    def __init__(self, text: str, symbols: dict[str, sympy.Symbol], where: str) -> None:
        self.text = text
        self.symbols = symbols
        self.where = where

    def fail(self, node: ast.AST, message: str, hint: str | None = None) -> ExpressionError:
        segment = ast.get_source_segment(self.text, node) or ""
        at = f" in {segment!r}" if segment and segment != self.text and not segment.isidentifier() else ""
        return ExpressionError(message + at, where=self.where, hint=hint)

    def build(self, node: ast.AST, depth: int) -> sympy.Basic:
        if depth > MAX_DEPTH:
            raise self.fail(node, f"the expression is nested more than {MAX_DEPTH} levels deep")
        method = getattr(self, "build_" + type(node).__name__, None)
        if method is None:
            raise self.fail(
                node,
                f"{_describe(node)} is not allowed in an expression",
                hint="use numbers, argument names, + - * / **, comparisons and functions such as exp(x)",
            )
        try:
            return method(node, depth + 1)
        except (TypeError, ValueError, ArithmeticError) as exc:  # sympy refuses, e.g. log(-1) < x
            raise self.fail(
                node,
                f"this is not defined for real numbers ({exc})",
                hint="constants must be finite real numbers: log(-1), asin(2) or atan2(0, 0) are not",
            ) from None

    def _expr(self, value: sympy.Basic, node: ast.AST) -> sympy.Expr:
        """``value`` as a number: a condition (a comparison, a bool tensor) is 1 where it holds, else 0, in
        the math's dtype, as a Piecewise (derivative 0 across its step, printed as torch.where)."""
        if isinstance(value, sympy.logic.boolalg.Boolean) and not isinstance(value, sympy.Symbol):
            return sympy.Piecewise((1, value), (0, True))
        return value

    def _condition(self, value: sympy.Basic, node: ast.AST) -> sympy.Basic:
        # A bool scalar's symbol carries no assumptions; tensors and numeric scalars are real.
        if isinstance(value, sympy.Symbol) and value.is_real is None:
            return value
        if isinstance(value, sympy.logic.boolalg.Boolean) and not isinstance(value, sympy.Symbol):
            return value
        raise self.fail(
            node,
            "expected a condition such as x > 0",
            hint="conditions are comparisons, True/False, bool scalars, and &, |, ~ of those",
        )


class _AtomBuilder(_BuilderBase):
    """Literals and names: exact numbers (0.1 is 1/10), the declared arguments and steps, the constants."""

    def build_Constant(self, node: ast.Constant, depth: int) -> sympy.Basic:
        value = node.value
        if isinstance(value, bool):
            return sympy.true if value else sympy.false
        if isinstance(value, int):
            if len(str(value)) > MAX_INTEGER_DIGITS:
                raise self.fail(node, f"the number {value} is too large")
            return sympy.Integer(value)
        if isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                raise self.fail(node, "the number is not finite")
            # A decimal literal is the number it spells (0.1 is 1/10), so derivatives stay exact:
            # d/dx 0.5*x**2 is x, not 1.0*x.
            exact = sympy.Rational(repr(value))
            if max(abs(exact.p), exact.q) < 10**12:
                return exact
            return sympy.Float(repr(value))
        raise self.fail(node, f"{_describe(node)} is not allowed in an expression")

    def build_Name(self, node: ast.Name, depth: int) -> sympy.Basic:
        name = node.id
        if name in self.symbols:
            return self.symbols[name]
        if name in CONSTANTS:
            return CONSTANTS[name]
        if name in ("True", "False"):
            return sympy.true if name == "True" else sympy.false
        if name in FUNCTION_NAMES:
            call = structural.example(name) if name in structural.SPELLINGS else f"{name}(x)"
            raise self.fail(node, f"{name!r} is a function; call it, e.g. {call}")
        declared = ", ".join(self.symbols) or "none"
        raise self.fail(
            node,
            f"unknown name {name!r} (declared arguments: {declared})",
            hint=f"declare it with --tensor {name} or --scalar {name}=VALUE, or [tensors.{name}] in the spec",
        )


class _ArithmeticBuilder(_BuilderBase):
    """Operators: signs, ``+ - * / ** @``, a long sum or product built in one step, powers bounded in size."""

    def build_UnaryOp(self, node: ast.UnaryOp, depth: int) -> sympy.Basic:
        operand = self.build(node.operand, depth)
        if isinstance(node.op, ast.USub):
            return -self._expr(operand, node.operand)
        if isinstance(node.op, ast.UAdd):
            return self._expr(operand, node.operand)
        if isinstance(node.op, (ast.Not, ast.Invert)):
            return sympy.Not(self._condition(operand, node.operand))
        raise self.fail(node, f"the operator {type(node.op).__name__} is not allowed")

    def build_BinOp(self, node: ast.BinOp, depth: int) -> sympy.Basic:
        if isinstance(node.op, _CHAINS):
            return self._chain(node, depth)
        left = self.build(node.left, depth)
        right = self.build(node.right, depth)
        op = node.op
        if isinstance(op, (ast.BitAnd, ast.BitOr)):
            combine = sympy.And if isinstance(op, ast.BitAnd) else sympy.Or
            return combine(self._condition(left, node.left), self._condition(right, node.right))
        if isinstance(op, ast.BitXor):
            raise self.fail(node, "'^' is not a power here", hint="write powers with **, e.g. x**2")
        a, b = self._expr(left, node.left), self._expr(right, node.right)
        if isinstance(op, ast.MatMult):
            return structural.MatrixProduct(a, b)
        if isinstance(op, ast.Add):
            return a + b
        if isinstance(op, ast.Sub):
            return a - b
        if isinstance(op, ast.Mult):
            return a * b
        if isinstance(op, ast.Div):
            if b == 0:
                raise self.fail(node, "division by zero")
            return a / b
        if isinstance(op, ast.Pow):
            return self._power(node, a, b)
        hint = _floor_hint(node, self.text) if isinstance(op, (ast.Mod, ast.FloorDiv)) else None
        raise self.fail(
            node, f"the operator {_OPERATOR_NAMES.get(type(op), type(op).__name__)} is not allowed", hint=hint
        )

    def _chain(self, node: ast.BinOp, depth: int) -> sympy.Expr:
        """``a + b - c + ...`` or ``a * b / c * ...``, built in one step.

        Python parses such a chain as a left-nested tree; walking it as one level keeps a long sum from
        counting as deep nesting, and building one Add (or Mul) of all its terms keeps it linear in the
        number of terms (``a + b`` after ``a + b + ...`` would re-flatten the sum each time).
        """
        family = _CHAINS[0] if isinstance(node.op, _CHAINS[0]) else _CHAINS[1]
        spine: list[ast.BinOp] = []
        left: ast.AST = node
        while isinstance(left, ast.BinOp) and isinstance(left.op, family):
            spine.append(left)
            left = left.left
        terms = [self._expr(self.build(left, depth), left)]
        for link in reversed(spine):
            value = self._expr(self.build(link.right, depth), link.right)
            if isinstance(link.op, ast.Sub):
                value = -value
            elif isinstance(link.op, ast.Div):
                if value == 0:
                    raise self.fail(link, "division by zero")
                value = 1 / value
            terms.append(value)
        return sympy.Add(*terms) if family is _CHAINS[0] else _guarded_product(terms)

    def _power(self, node: ast.AST, base: sympy.Expr, exponent: sympy.Expr) -> sympy.Expr:
        if exponent.is_Number and abs(exponent) > MAX_EXPONENT:
            raise self.fail(node, f"the exponent {exponent} is too large (at most {MAX_EXPONENT})")
        if base.is_Number and exponent.is_Number:
            if base == 0 and exponent.is_negative:
                raise self.fail(node, "division by zero")
            if base != 0 and float(abs(exponent)) * abs(_log10(abs(base))) > MAX_POWER_DIGITS:
                raise self.fail(node, f"the power has more than {MAX_POWER_DIGITS} digits")
        return sympy.Pow(base, exponent)


class _ConditionBuilder(_BuilderBase):
    """Comparisons, ``and``/``or`` and ``Piecewise``'s (value, condition) pairs."""

    def build_Compare(self, node: ast.Compare, depth: int) -> sympy.Basic:
        operands = [self._expr(self.build(n, depth), n) for n in [node.left, *node.comparators]]
        parts = []
        for op, (a, b) in zip(node.ops, zip(operands, operands[1:])):
            relation = _COMPARISONS.get(type(op))
            if relation is None:
                raise self.fail(node, f"the comparison {type(op).__name__} is not allowed")
            parts.append(relation(a, b))
        return sympy.And(*parts) if len(parts) > 1 else parts[0]

    def build_BoolOp(self, node: ast.BoolOp, depth: int) -> sympy.Basic:
        values = [self._condition(self.build(v, depth), v) for v in node.values]
        return sympy.And(*values) if isinstance(node.op, ast.And) else sympy.Or(*values)

    def _piecewise(self, node: ast.Call, depth: int) -> sympy.Basic:
        pairs = []
        for arg in node.args:
            if not (isinstance(arg, ast.Tuple) and len(arg.elts) == 2):
                raise self.fail(arg, "Piecewise takes (value, condition) pairs, e.g. Piecewise((x, x > 0), (0, True))")
            value = self._expr(self.build(arg.elts[0], depth), arg.elts[0])
            condition = self._condition(self.build(arg.elts[1], depth), arg.elts[1])
            pairs.append((value, condition))
        if not pairs:
            raise self.fail(node, "Piecewise needs at least one (value, condition) pair")
        if pairs[-1][1] is not sympy.true:
            raise self.fail(
                node,
                "Piecewise needs a last pair whose condition is True, so every input has a value",
                hint="add an 'otherwise' pair such as (0, True)",
            )
        return _guarded_piecewise(pairs)


def _guarded_piecewise(pairs: list[tuple[sympy.Expr, sympy.Basic]]) -> sympy.Basic:
    """Piecewise of ``pairs``, each value's one_hot and gather reading an index that its branch knows is not k
    (``t != k`` holds there, or ``t == k`` failed before it) as :class:`structural.Indexing` says: valid
    wherever t is k, an ignore_index outside [0, C)."""
    guarded, failed = [], []
    for value, condition in pairs:
        known = _unequal(condition, sympy.Ne, sympy.And) | {f for c in failed for f in _unequal(c, sympy.Eq, sympy.Or)}
        guarded.append((_guarded(value, known), condition))
        failed.append(condition)
    return sympy.Piecewise(*guarded)


def _guarded_product(factors: list[sympy.Expr]) -> sympy.Expr:
    """The product of ``factors``, the others' one_hot and gather guarded (:func:`_guarded_piecewise`) by
    each mask among them, ``(t != k)`` as 0/1 (``Piecewise((1, t != k), (0, True))``): the product is 0
    wherever t is k, whatever the index read there, so ``(t != -100)*ce`` is torch's ignore_index too."""
    known = set()
    for factor in factors:
        if isinstance(factor, sympy.Piecewise) and len(factor.args) == 2 and factor.args[1].cond is sympy.true:
            (value, condition), otherwise = factor.args[0], factor.args[1].expr
            if (value, otherwise) == (1, 0):
                known |= _unequal(condition, sympy.Ne, sympy.And)
            elif (value, otherwise) == (0, 1):
                known |= _unequal(condition, sympy.Eq, sympy.Or)
    return sympy.Mul(*(_guarded(f, known) for f in factors)) if known else sympy.Mul(*factors)


def _guarded(value: sympy.Expr, known: set[tuple[sympy.Symbol, sympy.Expr]]) -> sympy.Expr:
    """``value`` with each one_hot and gather of an index holding t's values reading it as
    ``torch.where(t == k, 0, t)``, for each (t, k) of ``known`` (t is not k wherever value is used)."""
    for index, k in sorted(known, key=str):
        value = value.replace(
            lambda e, index=index: (
                isinstance(e, structural.Indexing)
                and e.ignore is None
                and _index_source(e.args[e.index_position]) == index
            ),
            lambda e, k=k: e.ignoring(k),
        )
    return value


def _unequal(condition: sympy.Basic, relation: type, junction: type) -> set[tuple[sympy.Symbol, sympy.Expr]]:
    """(t, k) for each ``relation(t, k)`` of ``condition``, itself or one of its ``junction`` (And for Ne:
    all hold; Or for Eq: none holds once it failed), t a symbol and k an integer or an int scalar."""
    parts = condition.args if isinstance(condition, junction) else (condition,)
    found = set()
    for part in parts:
        if isinstance(part, relation):
            for t, k in (part.args, part.args[::-1]):
                if isinstance(t, sympy.Symbol) and (k.is_Integer or (isinstance(k, sympy.Symbol) and k.is_integer)):
                    found.add((t, k))
    return found


def _index_source(index: sympy.Basic) -> sympy.Basic:
    """The indices whose values ``index`` holds: through reshapes and slices, which keep them."""
    while isinstance(index, (structural.Reshaping, structural.Sliced)):
        index = index.args[0]
    return index


def _unknown_function_hint(name: str) -> str:
    """Did you mean the nearest spelling (sigmod: sigmoid, sofmax: softmax), then every function there is."""
    supported = sorted(FUNCTION_NAMES, key=lambda n: (n.lower(), n))
    lowered = {n.lower(): n for n in supported}
    near = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.75)
    mean = f"did you mean {lowered[near[0]]!r}? " if near else ""
    return f"{mean}supported: " + ", ".join(supported)


class _CallBuilder(_BuilderBase):
    """Calls: the registry's functions (:mod:`.functions`) with their arities, and the structural
    nodes (reductions, softmax, transpose) with their literal dimensions."""

    def build_Call(self, node: ast.Call, depth: int) -> sympy.Basic:
        if not isinstance(node.func, ast.Name):
            raise self.fail(
                node,
                "only functions can be called, by their plain name, e.g. exp(x)",
                hint=_method_hint(node, self.text)
                or "expressions are math only: no attributes, methods, imports or Python builtins",
            )
        name = node.func.id
        if name in self.symbols:
            hint = f"rename the argument or step {name!r} to call {name}()" if name in KNOWN_NAMES else None
            raise self.fail(node, f"{name!r} is an argument or step, not a function", hint=hint)
        if name in structural.SPELLINGS:
            return self._structural(node, depth)
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise self.fail(node, "starred arguments are not allowed")
        if name == "Piecewise" and not node.keywords:
            return self._piecewise(node, depth)
        if name == "where" and name not in self.symbols:
            return self._where(node, depth)
        function = functions.by_spelling(name)
        if function is None and name != "Piecewise":
            raise self.fail(node, f"unknown function {name!r}", hint=_unknown_function_hint(name))
        if node.keywords and (function is None or not function.keywords):
            raise self.fail(node, f"{name}() takes no keyword arguments")
        if function.keywords:
            return self._with_keywords(node, function, depth)
        constructor, arities = function.build or function.sympy, function.arity
        if len(node.args) not in arities:
            expected = " or ".join(map(str, arities)) if len(arities) < 4 else f"{arities[0]} or more"
            raise self.fail(node, f"{name}() takes {expected} argument(s), got {len(node.args)}")
        args = [self._expr(self.build(a, depth), a) for a in node.args]
        if function.name == "Rational":
            if not all(a.is_Integer for a in args) or (len(args) == 2 and args[1] == 0):
                raise self.fail(node, "Rational() takes integers, e.g. Rational(1, 3), and a non-zero denominator")
        if function.name == "polygamma" and not (args[0].is_Integer and 0 <= args[0] <= 16):
            raise self.fail(node, "polygamma(n, x) needs a literal integer order n between 0 and 16")
        return constructor(*args)

    def _where(self, node: ast.Call, depth: int) -> sympy.Basic:
        """torch.where(c, a, b): a where the condition c holds, else b (a Piecewise of two branches)."""
        if len(node.args) != 3 or node.keywords:
            raise self.fail(
                node,
                f"where() takes 3 arguments, got {len(node.args) + len(node.keywords)}",
                hint="write where(condition, value, otherwise), e.g. where(x > 0, x, 0.1*x)",
            )
        condition = self._condition(self.build(node.args[0], depth), node.args[0])
        value, otherwise = (self._expr(self.build(a, depth), a) for a in node.args[1:])
        return _guarded_piecewise([(value, condition), (otherwise, sympy.true)])

    def _with_keywords(self, node: ast.Call, function: functions.Function, depth: int) -> sympy.Basic:
        """A function with keyword arguments after its operand (``elu(x, alpha=0.5)``, ``clamp(x, max=1)``),
        given by keyword or in order; each an expression, or left out for its default."""
        name, names = function.name, [k for k, _ in function.keywords]
        examples = {"min": 0, "max": 1}
        usage = f"write {name}(x, {', '.join(f'{k}={examples.get(k, d)}' for k, d in function.keywords)})"
        count = len(node.args)
        if (count not in function.arity) if not node.keywords else not 1 <= count <= max(function.arity):
            expected = " or ".join(map(str, function.arity))
            raise self.fail(node, f"{name}() takes {expected} argument(s), got {count}", hint=usage)
        given = dict(zip(names, node.args[1:]))
        for keyword in node.keywords:
            if keyword.arg not in names or keyword.arg in given:
                problem = "twice" if keyword.arg in given else "an unknown keyword"
                raise self.fail(node, f"{name}() got {keyword.arg!r}, {problem}", hint=usage)
            given[keyword.arg] = keyword.value
        values = {
            k: (self._expr(self.build(given[k], depth), given[k]) if k in given else default)
            for k, default in function.keywords
        }
        if function.name == "clamp" and values["min"] is None and values["max"] is None:
            raise self.fail(node, "clamp() needs min or max", hint=usage)
        operand = self._expr(self.build(node.args[0], depth), node.args[0])
        # a default as the exact number it is written as (0.01 is 1/100, not a float's nearest binary value)
        return function.build(
            operand,
            *(None if v is None else sympy.Rational(str(v)) if isinstance(v, float) else v for v in values.values()),
        )

    def _structural(self, node: ast.Call, depth: int) -> sympy.Basic:
        """A reduction, softmax, scan or transpose: its operand, then its parameters, which are literals."""
        name = node.func.id
        usage = f"write it as {structural.example(name)}"
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise self.fail(node, "starred arguments are not allowed")
        if name in ("cat", "stack"):
            return self._cat(node, depth)
        if name in structural.RESHAPES:
            return self._reshaping(node, depth)
        if name == "one_hot":
            return self._one_hot(node, depth, usage)
        if name == "gather":
            return self._gather(node, depth, usage)
        if name in structural.ARG_INDICES:
            return self._arg_index(node, depth, usage)
        if name == "transpose":
            if len(node.args) != 3 or node.keywords:
                raise self.fail(node, "transpose() takes an expression and two dimensions", hint=usage)
            d0, d1 = (self._integer(a, name, usage) for a in node.args[1:])
            return structural.Transposed(self._expr(self.build(node.args[0], depth), node.args[0]), d0, d1)
        if len(node.args) != 1:
            what = "the dimension" if name in structural.ALONG_ONE_DIM else "dim and keepdim"
            raise self.fail(
                node,
                f"{name}() takes one expression and {what} as keywords (got {len(node.args)} positional arguments)",
                hint=usage,
            )
        allowed = {"dim"} if name in structural.ALONG_ONE_DIM else {"dim", "keepdim"}
        keywords = {}
        for keyword in node.keywords:
            if keyword.arg not in allowed or keyword.arg in keywords:
                problem = "twice" if keyword.arg in keywords else "an unknown keyword"
                raise self.fail(node, f"{name}() got {keyword.arg!r}, {problem}", hint=usage)
            keywords[keyword.arg] = keyword.value
        operand = self._expr(self.build(node.args[0], depth), node.args[0])
        if name in structural.ALONG_ONE_DIM:
            if "dim" not in keywords:
                what = "normalizes" if name in structural.SOFTMAXES else "runs"
                raise self.fail(node, f"{name}() needs the dimension it {what} along", hint=usage)
            return structural.ALONG_ONE_DIM[name](operand, self._integer(keywords["dim"], name, usage))
        dims: tuple[int, ...] = ()
        if "dim" in keywords:
            value = keywords["dim"]
            if isinstance(value, ast.Tuple):
                if not value.elts:
                    raise self.fail(
                        node,
                        f"{name}() got dim=(), which names no dimension",
                        hint="omit dim to reduce over all of them",
                    )
                dims = tuple(self._integer(e, name, usage) for e in value.elts)
                if any(d < 0 for d in dims) and any(d >= 0 for d in dims):
                    raise self.fail(
                        node,
                        f"{name}() got dim={dims}, which counts some dimensions from the front and some "
                        "from the back: which dimensions those are depends on the input's rank",
                        hint="count them all from the front (dim=(0, 1)) or all from the back (dim=(-2, -1))",
                    )
            else:
                dims = (self._integer(value, name, usage),)
        keepdim = False
        if "keepdim" in keywords:
            flag = keywords["keepdim"]
            if not (isinstance(flag, ast.Constant) and isinstance(flag.value, bool)):
                raise self.fail(node, f"{name}() takes keepdim=True or keepdim=False", hint=usage)
            keepdim = flag.value
        reduction = structural.REDUCTIONS[name]
        return reduction(operand, sympy.Tuple(*map(sympy.Integer, dims)), sympy.true if keepdim else sympy.false)

    def _integer(self, node: ast.AST, name: str, usage: str) -> sympy.Integer:
        """A literal dimension: an int, or minus one."""
        sign = 1
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            sign, node = -1, node.operand
        if not (isinstance(node, ast.Constant) and type(node.value) is int):
            raise self.fail(node, f"{name}() takes dimensions as literal integers, such as -1", hint=usage)
        if abs(node.value) > 64:
            raise self.fail(node, f"the dimension {sign * node.value} is out of range")
        return sympy.Integer(sign * node.value)


class _IndexBuilder(_BuilderBase):
    """The calls of int64 indices: ``one_hot(t, num_classes=C)``, ``gather(e, dim=D, index=t)`` and
    ``argmax``/``argmin(e, dim=D)`` (stage 3 checks what an index is, :mod:`.program`)."""

    def _one_hot(self, node: ast.Call, depth: int, usage: str) -> sympy.Basic:
        """``one_hot(t, num_classes=C)``: t an int64 tensor argument (stage 3 checks its dtype), C a literal
        integer, by keyword or second in order."""
        given = list(node.args[1:2]) + [k.value for k in node.keywords if k.arg == "num_classes"]
        unknown = [k.arg for k in node.keywords if k.arg != "num_classes"]
        if len(node.args) not in (1, 2) or unknown or len(given) != 1:
            raise self.fail(node, "one_hot() takes an int64 tensor and num_classes", hint=usage)
        classes = given[0]
        if isinstance(classes, ast.Name) and classes.id in self.symbols and self.symbols[classes.id].is_integer:
            count = self.symbols[classes.id]  # an int scalar
        elif isinstance(classes, ast.Constant) and type(classes.value) is int and 0 < classes.value <= 2**20:
            count = sympy.Integer(classes.value)
        else:
            raise self.fail(
                node,
                "one_hot() takes num_classes as a literal positive integer, such as 10, or an int scalar",
                hint=usage,
            )
        operand = self._index(node.args[0], depth, "one_hot", usage)
        return structural.OneHot(operand, count)

    def _gather(self, node: ast.Call, depth: int, usage: str) -> sympy.Basic:
        """``gather(e, dim=D, index=t)`` (or in order, as torch.gather): t an int64 tensor argument (stage 3
        checks it), D a literal dimension."""
        names = ["input", "dim", "index"]
        given = self._arguments(node, names, "gather", usage)
        if len(node.args) > 3 or set(given) != set(names):
            raise self.fail(node, "gather() takes an expression, dim and index", hint=usage)
        operand = self._expr(self.build(given["input"], depth), given["input"])
        index = self._index(given["index"], depth, "gather", usage)
        return structural.Gather(operand, index, self._integer(given["dim"], "gather", usage))

    def _arg_index(self, node: ast.Call, depth: int, usage: str) -> sympy.Basic:
        """``argmax(e, dim=D)`` or ``argmin(e, dim=D, keepdim=K)`` (or in order, as torch's): D a literal
        dimension (required: torch's argmax without one flattens), K a literal bool."""
        name = node.func.id
        given = self._arguments(node, ["input", "dim", "keepdim"], name, usage)
        if len(node.args) > 3 or "input" not in given:
            raise self.fail(node, f"{name}() takes an expression, dim and keepdim", hint=usage)
        if "dim" not in given:
            raise self.fail(node, f"{name}() needs the dimension it searches along", hint=usage)
        flag = given.get("keepdim", ast.Constant(False))
        if not (isinstance(flag, ast.Constant) and isinstance(flag.value, bool)):
            raise self.fail(node, f"{name}() takes keepdim=True or keepdim=False", hint=usage)
        operand = self._expr(self.build(given["input"], depth), given["input"])
        dim = self._integer(given["dim"], name, usage)
        return structural.ARG_INDICES[name](operand, dim, sympy.true if flag.value else sympy.false)

    def _arguments(self, node: ast.Call, names: list[str], name: str, usage: str) -> dict[str, ast.AST]:
        """A call's arguments by name, given in order (as ``names``) or by keyword, each once."""
        given = dict(zip(names, node.args))
        for keyword in node.keywords:
            if keyword.arg not in names or keyword.arg in given:
                problem = "twice" if keyword.arg in given else "an unknown keyword"
                raise self.fail(node, f"{name}() got {keyword.arg!r}, {problem}", hint=usage)
            given[keyword.arg] = keyword.value
        return given

    def _index(self, node: ast.AST, depth: int, name: str, usage: str) -> sympy.Expr:
        """one_hot's or gather's indices: not a condition (a comparison, a bool tensor), whose 0/1 would index."""
        value = self.build(node, depth)
        if isinstance(value, sympy.logic.boolalg.Boolean) and not isinstance(value, sympy.Symbol):
            raise self.fail(
                node,
                f"{name}() takes int64 indices, and this is a condition (a comparison or a bool tensor)",
                hint=f'declare the indices as an int64 tensor: [tensors.t] dtype = "int64"; {usage}',
            )
        return self._expr(value, node)


_SLICE_USAGE = "slice with integer bounds and step 1, e.g. x[..., :4], x[..., 4:] or x[1:-1]"


class _ShapeBuilder(_BuilderBase):
    """Slices (``x[..., 2:]``, ``x[1:-1, :4]``: one node per sliced dimension) and ``cat((a, b), dim=D)``."""

    def build_Subscript(self, node: ast.Subscript, depth: int) -> sympy.Basic:
        items = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        ellipses = [i for i, item in enumerate(items) if _is_ellipsis(item)]
        if len(ellipses) > 1:
            raise self.fail(node, "an index has at most one '...'", hint=_SLICE_USAGE)
        for item in items:
            if not isinstance(item, ast.Slice) and not _is_ellipsis(item):
                raise self.fail(
                    node,
                    "only slices (start:stop) index a value: an integer, a tensor or None picks or adds elements",
                    hint=_SLICE_USAGE + "; to pick one element keep its dimension, x[..., 2:3]",
                )
        cut = ellipses[0] if ellipses else len(items)
        # before '...' (or without one) dims count from the front, after it from the back
        dims = list(range(cut)) + list(range(-(len(items) - cut - 1), 0))
        result = self._expr(self.build(node.value, depth), node.value)
        for dim, item in zip(dims, [i for i in items if not _is_ellipsis(i)]):
            if item.step is not None:
                raise self.fail(item, "a slice's step must be left out (steps are 1)", hint=_SLICE_USAGE)
            start, stop = (self._bound(b) for b in (item.lower, item.upper))
            if start == sympy.Tuple(0):
                start = sympy.Tuple()
            if start or stop:
                result = structural.Sliced(result, sympy.Integer(dim), start, stop)
        return result

    def _bound(self, node: ast.AST | None) -> sympy.Tuple:
        """A slice's bound: a Tuple of it, empty where it is left out."""
        if node is None:
            return sympy.Tuple()
        sign = 1
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            sign, node = -1, node.operand
        if not (isinstance(node, ast.Constant) and type(node.value) is int):
            raise self.fail(node, "a slice's bounds must be literal integers, such as 1 or -1", hint=_SLICE_USAGE)
        return sympy.Tuple(sign * node.value)

    def _cat(self, node: ast.Call, depth: int) -> sympy.Basic:
        """cat((a, b, ...), dim=D) or stack((a, b, ...), dim=D)."""
        name = node.func.id
        usage = f"write it as {structural.example(name)}"
        tensors = node.args[0] if len(node.args) == 1 else None
        keywords = {k.arg: k.value for k in node.keywords}
        if not isinstance(tensors, (ast.Tuple, ast.List)) or set(keywords) != {"dim"}:
            raise self.fail(node, f"{name}() takes a tuple of expressions and dim=D", hint=usage)
        if len(tensors.elts) < 2:
            raise self.fail(node, f"{name}() joins two or more expressions", hint=usage)
        operands = [self._expr(self.build(e, depth), e) for e in tensors.elts]
        joined = structural.Stacked if name == "stack" else structural.Concatenated
        return joined(*operands, self._integer(keywords["dim"], name, usage))

    def _reshaping(self, node: ast.Call, depth: int) -> sympy.Basic:
        """reshape(e, (d0, ...)), unsqueeze(e, d), squeeze(e, d), flatten(e, start_dim=a, end_dim=b): the
        parameters literal integers, by position or (but reshape's) by torch's keywords."""
        name = node.func.id
        usage = f"write it as {structural.example(name)}"
        names = {"reshape": ("shape",), "flatten": ("start_dim", "end_dim")}.get(name, ("dim",))
        given = dict(zip(names, node.args[1:]))
        for keyword in node.keywords:
            if keyword.arg not in names or keyword.arg in given or name == "reshape":
                raise self.fail(node, f"{name}() got {keyword.arg!r}, an unknown keyword or twice", hint=usage)
            given[keyword.arg] = keyword.value
        if not node.args or len(node.args) > 1 + len(names) or (name != "flatten" and len(given) != 1):
            raise self.fail(node, f"{name}() takes an expression and {', '.join(names)}", hint=usage)
        operand = self._expr(self.build(node.args[0], depth), node.args[0])
        if name == "flatten":
            start, end = (self._integer(given[k], name, usage) if k in given else d for k, d in zip(names, (0, -1)))
            return structural.Flattened(operand, sympy.Integer(start), sympy.Integer(end))
        if name != "reshape":
            return structural.RESHAPES[name](operand, self._integer(given["dim"], name, usage))
        sizes = given["shape"]
        if not isinstance(sizes, ast.Tuple) or not sizes.elts:
            raise self.fail(node, "reshape() takes the new shape as a tuple of integers", hint=usage)
        values = [self._integer(e, name, usage) for e in sizes.elts]
        if list(values).count(-1) > 1 or any(v < -1 or v == 0 for v in values):
            raise self.fail(node, "reshape() takes sizes of at least 1, and at most one -1", hint=usage)
        return structural.Reshaped(operand, sympy.Tuple(*values))


def _is_ellipsis(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is Ellipsis


class _RefusedBuilder(_BuilderBase):
    """Python forms the language refuses, each with what to write instead."""

    def build_Attribute(self, node: ast.Attribute, depth: int) -> sympy.Basic:
        raise self.fail(
            node,
            "attribute access ('.') is not allowed in an expression",
            hint=_method_hint(node, self.text)
            or "use numbers, argument names, + - * / **, comparisons and functions such as exp(x)",
        )

    def build_IfExp(self, node: ast.IfExp, depth: int) -> sympy.Basic:
        value, condition, other = (ast.get_source_segment(self.text, n) for n in (node.body, node.test, node.orelse))
        scalar = f" (--scalar {condition}=true)" if isinstance(node.test, ast.Name) else ""
        raise self.fail(
            node,
            "an 'if ... else' expression is not allowed",
            hint=f"write Piecewise(({value}, {condition}), ({other}, True)) for a comparison or a bool "
            f"scalar{scalar}, or where({condition}, {value}, {other}) for a bool tensor",
        )


class _Builder(
    _RefusedBuilder, _ShapeBuilder, _IndexBuilder, _CallBuilder, _ConditionBuilder, _ArithmeticBuilder, _AtomBuilder
):
    """Builds the sympy expression a Python expression's syntax tree spells, refusing anything else."""


def _log10(number: sympy.Number) -> float:
    """log10 of a positive number, also of a rational below or above float's range (1e-400)."""
    if number.is_Rational:
        return math.log10(number.p) - math.log10(number.q)  # exact for integers of any size
    return float(sympy.log(number, 10).evalf())


_OPERATOR_NAMES = {ast.FloorDiv: "'//'", ast.Mod: "'%'", ast.MatMult: "'@'", ast.LShift: "'<<'", ast.RShift: "'>>'"}


def _describe(node: ast.AST) -> str:
    return {
        "Attribute": "attribute access ('.')",
        "Subscript": "indexing ('[...]')",
        "Lambda": "a lambda",
        "Constant": "a string or bytes literal",
        "Tuple": "a tuple",
        "List": "a list",
        "Dict": "a dict",
        "Set": "a set",
        "NamedExpr": "an assignment ('=')",
        "ListComp": "a comprehension",
        "GeneratorExp": "a comprehension",
        "JoinedStr": "an f-string",
        "Await": "await",
        "Starred": "a starred expression",
    }.get(type(node).__name__, f"a {type(node).__name__} node")


def _operand(node: ast.AST, text: str) -> str:
    """The text of ``node``, in parentheses unless it is a name or a number."""
    segment = ast.get_source_segment(text, node) or "x"
    return segment if isinstance(node, (ast.Name, ast.Constant)) else f"({segment})"


def _floor_hint(node: ast.BinOp, text: str) -> str:
    """What to write for ``a % b`` or ``a // b``: the floor they stand for, whose gradient is zero."""
    a, b = _operand(node.left, text), _operand(node.right, text)
    written = f"{a} - {b}*floor({a}/{b}) for the remainder" if isinstance(node.op, ast.Mod) else f"floor({a}/{b})"
    return f"write {written}; floor's derivative is 0 almost everywhere (its steps are not differentiated)"


#: Modules whose functions a forward writes without the prefix (torch.exp(x) is exp(x)).
_LIBRARIES = frozenset({"torch", "F", "functional", "nn", "np", "numpy", "math", "sympy", "sp"})
_TRANSPOSES = frozenset({"T", "mT", "t", "transpose", "permute"})


def _method_hint(node: ast.Call | ast.Attribute, text: str) -> str | None:
    """The function form of ``x.T``, ``x.t()``, ``x.exp()``, ``x.sum(-1)`` or ``torch.exp(x)``, or None."""
    call = node if isinstance(node, ast.Call) else None
    attribute = node.func if isinstance(node, ast.Call) else node
    if not isinstance(attribute, ast.Attribute):
        return None
    name, receiver = attribute.attr, attribute.value
    args = [ast.get_source_segment(text, a) or "?" for a in (call.args if call else ())]
    keywords = [ast.get_source_segment(text, k) or "?" for k in (call.keywords if call else ())]
    prefix = ast.get_source_segment(text, receiver) or ""
    if prefix.split(".")[0] in _LIBRARIES:
        if call is None or name not in FUNCTION_NAMES:
            return None
        return f"write {name}({', '.join(args + keywords)}), without {prefix + '.'!r}"
    operand = ast.get_source_segment(text, receiver) or "x"
    if name in _TRANSPOSES:
        if name == "transpose" and len(args) == 2:
            return f"write transpose({operand}, {args[0]}, {args[1]})"
        return f"write transpose({operand}, -2, -1): it swaps the last two dims, as .T does for a matrix"
    if name == "pow" and len(args) == 1:
        return f"write {_operand(receiver, text)}**{args[0]}"
    if call is None or name not in FUNCTION_NAMES:
        return None
    if name in structural.SPELLINGS and args and name not in structural.RESHAPES:
        args[0] = f"dim={args[0]}"  # x.sum(-1) is sum(x, dim=-1)
    return f"write {name}({', '.join([operand, *args, *keywords])}): functions are called by name"
