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


def _realistic_kept(name: str) -> tuple[dict, dict]:
    mapping = next(m for m in [*FORMULAS, *FOUND] if m["name"] == name)
    elementwise = inventory._plans(mapping, "memory", forced=False)
    structured = inventory._plans(mapping, "memory", forced=True)
    return (
        inventory.elementwise_kept(elementwise.plan, elementwise.program),
        inventory.structured_kept(structured.plan, structured.program),
    )


def test_the_policy_time_keeps_the_argument_a_condition_reads():
    """Under "time" no mask is built in forward for a condition on an argument (a pass more over it)."""
    _, structured = _kept("relu", "time")
    assert list(structured) == ["x"]


def test_the_inventory_groups_what_the_structured_path_keeps_more_by_cause():
    ops = "relu,mse,lerp"
    command = [sys.executable, str(SCRIPTS / "keeping_inventory.py"), "--ops", ops, "--policies", "memory"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "policy memory: 3 elementwise ops compared; the structured path keeps more for 1"
    # lerp's x - y (the output, x + weight*(y - x), reads x beside it), kept by the elementwise plan
    lerp = "    lerp: [weight:1, saved:20] (84 B) vs [x:20, y:20, weight:1] (164 B)"
    assert lines[1:3] == ["  intermediate: 1", lerp]


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
