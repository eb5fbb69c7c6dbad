"""Stage 3: the forward as a program, a small graph of named values, each with a shape.

The op's arguments are its first values (tensors with the spec's example shapes, scalars); each step of
the forward is a value computed from earlier ones by a node; the outputs are the values the op returns,
in order. Every node today is elementwise: a sympy formula over the values it reads, its shape theirs
broadcast together. Reductions and matrix products will be nodes of other kinds, each with its own
derivative rule (as PyTorch's derivatives.yaml gives one per op); the elementwise kind's rule is the
symbolic partial derivative (:mod:`.derivation`), taken of each output with the steps before it
substituted, so that sympy simplifies across steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from .errors import ExpressionError
from .expression import ParsedExpression
from .spec import OpSpec

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


@dataclass(frozen=True)
class Program:
    parsed: ParsedExpression
    values: tuple[Value, ...]  # arguments first, then the steps in order
    outputs: tuple[Output, ...]

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


def broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The shape ``shapes`` broadcast to (the spec checks that its example shapes broadcast)."""
    rank = max((len(s) for s in shapes), default=0)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    return tuple(max((s[d] for s in padded), default=1) for d in range(rank))


def build_program(parsed: ParsedExpression, spec: OpSpec) -> Program:
    """The program of ``parsed``: the spec's arguments, the forward's steps and its outputs, with shapes."""
    values: list[Value] = [Value(t.name, TENSOR, tuple(t.shape)) for t in spec.tensors]
    values += [Value(s.name, SCALAR, ()) for s in spec.scalars]
    shapes = {v.name: v.shape for v in values}
    for step in parsed.steps:
        node = Value(step.name, ELEMENTWISE, (), step.expr, step.line)
        shape = broadcast([shapes[n] for n in node.reads])
        values.append(Value(step.name, ELEMENTWISE, shape, step.expr, step.line))
        shapes[step.name] = shape
    outputs = []
    for name, expr in zip(parsed.output_names, parsed.exprs):
        shape = shapes[name] if name else broadcast([shapes[s.name] for s in expr.free_symbols if s.name in shapes])
        outputs.append(Output(name, expr, shape))
    if len({o.expr for o in outputs}) < len(outputs):
        first = next(o for o in outputs if sum(p.expr == o.expr for p in outputs) > 1)
        twins = [o.name for o in outputs if o.expr == first.expr]
        raise ExpressionError(
            f"outputs {', '.join(map(repr, twins))} are the same value",
            where=f"{spec.source}: outputs",
            hint="return each value once; the caller can use it twice",
        )
    return Program(parsed, tuple(values), tuple(outputs))
