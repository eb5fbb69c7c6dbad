"""Custom gradients: ``[gradients]`` (``--gradient x="..."``) gives what backward returns for a tensor."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from scaffold import generate_op, load_spec, spec_from_flags, write_files
from scaffold.changes import Flags
from scaffold.errors import ExpressionError, ScaffoldWarning, SpecError
from scaffold.spec import spec_to_toml, spec_with_flags

from .conftest import GeneratedRun, background_run

# The examples: straight-through and clipped straight-through estimators, gradient reversal and
# gradient clipping in backward.
EXAMPLES = [
    ("ste", "sign(x)", [], "x=grad"),
    ("clipped_ste", "sign(x)", [], "x=grad*Heaviside(1 - Abs(x))"),
    ("reversal", "x", ["lam=1.0"], "x=-lam*grad"),
    ("clipping", "x", ["c=0.5"], "x=Max(Min(grad, c), -c)"),
]


def _examples(folder: Path) -> GeneratedRun:
    for name, forward, scalars, gradient in EXAMPLES:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ScaffoldWarning)  # no "zero gradient" or "unused scalar" warning
            files = generate_op(spec_from_flags(name, forward, ["x"], scalars, gradients=[gradient]))
        assert f"gradient of x = {gradient.partition('=')[2]}" in files[f"{name}.py"]
        write_files(files, folder)
    return GeneratedRun(folder, ("-rs",))


@background_run(_examples)
def test_the_examples_generate_ops_whose_tests_pass(background_results):
    result = background_results
    assert result.returncode == 0, result.stdout[-3000:]
    # Every tensor has a custom gradient: gradcheck has nothing to check, and says why.
    assert "every tensor has a custom gradient" in result.stdout


@pytest.mark.filterwarnings("ignore:.*torch.jit.script.*:DeprecationWarning")  # torch.func's own
def test_backward_returns_the_custom_gradient_and_forward_mode_the_derivative(tmp_path, monkeypatch):
    import torch

    monkeypatch.syspath_prepend(str(tmp_path))
    write_files(
        generate_op(spec_from_flags("clip_ste", "sign(x)", ["x"], gradients=["x=grad*Heaviside(1 - Abs(x))"])), tmp_path
    )
    from clip_ste import clip_ste

    x = torch.tensor([-2.0, -0.5, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
    clip_ste(x).backward(torch.full((4,), 3.0, dtype=torch.float64))
    assert x.grad.tolist() == [0.0, 3.0, 3.0, 0.0]
    _, tangent = torch.func.jvp(clip_ste, (x.detach(),), (torch.ones(4, dtype=torch.float64),))
    assert tangent.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_a_step_of_the_forward_may_appear_in_a_gradient():
    spec = spec_from_flags("op", "h = x*w\nsign(h)", ["x", "w"], gradients=["x=grad*w*Heaviside(1 - Abs(h))"])
    with pytest.warns(ScaffoldWarning, match="'w' is zero everywhere"):  # w has no custom gradient
        assert "gradient of x = grad*w*Heaviside(1 - Abs(h))" in generate_op(spec)["op.py"]


def test_gradients_round_trip_through_toml(tmp_path):
    spec = spec_from_flags("op", "x*sign(y)", ["x", "y"], gradients=["y=grad*x"])
    (tmp_path / "op.toml").write_text(spec_to_toml(spec))
    assert '[gradients]\ny = "grad*x"\n' in spec_to_toml(spec)
    assert load_spec(tmp_path / "op.toml", source="command-line flags") == spec


@pytest.mark.parametrize(
    ("gradients", "scalars", "error", "message"),
    [
        (["a=grad"], ["a=1.0"], SpecError, r"gradients\.a: 'a' is not a tensor argument"),
        (["z=grad"], [], SpecError, r"gradients\.z: 'z' is not a tensor argument"),
        (["x=grad", "x=2*grad"], [], SpecError, r"--gradient x=2\*grad: --gradient x is given twice"),
        (["x"], [], SpecError, r"--gradient x: a gradient needs an expression"),
        (["x= "], [], SpecError, r"gradients\.x: the gradient must be an expression"),
        (["x=grad*q"], [], ExpressionError, r"gradients\.x: unknown name 'q'"),
        (["x=grad > 0"], [], ExpressionError, r"gradients\.x: the gradient 'grad > 0' is a condition"),
    ],
)
def test_bad_gradients_are_refused(gradients, scalars, error, message):
    with pytest.raises(error, match=message):
        generate_op(spec_from_flags("op", "x*sign(x)", ["x"], scalars, gradients=gradients))


def test_an_argument_named_grad_cannot_take_custom_gradients():
    with pytest.raises(ExpressionError, match="'grad' names the upstream gradient"):
        generate_op(spec_from_flags("op", "x*grad", ["x", "grad"], gradients=["x=grad"]))


def test_update_flags_add_or_replace_a_custom_gradient():
    spec = spec_from_flags("op", "x*sign(y)", ["x", "y"], gradients=["y=grad*x"])
    assert spec_with_flags(spec, gradients=["y=grad"]).gradients == (("y", "grad"),)
    both = spec_with_flags(spec, gradients=["x=2*grad"])
    assert dict(both.gradients) == {"y": "grad*x", "x": "2*grad"}
    assert spec_with_flags(spec, tensors=["x=1,5"]).gradients == spec.gradients
    assert Flags(gradients=["x=grad"]) and not Flags()


# CompressAI's LowerBound: the gradient passes where x is above the bound, or where it pushes x up (grad < 0).
LOWER_BOUND = "x=Piecewise((grad, (x >= bound) | (grad < 0)), (0, True))"


def _lower_bound(name: str, **options):
    return spec_from_flags(name, "Max(x, bound)", ["x"], ["bound=0.1"], gradients=[LOWER_BOUND], **options)


def _lower_bounds(folder: Path) -> GeneratedRun:
    files = {}
    ops = [("lower_bound", {}), ("lower_bound_op", {"target": "custom_op"}), ("lower_bound_fused", {"fuse": True})]
    for name, options in [*ops, ("lower_bound_broken", {})]:
        files.update(generate_op(_lower_bound(name, **options)))
    module = files["lower_bound.py"]
    forward = module[module.index("    def forward") : module.index("    def backward")]  # and setup_context
    assert "grad_output" not in forward
    right = "torch.where((bound <= x) | (grad_output < 0), grad_output, 0)"
    assert right in module[module.index("def _backward") : module.index("class LowerBoundFunction")]
    broken = "torch.where(bound <= x, grad_output, 0)"
    files["lower_bound_broken.py"] = files["lower_bound_broken.py"].replace(right, broken)
    assert broken in files["lower_bound_broken.py"]
    write_files(files, folder)
    return GeneratedRun(folder, ("-k", "matches_reference or gradgradcheck or opcheck"))


@background_run(_lower_bounds)
def test_a_condition_that_reads_grad_is_computed_in_backward(background_results):
    """forward and setup_context run before any gradient exists: grad < 0 is computed in backward alone (in
    setup_context it was a NameError on every call); as a function, a custom op and fused, each passing its
    own tests, which fail for a backward that ignores grad < 0."""
    result = background_results
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and "test_lower_bound_broken.py::test_matches_reference" in failed[0], result.stdout[-3000:]


def test_a_custom_gradient_is_brought_to_its_arguments_shape_once():
    """scaled_sign's custom gradient of y is summed to y's shape in the statement that computes it, once."""
    spec = load_spec(Path(__file__).parent / "specs" / "scaled_sign.toml")
    source = generate_op(spec, time_limit=None)["scaled_sign.py"]
    assert source.count(".sum_to_size(y_shape)") == 1, source
