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
except ImportError:  # tests/ run as a plain folder, not a package
    from catalogue import OPS

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


def test_an_argument_saved_anyway_needs_no_mask():
    """softplus-like formulas read x beside their condition: x is kept, and no mask beside it."""
    _, structured = _kept("elu", "memory")
    assert list(structured) == ["x"]


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
