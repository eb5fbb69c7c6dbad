"""Stage 6a: a long statement's large parts are named first, as an engineer writes long math by hand.

Printed from sympy, a gradient is one expression, and the formatter spreads a long one over twenty lines
or more (a ``torch.where`` whose branches are a series and a product of transcendentals). This stage
rewrites the printed source of the op's module, function by function, before the in-place stage (6b):
a statement whose expression has more than :data:`LIMIT` operations keeps its shape and reads its
large parts from temporaries assigned just before it:

* the condition and the branches of a ``torch.where`` (``grad_x_mask``, ``grad_x_then``, ``grad_x_else``;
  both branches where one is large), the terms of a sum (``grad_x_term0``, ...), the factors of a product
  (``grad_x_factor0``, ...);
* a part is large when it has more than :data:`PART` operations; where only one part is, the statement is
  mostly that part, and it is split inside instead (``torch.where(...) * grad_output`` splits the where;
  a call's arguments, a shape beside a tensor, are split inside but never named);
* each temporary is split again by the same rule, and is named after the statement's target and its place
  in it, a name that no other name of the module has (a function's temporaries may have another's names).

Short statements stay as printed. The temporaries are tensors the expression computes anyway, in the same
order, each read once: nothing is computed twice, and stage 6b overwrites them in place as it would the
parts they were. Nothing is taken out of code that runs conditionally (``a if c else b``, ``and``/``or``,
a lambda or a comprehension). Like the shared temporaries (``tmp0``), a named part is a local: it is
freed when its function returns, not as soon as the statement has read it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping

#: A statement whose expression has more operations than this (binary and unary operations, calls,
#: comparisons; a negative number is none) is split. An operation is what the formatter may break a line
#: at, and stage 6b writes an in-place chain one operation per line: in the 262 ops of scaffold's own
#: catalogues, statements of 10-15 operations averaged 3-6 formatted lines, those of 16 or more 7-14 (up to
#: 22). A count, not a length: names and constants do not make math longer to read.
LIMIT = 15
#: A part worth a name of its own has more operations than this: ``2 * x * y`` or ``tmp3 ** -2`` reads
#: better in place than as a name.
PART = 4
#: The names of what a ``return`` and an expression statement (``terms.append(...)``) compute, where no
#: target names it.
RETURNED, PART_NAME = "result", "part"


def name_parts(source: str, returned: Mapping[str, str] | None = None) -> str:
    """``source`` (a module) with every long statement of its functions split into named temporaries.

    ``returned`` names what a function (by name, ``"jvp"``) returns, the base of its return statement's
    temporaries (default :data:`RETURNED`)."""
    tree = ast.parse(source)
    taken = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    taken |= {node.arg for node in ast.walk(tree) if isinstance(node, ast.arg)}
    taken |= {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.ClassDef)}
    lines = source.splitlines(keepends=True)
    replacements = []
    for function in (node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)):
        base, mine = (returned or {}).get(function.name, RETURNED), set(taken)  # a function's names are its own
        for statement in _simple_statements(function.body):
            text = _split_statement(statement, lines, base, mine)
            if text is not None:
                replacements.append((statement.lineno, statement.end_lineno, text))
    for start, end, text in sorted(replacements, reverse=True):
        lines[start - 1 : end] = [text]
    return "".join(lines)


def _simple_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of ``body`` that hold an expression, those in blocks inside it included (not those
    of nested functions: each is visited on its own)."""
    for statement in body:
        if isinstance(statement, ast.FunctionDef | ast.ClassDef):
            continue
        if isinstance(statement, ast.Assign | ast.Return | ast.Expr):
            yield statement
        for field in ("body", "orelse", "finalbody"):
            yield from _simple_statements(getattr(statement, field, []))


def _split_statement(statement: ast.stmt, lines: list[str], returned: str, taken: set[str]) -> str | None:
    """The text that replaces ``statement``: its temporaries, then the statement reading them; None where
    it stays as it is."""
    if statement.value is None or _size(statement.value) <= LIMIT:
        return None
    first, last = lines[statement.lineno - 1], lines[statement.end_lineno - 1]
    indent, comment = first[: statement.col_offset], last[statement.end_col_offset :]
    if indent.strip() or comment.strip() and not comment.lstrip().startswith("#"):
        return None  # shares its line with another statement: left as it is
    if isinstance(statement, ast.Assign):
        if len(statement.targets) != 1 or not isinstance(statement.targets[0], ast.Name):
            return None
        base = statement.targets[0].id
    else:
        base = returned if isinstance(statement, ast.Return) else _unique(PART_NAME, taken)
    steps: list[tuple[str, ast.expr]] = []
    value = _split(statement.value, base, steps, taken)
    if not steps:
        return None
    text = [f"{indent}{name} = {ast.unparse(expr)}\n" for name, expr in steps]
    if isinstance(value, ast.Tuple):  # as printed: return a, b (ast.unparse adds parentheses)
        code = ", ".join(ast.unparse(element) for element in value.elts)
    else:
        code = ast.unparse(value)
    keyword = {ast.Assign: f"{base} = ", ast.Return: "return "}.get(type(statement), "")
    return "".join(text) + f"{indent}{keyword}{code}{comment.rstrip()}\n"


def _split(node: ast.expr, base: str, steps: list[tuple[str, ast.expr]], taken: set[str]) -> ast.expr:
    """``node``, where it is long, reading its large parts from temporaries named after ``base``, whose
    assignments are appended to ``steps`` (each after those it reads)."""
    return node if _size(node) <= LIMIT else _named(node, base, steps, taken)


def _named(node: ast.expr, base: str, steps: list[tuple[str, ast.expr]], taken: set[str]) -> ast.expr:
    """``node`` reading its large parts from temporaries (split in turn where they are long), or, where it
    has one large part only, that part's large parts."""
    parts = _parts(node)
    large = [(label, part) for label, part in parts if _size(part) > PART]
    if large and any(label in _CASES for label, _ in parts):  # a where's branches are named together
        large = [(label, part) for label, part in parts if _size(part) > (0 if label in _CASES else PART)]
    if len(large) == 1:  # the statement is mostly this part: split it inside
        label, part = large[0]
        named = len(steps)
        inner = _named(part, base, steps, taken)
        if len(steps) > named or label not in _CASES:
            return _replaced(node, part, inner)
        # a branch of a where is a case of the math (a series near a point): named even where it is alone
    if any(label == "arg" for label, _ in large):
        return node  # a call's arguments (a shape beside a tensor) are not the math's parts
    for i, (label, part) in enumerate(large):
        name = _unique(f"{base}_{label}{i if label in _NUMBERED else ''}", taken)
        steps.append((name, _split(part, name, steps, taken)))
        node = _replaced(node, part, ast.Name(name, ast.Load()))
    return node


#: Labels of parts that come in a row (a sum's terms), numbered in order: term0, term1, ...
_NUMBERED = frozenset({"term", "factor"})
#: Labels of the branches of a torch.where.
_CASES = frozenset({"then", "else"})


def _parts(node: ast.expr) -> list[tuple[str, ast.expr]]:
    """The parts of ``node`` it computes independently, each with the label of its place: ``mask``,
    ``then`` and ``else`` of a torch.where, ``term`` of a sum, ``factor`` of a product, ``arg`` of another call (a
    method's tensor first), ``base`` and ``exponent`` of a power, an element of a tuple. Conditional code,
    comparisons and subscripts have none."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
        return [("term", part) for part in _chain(node, ast.Add | ast.Sub)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.Div):
        return [("factor", part) for part in _chain(node, ast.Mult | ast.Div)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return [("base", node.left), ("exponent", node.right)]
    if isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not):
        return [("operand", node.operand)]
    if isinstance(node, ast.Tuple):
        return [(f"{i}", element) for i, element in enumerate(node.elts)]
    if isinstance(node, ast.Call) and not any(isinstance(a, ast.Starred) for a in node.args):
        values = [*node.args, *(k.value for k in node.keywords if k.arg is not None)]
        if ast.unparse(node.func) == "torch.where" and len(node.args) == 3 and not node.keywords:
            return [("mask", node.args[0]), ("then", node.args[1]), ("else", node.args[2])]
        if isinstance(node.func, ast.Attribute):
            values.insert(0, node.func.value)
        return [("arg", value) for value in values]
    return []


def _chain(node: ast.expr, ops) -> list[ast.expr]:
    """The operands of a left-associated chain of ``ops`` (``a - b + c``: a, b, c)."""
    operands = []
    while isinstance(node, ast.BinOp) and isinstance(node.op, ops):
        operands.append(node.right)
        node = node.left
    return [node, *reversed(operands)]


def _replaced(node: ast.expr, old: ast.expr, new: ast.expr) -> ast.expr:
    """``node`` with the subexpression ``old`` (that very node) replaced by ``new``."""

    class Replace(ast.NodeTransformer):
        def visit(self, current):
            return new if current is old else self.generic_visit(current)

    return Replace().visit(node)


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name`` numbered (part1, grad_x_then_1) as no other name is; taken from now on."""
    numbered = (f"{name}{k}" if name[-1].isalpha() else f"{name}_{k}" for k in range(1, 10**6))
    unique = name if name not in taken else next(n for n in numbered if n not in taken)
    taken.add(unique)
    return unique


def _size(node: ast.expr) -> int:
    """How many operations ``node`` computes (see :data:`LIMIT`)."""
    return sum(
        isinstance(n, ast.BinOp | ast.Call | ast.Compare)
        or (isinstance(n, ast.UnaryOp) and not isinstance(n.operand, ast.Constant))
        for n in ast.walk(node)
    )
