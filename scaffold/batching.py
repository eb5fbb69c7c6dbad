"""The custom-op target's vmap rule: for which inputs batched one call of the op computes the whole batch.

torch.func.vmap calls a custom op's batching rule with each argument's batched dimension (or None). The rule
moves each batched input's batch dimension first, with its own dimensions right-aligned under the others'
(``_batch_first``: size-1 dimensions between them, as broadcasting lines them up), and calls the op once.
That is the batch computed item by item where every step of the forward keeps the batch dimension first:

* an elementwise step broadcasts its operands, which line up where every batched operand has as many
  dimensions as the others (counting the batch's) and no operand that is not batched has more;
* a reduction, softmax, transpose, slice or cat (every operand batched) over dims counted from the end
  (``dim=-1``) leaves the leading batch dimension alone; one over dims counted from the front, or over
  every dimension, does not;
* ``a @ b`` of matrices broadcasts its leading dimensions as an elementwise step; of a vector, only where
  the vector is not batched, or is the left operand of a matrix (``v @ W``, rows against ``W``);
* and each output the op returns (hidden ones too: a mask, an intermediate backward reads) has the batch
  dimension, first and with no size-1 dimension after it: it reads a batched input, and has as many
  dimensions as the inputs brought in.

Which inputs are batched is known at call time only: :func:`batching` lists the cases (each tensor argument
batched or not) in which one call is right, at the example's ranks; the rule calls the op once in those, and
once per item (as PyTorch does without a rule) in the others, or where an input has another rank. An op of
elementwise steps whose every output reads every tensor argument is right in one call at any ranks.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from . import structural
from .program import ELEMENTWISE, SCALAR, TENSOR, Program, Value, broadcast

#: Beyond this many tensor arguments the cases are not listed (2**n of them): the op gets no rule.
MAX_LISTED = 8


@dataclass(frozen=True)
class Batching:
    """Where a custom op's vmap rule calls the op once for the whole batch."""

    elementwise: bool  # in every case and at any ranks: no check at call time
    ranks: tuple[int, ...]  # each tensor argument's rank in the example, in order
    one_call: tuple[tuple[bool, ...], ...]  # the cases (tensor arguments batched or not) one call computes


def batching(
    program: Program, returned: tuple[str, ...], exact: frozenset[str], masks: Mapping[str, tuple[str, ...]] = {}
) -> Batching | None:
    """The batching of a custom op returning the values ``returned`` (among them ``masks``: each a condition
    on the values it reads, not a value of the program), whose tensor arguments ``exact`` must have exactly
    their example's rank; None where no case is computed in one call."""
    tensors = [v for v in program.values if v.kind == TENSOR]
    names = {v.name for v in program.values}
    if len(tensors) > MAX_LISTED or not all(r in names for reads in masks.values() for r in reads):
        return None
    ranks = tuple(len(t.shape) for t in tensors)
    cases = [c for c in itertools.product((False, True), repeat=len(tensors)) if any(c)]
    one_call = tuple(
        case
        for case in cases
        if not any(b and t.name in exact for b, t in zip(case, tensors))
        and _one_call(program, returned, {t.name for b, t in zip(case, tensors) if b}, masks)
    )
    if not one_call:
        return None
    nodes = [v for v in program.values if v.kind not in (TENSOR, SCALAR) and v.name not in program.backward_only]
    reads = {
        n: set().union(*(_reads(program, r) for r in masks[n])) if n in masks else _reads(program, n) for n in returned
    }
    reads_all = all(r >= {t.name for t in tensors} for r in reads.values())
    elementwise = len(one_call) == len(cases) and reads_all and all(v.kind == ELEMENTWISE for v in nodes)
    return Batching(elementwise, ranks, one_call)


def _reads(program: Program, name: str) -> set[str]:
    """The tensor arguments the value ``name`` reads, through the steps before it."""
    value = program.value(name)
    if value.kind == TENSOR:
        return {name}
    return set().union(*(_reads(program, r) for r in value.reads))


def _one_call(
    program: Program, returned: tuple[str, ...], batched: set[str], masks: Mapping[str, tuple[str, ...]]
) -> bool:
    """Whether one call on the batch, each input in ``batched`` batch first and padded under the others'
    rank, computes every returned value batch first: each value's dimension count in that call (None: not
    batched), step by step."""
    rank = max(len(v.shape) for v in program.values if v.kind == TENSOR)
    dims: dict[str, int | None] = {}
    shapes = {v.name: v.shape for v in program.values}
    try:
        for v in program.values:
            if v.kind == TENSOR:
                dims[v.name] = rank + 1 if v.name in batched else None
            elif v.kind == SCALAR or v.name in program.backward_only:
                dims[v.name] = None
            else:
                dims[v.name] = _step(program, v, dims)
        for mask, reads in masks.items():
            dims[mask] = _broadcast(program, list(reads), dims)
            shapes[mask] = broadcast([shapes[r] for r in reads])
    except _ApartError:
        return False
    return all(dims[n] is not None and dims[n] == len(shapes[n]) + 1 for n in returned)


class _ApartError(Exception):
    """One call would not keep the batch dimension first at this step."""


def _step(program: Program, v: Value, dims: dict[str, int | None]) -> int | None:
    """The dimension count of the step ``v`` in one call on the batch (None: not batched), or _ApartError."""
    if v.kind == ELEMENTWISE:
        return _broadcast(program, list(v.reads), dims)
    call = v.expr
    operands = [str(o) for o in call.operand_exprs]
    if isinstance(call, structural.MatrixProduct):
        return _product(program, operands, dims)
    if isinstance(call, structural.OneHot):  # a dimension more, at the end
        return None if dims[operands[0]] is None else dims[operands[0]] + 1
    if isinstance(call, structural.Gather):  # the operand and the index batched alike, along a dim from the back
        counts = {dims[o] for o in operands}
        if len(counts) > 1 or call.dim >= 0 and counts != {None}:
            raise _ApartError
        return dims[operands[0]]
    if isinstance(call, structural.Concatenated):
        # cat and stack do not broadcast: every operand batched, along a dim counted from the end
        batched = {dims[o] for o in operands}
        if batched == {None}:
            return None
        if None in batched or len(batched) > 1 or call.dim >= 0:
            raise _ApartError
        return batched.pop() + (1 if isinstance(call, structural.Stacked) else 0)
    if isinstance(call, structural.Reshaping):
        return _reshaped(call, dims[operands[0]])
    # a softmax, a slice or an argmax names one dim
    named = call.dims if isinstance(call, (structural.Reduction, structural.Transposed)) else (call.dim,)
    if not named or any(d >= 0 for d in named):  # over every dimension, or counted from the front
        if dims[operands[0]] is not None:
            raise _ApartError
        return None
    removed = len(named) if isinstance(call, (structural.Reduction, structural.ArgIndex)) and not call.keepdim else 0
    return None if dims[operands[0]] is None else dims[operands[0]] - removed


def _reshaped(call: structural.Reshaping, count: int | None) -> int | None:
    """A reshape (its sizes count from the front), or a flatten of every dimension, moves the batch into
    the others; an unsqueeze, squeeze or flatten at dims counted from the end leaves it first."""
    if count is None:
        return None
    if isinstance(call, structural.Reshaped):
        raise _ApartError
    named = call.dims if isinstance(call, structural.Flattened) else (call.dim,)
    if any(d >= 0 for d in named):
        raise _ApartError
    if isinstance(call, structural.Flattened):
        return count + named[0] - named[1]
    return count + (-1 if isinstance(call, structural.Squeezed) else 1)


def _broadcast(program: Program, reads: list[str], dims: dict[str, int | None]) -> int | None:
    """Operands broadcast together: the batched ones' dimension counts agree, and no other has as many."""
    batched = {dims[r] for r in reads if dims[r] is not None}
    if not batched:
        return None
    if len(batched) > 1:
        raise _ApartError
    (count,) = batched
    if any(dims[r] is None and len(program.value(r).shape) >= count for r in reads):
        raise _ApartError
    return count


def _product(program: Program, operands: list[str], dims: dict[str, int | None]) -> int | None:
    """``a @ b``: matrices broadcast their leading dimensions; a batched vector only as ``v @ W``."""
    (a, b), (da, db) = operands, (dims[operands[0]], dims[operands[1]])
    ra, rb = len(program.value(a).shape), len(program.value(b).shape)
    if ra >= 2 and rb >= 2:
        return _broadcast(program, [a, b], dims)
    if rb == 1:  # a matrix or vector times a vector: the batch is the left operand's, the vector removed
        if db is not None:
            raise _ApartError
        return None if da is None else da - 1
    if da is None:  # a vector times a batched matrix (or more): the vector removed
        return None if db is None else db - 1
    if db is not None or rb != 2:
        raise _ApartError
    return da  # rows of a batched vector (with the batch first) times a matrix
