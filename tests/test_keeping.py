"""What backward keeps, in bytes, for ops whose saving is a planning decision: masks, combinations of the
arguments, hoisted parts, under both policies. Each expectation is what the elementwise planner (plan.make_plan,
deleted with issue 33's one pipeline) kept for the same op, or less: the one planner keeps no more."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from scaffold import compile_op, spec_from_mapping
from scaffold.program import broadcast

try:
    from .catalogue import OPS
    from .realistic import FORMULAS, FOUND
except ImportError:  # tests/ run as a plain folder, not a package
    from catalogue import OPS
    from realistic import FORMULAS, FOUND

FLOAT, BOOL = 4, 1  # bytes an element: float32, a bool mask
_MAPPINGS = {m["name"]: m for m in [*FORMULAS, *FOUND]} | {op.name: op.mapping() for op in OPS}


def _compiled(name: str, policy: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile_op(spec_from_mapping({**_MAPPINGS[name], "policy": policy}, source=f"{name}.toml"))


def _kept(name: str, policy: str = "memory") -> dict[str, tuple[int, int]]:
    """What the op's backward keeps at its example shapes: name -> (elements, bytes an element); a mask has
    the shape of the values its condition (its forward statement) reads."""
    op = _compiled(name, policy)
    plan, values = op.plan, {v.name: v.shape for v in op.program.values}
    shapes = dict(plan.parameter_shapes)
    for line in plan.forward:
        target, _, condition = line.partition(" = ")
        if target in plan.masks:
            shapes[target] = broadcast([values[n] for n in re.findall(r"\b\w+\b", condition) if n in values])
    return {n: (math.prod(shapes[n]), BOOL if n in plan.masks else FLOAT) for n in plan.saved}


def _bytes(kept: dict[str, tuple[int, int]]) -> int:
    return sum(elements * size for elements, size in kept.values())


@pytest.mark.parametrize(
    ("name", "masks"),
    [
        ("relu", ["mask"]),  # x > 0
        ("leaky_relu", ["mask"]),
        ("hardtanh", ["mask", "mask1"]),  # the two bounds
        ("maximum", ["mask", "mask1"]),  # x > y and x == y: neither x nor y kept
        ("clamp_tensor", ["mask", "mask1", "mask2", "mask3"]),
    ],
)
def test_a_condition_on_an_argument_is_a_mask(name: str, masks: list[str]):
    """Under the policy "memory" a condition on a tensor argument is saved as a bool mask, one byte an element
    (the examples have 20), not the argument's four, and nothing else is kept."""
    kept = _kept(name)
    assert sorted(n for n, (_, size) in kept.items() if size == BOOL) == masks
    assert _bytes(kept) == 20 * len(masks)


@pytest.mark.parametrize("name", ["mse", "huber", "smooth_l1", "l1", "log_cosh"])
@pytest.mark.parametrize("policy", ["memory", "time"])
def test_a_combination_of_the_arguments_is_kept_instead_of_them(name: str, policy: str):
    """``input - target``, through which the output reads both (a node of its own): kept instead of both
    inputs, 80 bytes where they are 160."""
    kept = _kept(name, policy)
    assert list(kept) == ["tmp0"] and _bytes(kept) == 80


@pytest.mark.parametrize(
    ("name", "kept", "size"), [("gaussian_nll", {"var", "tmp0"}, 160), ("harmonic", {"k", "tmp0"}, 100)]
)
def test_a_combination_of_some_of_the_arguments_is_kept_instead_of_them(name: str, kept: set[str], size: int):
    """gaussian_nll's ``input - target`` beside ``var``, which the output reads apart; harmonic's ``r - r0``
    beside ``k``: kept instead of the two arguments."""
    ours = _kept(name)
    assert set(ours) == kept and _bytes(ours) == size


def test_an_argument_saved_anyway_needs_no_mask():
    """softplus-like formulas read x beside their condition: x is kept, and no mask beside it."""
    assert list(_kept("elu")) == ["x"]


def test_a_condition_on_math_of_what_backward_keeps_needs_no_mask():
    """hinge's ``1 - t*x > 0``, on a node of t and x, which backward keeps anyway: no mask beside them."""
    kept = _kept("hinge")
    assert set(kept) == {"x", "t"} and _bytes(kept) == 160


def test_the_policy_time_keeps_the_argument_a_condition_reads():
    """Under "time" no mask is built in forward for a condition on an argument (a pass more over it)."""
    assert list(_kept("relu", "time")) == ["x"]


@pytest.mark.parametrize(("name", "masks"), [("leaky_relu", 1), ("hardtanh", 2), ("softshrink", 1), ("pinball", 1)])
def test_under_the_policy_time_the_cost_model_chooses_masks(name: str, masks: int):
    """Under "time" a mask on an argument costs its pass in forward and spares backward the comparison (the
    ``where`` of leaky_relu's two slopes reads it either way): as many operations, fewer bytes, so the cost
    model (scaffold.cost) chooses it."""
    kept = _kept(name, "time")
    assert sum(size == BOOL for _, size in kept.values()) == masks and _bytes(kept) == 20 * masks


@pytest.mark.parametrize(("name", "size"), [("snake", 100), ("cauchy", 84)])
def test_a_hoisted_part_of_what_backward_keeps_anyway_is_recomputed_under_memory(name: str, size: int):
    """snake's ``1/a`` beside ``a``, cauchy's ``c**-2`` beside ``c``: computed again in backward under
    "memory" (the cost model ranks its elements first); kept under "time"."""
    kept = _kept(name, "memory")
    hoisted = _compiled(name, "memory").program.hoisted
    assert _bytes(kept) == size and hoisted and not hoisted & set(kept)
    assert hoisted <= set(_kept(name, "time"))


@pytest.mark.parametrize(("name", "kept"), [("lerp", {"weight"}), ("barron", {"c"}), ("found_19", {"w"})])
@pytest.mark.parametrize("policy", ["memory", "time"])
def test_the_combination_backward_reads_instead_of_the_arguments_is_a_node(name: str, kept: set[str], policy: str):
    """lerp's ``y - x`` (the output, ``x + weight*(y - x)``, is flat in the ``x`` outside it), barron's
    ``y_pred - y`` (not ``((y_pred - y)/c)**2``, whose derivative reads both), found_19's ``x - y`` (not
    ``w*(x - y)``): the part of the arguments through which backward reads the fewest elements is a node,
    kept beside the small parameter instead of both arguments (under "time" barron keeps its hoisted
    ``c**-2`` besides: backward need not compute it again)."""
    hoisted = _compiled(name, policy).program.hoisted
    ours = {n: k for n, k in _kept(name, policy).items() if n not in hoisted}
    assert kept < set(ours) and len(ours) == len(kept) + 1
    assert _bytes(ours) <= {"lerp": 84, "barron": 84, "found_19": 100}[name]


_NODES = """
import sys
sys.path[:0] = [sys.argv[1]]
from scaffold import compile_op, spec_from_mapping
mapping = {"name": "hinge_sum", "forward": "sum(Max(0, 1 - t*x))", "tensors": {"x": {}, "t": {}}}
print([str(v.expr) for v in compile_op(spec_from_mapping(mapping, source="hinge_sum.toml")).program.values])
"""


def test_the_combination_a_node_computes_is_the_same_in_every_process():
    """``-t*x`` and ``1 - t*x`` cost as much: which one becomes a node may not hang on a set's order, which
    varies with the process's hash seed (the generated file would differ from run to run)."""
    root = str(Path(__file__).resolve().parent.parent)
    runs = {
        subprocess.run(
            [sys.executable, "-c", _NODES, root], capture_output=True, text=True, env={"PYTHONHASHSEED": str(seed)}
        ).stdout
        for seed in range(6)
    }
    assert len(runs) == 1 and "t*x" in next(iter(runs)), runs


def test_a_combination_the_stable_form_rewrites_stays_inside_it():
    """``exp(x) + exp(y)`` reads both arguments, but under the log it is logaddexp's: made a node of its own, the
    log would take it as it is, and exp(100) overflows float32 (inf where the value is 100)."""
    op = _compiled("logaddexp", "memory")
    assert [v.name for v in op.program.values if v.expr is not None] == ["out"]
    assert any("torch.logaddexp(x, y)" in line for line in op.plan.forward), op.plan.forward
