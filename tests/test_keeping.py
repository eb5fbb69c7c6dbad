"""What the structured path keeps for backward against what the elementwise plan keeps (issue 33: one
planner saving no more than plan.make_plan), through scripts/keeping_inventory.py's measure; elementwise ops
forced through the structured path as scripts/one_pipeline_probe.py forces them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

try:
    from .catalogue import OPS
    from .realistic import FORMULAS, FOUND
except ImportError:  # tests/ run as a plain folder, not a package
    from catalogue import OPS
    from realistic import FORMULAS, FOUND

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
_spec = importlib.util.spec_from_file_location("keeping_inventory", SCRIPTS / "keeping_inventory.py")
inventory = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(inventory)

_BY_NAME = {op.name: op.mapping() for op in OPS}


def _kept(name: str, policy: str) -> tuple[dict, dict]:
    """What the elementwise plan and the structured path keep for the catalogue's op ``name``."""
    elementwise = inventory._plans(_BY_NAME[name], policy, forced=False)
    structured = inventory._plans(_BY_NAME[name], policy, forced=True)
    return (
        inventory.elementwise_kept(elementwise.plan, elementwise.program),
        inventory.structured_kept(structured.plan, structured.program),
    )


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
def test_a_condition_on_an_argument_is_a_mask_as_the_elementwise_plan_keeps_it(name: str, masks: list[str]):
    """Under the policy "memory" a condition on a tensor argument is saved as a bool mask, one byte an element,
    not the argument's four: the same bytes as plan.make_plan keeps."""
    elementwise, structured = _kept(name, "memory")
    assert sorted(n for n, (_, size) in structured.items() if size == inventory.BOOL) == masks
    assert inventory._bytes(structured) == inventory._bytes(elementwise)


@pytest.mark.parametrize("name", ["mse", "huber", "smooth_l1", "l1", "log_cosh"])
@pytest.mark.parametrize("policy", ["memory", "time"])
def test_a_combination_of_the_arguments_is_kept_instead_of_them(name: str, policy: str):
    """``input - target``, through which the output reads both (its own node, as a structural call's operand
    has): kept instead of both inputs, as the elementwise plan keeps it."""
    elementwise, structured = _kept(name, policy)
    assert list(structured) == ["tmp0"]
    assert inventory._bytes(structured) == inventory._bytes(elementwise)


@pytest.mark.parametrize(("name", "kept"), [("gaussian_nll", {"var", "tmp0"}), ("harmonic", {"k", "tmp0"})])
def test_a_combination_of_some_of_the_arguments_is_kept_instead_of_them(name: str, kept: set[str]):
    """gaussian_nll's ``input - target`` beside ``var``, which the output reads apart; harmonic's ``r - r0``
    beside ``k``: kept instead of the two arguments, as the elementwise plan keeps them."""
    ours, theirs = _kept(name, "memory") if name in _BY_NAME else _realistic_kept(name)
    assert set(theirs) == kept
    assert inventory._bytes(theirs) == inventory._bytes(ours)


def test_an_argument_saved_anyway_needs_no_mask():
    """softplus-like formulas read x beside their condition: x is kept, and no mask beside it."""
    _, structured = _kept("elu", "memory")
    assert list(structured) == ["x"]


def test_a_condition_on_math_of_what_backward_keeps_needs_no_mask():
    """hinge's ``1 - t*x > 0``, on a node of t and x, which backward keeps anyway: no mask beside them."""
    elementwise, structured = _realistic_kept("hinge")
    assert set(structured) == {"x", "t"}
    assert inventory._bytes(structured) == inventory._bytes(elementwise)


def _realistic_kept(name: str, policy: str = "memory") -> tuple[dict, dict]:
    mapping = next(m for m in [*FORMULAS, *FOUND] if m["name"] == name)
    elementwise = inventory._plans(mapping, policy, forced=False)
    structured = inventory._plans(mapping, policy, forced=True)
    return (
        inventory.elementwise_kept(elementwise.plan, elementwise.program),
        inventory.structured_kept(structured.plan, structured.program),
    )


def test_the_policy_time_keeps_the_argument_a_condition_reads():
    """Under "time" no mask is built in forward for a condition on an argument (a pass more over it)."""
    _, structured = _kept("relu", "time")
    assert list(structured) == ["x"]


@pytest.mark.parametrize(("name", "masks"), [("leaky_relu", 1), ("hardtanh", 2), ("softshrink", 1), ("pinball", 1)])
def test_under_the_policy_time_the_cost_model_chooses_masks_as_the_elementwise_plan(name: str, masks: int):
    """Under "time" a mask on an argument costs its pass in forward and spares backward the comparison (the
    ``where`` of leaky_relu's two slopes reads it either way): as many operations, fewer bytes, so the cost
    model (scaffold.cost) the two planners share chooses it, as plan.make_plan does."""
    elementwise, structured = _kept(name, "time") if name in _BY_NAME else _realistic_kept(name, "time")
    assert sum(size == inventory.BOOL for _, size in structured.values()) == masks
    assert inventory._bytes(structured) == inventory._bytes(elementwise)


@pytest.mark.parametrize("name", ["snake", "cauchy"])
def test_a_hoisted_part_of_what_backward_keeps_anyway_is_recomputed_under_memory(name: str):
    """snake's ``1/a`` beside ``a``, cauchy's ``c**-2`` beside ``c``: computed again in backward under
    "memory" (the cost model ranks its elements first), as the elementwise plan does; kept under "time"."""
    elementwise, structured = _realistic_kept(name, "memory")
    assert inventory._bytes(structured) == inventory._bytes(elementwise)
    mapping = next(m for m in [*FORMULAS, *FOUND] if m["name"] == name)
    hoisted = inventory._plans(mapping, "memory", forced=True).program.hoisted
    assert hoisted and not hoisted & set(structured)
    _, structured = _realistic_kept(name, "time")
    assert hoisted <= set(structured)


@pytest.mark.parametrize(("name", "kept"), [("lerp", {"weight"}), ("barron", {"c"}), ("found_19", {"w"})])
@pytest.mark.parametrize("policy", ["memory", "time"])
def test_the_combination_backward_reads_instead_of_the_arguments_is_a_node(name: str, kept: set[str], policy: str):
    """lerp's ``y - x`` (the output, ``x + weight*(y - x)``, is flat in the ``x`` outside it), barron's
    ``y_pred - y`` (not ``((y_pred - y)/c)**2``, whose derivative reads both), found_19's ``x - y`` (not
    ``w*(x - y)``): the part of the arguments through which backward reads the fewest elements is a node,
    kept beside the small parameter instead of both arguments, as the elementwise plan keeps it (under
    "time" barron keeps its hoisted ``c**-2`` besides: backward need not compute it again; found_19's
    elementwise plan keeps more there, an intermediate beside the arguments)."""
    elementwise, structured = _kept(name, policy) if name in _BY_NAME else _realistic_kept(name, policy)
    mapping = _BY_NAME.get(name) or next(m for m in [*FORMULAS, *FOUND] if m["name"] == name)
    hoisted = inventory._plans(mapping, policy, forced=True).program.hoisted
    structured = {n: k for n, k in structured.items() if n not in hoisted}
    assert kept < set(structured) and len(structured) == len(kept) + 1
    assert inventory._bytes(structured) <= inventory._bytes(elementwise)


def test_the_inventory_groups_what_the_structured_path_keeps_more_by_cause():
    ops = "relu,mse,logaddexp"
    command = [sys.executable, str(SCRIPTS / "keeping_inventory.py"), "--ops", ops, "--policies", "memory"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "policy memory: 3 elementwise ops compared; the structured path keeps more for 1"
    # logaddexp's x - y, of its stable form, kept by the elementwise plan; the program computes exp(x) + exp(y)
    logaddexp = "    logaddexp: [saved:20] (80 B) vs [x:20, y:20] (160 B)"
    assert lines[1:3] == ["  intermediate: 1", logaddexp]


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
    plans = inventory._plans(_BY_NAME["logaddexp"], "memory", forced=True)
    assert [v.name for v in plans.program.values if v.expr is not None] == ["out"]
    assert any("torch.logaddexp(x, y)" in line for line in plans.plan.forward), plans.plan.forward
