"""Ops with several outputs: ``outputs = [...]`` names the steps of the forward the op returns, as a tuple.

Backward receives one gradient per output; forward mode gives a tangent per output; the generated tests
check every output, and each used alone.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

from scaffold import compile_op, generate_op, load_spec, spec_from_flags, write_files
from scaffold.cli import main
from scaffold.errors import ExpressionError, SpecError
from scaffold.spec import spec_to_toml, spec_with_flags

from .conftest import SPECS, GeneratedRun, background_run, import_generated, make_spec

X = {"x": {"shape": [3, 4]}}


def test_textbook_split_and_transform_matches_its_hand_written_backward(tmp_path):
    module = import_generated(tmp_path, load_spec(SPECS / "split_and_transform.toml"))
    x = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
    pos, neg = module.split_and_transform(x)
    torch.testing.assert_close(pos, torch.relu(x))
    torch.testing.assert_close(neg, torch.relu(-x))
    (pos.sum() + neg.sum()).backward()
    torch.testing.assert_close(x.grad, torch.tensor([-1.0, -1.0, 0.0, 1.0, 1.0], dtype=torch.float64))
    # one output used alone: the other's gradient is zero
    (grad,) = torch.autograd.grad(module.split_and_transform(x)[1].sum(), x)
    torch.testing.assert_close(grad, torch.tensor([-1.0, -1.0, 0.0, 0.0, 0.0], dtype=torch.float64))


MULTI_OUTPUT_OPS = {
    # a shared step, a learnable parameter: the gate is both an output and what the gradients read
    "swish_gate": dict(
        forward="s = sigmoid(x*beta)\ny = x*s",
        tensors={"x": {"shape": [3, 4]}, "beta": {"shape": [4], "learnable": True}},
        outputs=["y", "s"],
    ),
    # three outputs of different formulas, broadcasting inputs, a scalar
    "polar_pair": dict(
        forward="r = sqrt(x**2 + y**2 + eps)\nout = x/r\nvalue = log(r)",
        tensors={"x": {"shape": [3, 4]}, "y": {"shape": [4]}},
        scalars={"eps": {"default": 1e-3}},
        outputs=["out", "value", "r"],
    ),
    # names the generated code uses itself: renamed inside it, the user's outside
    "awkward_names": dict(
        forward="output = exp(x)\ngrad_x = x*output\ntmp0 = sin(x)\nmask = x**2",
        tensors=X,
        outputs=["output", "grad_x", "tmp0", "mask"],
    ),
    # outputs of different shapes: one broadcasts, one does not
    "shapes": dict(
        forward="a = 2*w\nb = w*x", tensors={"x": {"shape": [3, 4]}, "w": {"shape": [4]}}, outputs=["b", "a"]
    ),
    # an output that is the input itself (returned as a view: x is also saved, for sq's gradient)
    "identity_and_square": dict(forward="same = x\nsq = x**2", tensors=X, outputs=["same", "sq"]),
    # custom gradients over both upstream gradients
    "sign_and_abs": dict(
        forward="s = sign(x)\na = Abs(x)",
        tensors=X,
        outputs=["s", "a"],
        gradients={"x": "grad_s*Heaviside(1 - Abs(x)) + grad_a*sign(x)"},
    ),
    # kinks in every output: masks saved, a case between numbers takes its dtype from a gradient that is given
    "kinks": dict(
        forward="lo = Max(x, y)\nhi = Min(x, y)\nmid = Piecewise((x, x > 0), (0.1*x, True))",
        tensors={"x": {"shape": [3, 4]}, "y": {"shape": [3, 4]}},
        outputs=["lo", "hi", "mid"],
    ),
    # five outputs, one of which overflows where the others do not (its gradient is None when unused)
    "five": dict(
        forward="a = 2*x\nb = x**2\nd = exp(x)\ne1 = log1p(x**2)\nf = sin(x)",
        tensors=X,
        outputs=["a", "b", "d", "e1", "f"],
    ),
    # one output, the input itself, with a custom gradient that reads it (a clipped straight-through identity)
    "clipped_identity": dict(forward="x", tensors=X, gradients={"x": "grad*Heaviside(1 - Abs(x))"}),
    # fused: forward and backward through torch.compile
    "softplus_pair": dict(
        forward="sp = log(1 + exp(x))\nsg = 1/(1 + exp(-x))", tensors=X, outputs=["sp", "sg"], fuse=True
    ),
}


def _multi_output_ops(folder: Path) -> GeneratedRun:
    for name, fields in MULTI_OUTPUT_OPS.items():
        fields = dict(fields)
        spec = make_spec(name, fields.pop("forward"), fields.pop("tensors"), fields.pop("scalars", None), **fields)
        write_files(generate_op(spec), folder)
    write_files(generate_op(load_spec(SPECS / "split_and_transform.toml")), folder)
    return GeneratedRun(folder, ("-rs",))


@background_run(_multi_output_ops)
def test_generated_tests_of_multi_output_ops_pass(background_results):
    result = background_results
    assert result.returncode == 0, result.stdout[-4000:]
    passed = int(re.search(r"(\d+) passed", result.stdout).group(1))
    assert passed >= 12 * (len(MULTI_OUTPUT_OPS) + 1), result.stdout[-2000:]  # custom gradients skip a few
    assert "partly_used" not in result.stdout  # never skipped


def test_each_output_has_its_gradient_and_tangent():
    spec = make_spec("pair", "ex = exp(x)\ns = ex*y", {"x": {}, "y": {}}, outputs=["ex", "s"])
    plan = compile_op(spec).plan
    assert plan.returns == ("ex", "s") and plan.upstream == ("grad_ex", "grad_s")
    assert plan.jvp_returns == ("ex_tangent", "s_tangent")
    tangents = {line.split(" = ")[0]: line for line in plan.jvp if line.split(" = ")[0] in plan.jvp_returns}
    assert "x_tangent" in tangents["ex_tangent"] and "y_tangent" not in tangents["ex_tangent"]  # ex reads x alone
    assert "x_tangent" in tangents["s_tangent"] and "y_tangent" in tangents["s_tangent"]
    assert "ex" in plan.saved  # d ex / d x = ex: read from the saved output
    assert "ex * grad_ex" in [line.text.split(" = ")[-1] for line in plan.backward]
    source = generate_op(spec)["pair.py"]
    assert "def backward(ctx, grad_ex, grad_s):" in source
    assert "-> tuple[torch.Tensor, torch.Tensor]:" in source


def test_names_of_the_generated_code_are_renamed_inside_it():
    fields = dict(MULTI_OUTPUT_OPS["awkward_names"])
    spec = make_spec("awkward", fields.pop("forward"), fields.pop("tensors"), **fields)
    plan = compile_op(spec).plan
    assert plan.visible == ("output_", "out_grad_x", "out_tmp0", "out_mask")
    assert len({*plan.visible, *plan.upstream, *plan.grads}) == 9


def test_names_of_the_generated_code_are_renamed_inside_it_on_the_structured_path(tmp_path):
    # grad_x's upstream gradient was grad_grad_x, the name the double backward gives x's gradient's own
    fields = dict(MULTI_OUTPUT_OPS["awkward_names"])
    spec = make_spec("awkward_structured", fields.pop("forward"), fields.pop("tensors"), **fields)
    module = import_generated(tmp_path, spec)
    source = (tmp_path / "awkward_structured.py").read_text()
    assert "def backward(ctx, grad_output_, grad_out_grad_x, grad_out_tmp0, grad_out_mask):" in source
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    assert torch.autograd.gradgradcheck(module.awkward_structured, (x,))


def test_a_step_named_as_a_gradient_keeps_its_own_name_apart_in_a_structured_op(tmp_path):
    # the softmax (read by its own rule) was saved as grad_w, which w's gradient then overwrote
    forward = "tmp0 = x*w\ngrad_w = softmax(tmp0, dim=-1)\ny = grad_w*tmp0"
    module = import_generated(
        tmp_path, make_spec("step_named_grad", forward, {"x": {"shape": [3, 4]}, "w": {"shape": [4]}})
    )
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64, generator=generator, requires_grad=True)
    assert torch.autograd.gradcheck(module.step_named_grad, (x, w))


def test_steps_named_as_the_generated_codes_own_names_are_renamed_in_a_structured_op(tmp_path):
    # a step named out took the name of the unnamed output's value: _backward(..., out, out), a SyntaxError
    forward = "out = sum(x, dim=-1, keepdim=True)\nmask = out*x\ntorch = exp(mask)\nsum(torch*x, dim=-1)"
    module = import_generated(tmp_path, make_spec("steps_named_out", forward, X))
    source = (tmp_path / "steps_named_out.py").read_text()
    assert "out_ = x.sum(dim=-1, keepdim=True)" in source
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    assert torch.autograd.gradcheck(module.steps_named_out, (x,))
    assert torch.autograd.gradgradcheck(module.steps_named_out, (x,))


def test_one_named_output_is_a_plain_tensor():
    named = generate_op(make_spec("sq", "h = x*x\ny = h + 1", X, outputs=["y"]))["sq.py"]
    assert "def backward(ctx, grad_output):" in named and "-> torch.Tensor:" in named


def test_outputs_from_flags_and_the_cli(tmp_path, capsys):
    spec = spec_from_flags("split", "pos = Max(x, 0); neg = Max(-x, 0)", ["x"], outputs=["pos", "neg"])
    assert spec.outputs == ("pos", "neg")
    code = main(["new", "op", "split", "--forward", "pos = Max(x, 0); neg = Max(-x, 0)", "--tensor", "x",
                 "--output", "pos", "--output", "neg", "--output-dir", str(tmp_path)])  # fmt: skip
    assert code == 0
    # the masks backward reads are hidden outputs after the named ones: their gradients (None) go to *_
    assert "def backward(ctx, grad_pos, grad_neg, *_):" in (tmp_path / "split.py").read_text()
    assert 'outputs=["pos", "neg"]' in (tmp_path / "test_split.py").read_text()


@pytest.mark.parametrize(
    ("forward", "outputs", "message"),
    [
        ("a = x*2\nb = x*3", ["a", "c"], "output 'c' is not assigned in the forward (its steps: a, b)"),
        ("a = x*2\na*3", ["a"], "the last line is a bare expression, but the op returns the steps outputs names"),
        ("x*2", ["a"], "outputs names 'a', but the forward is one expression and names nothing"),
        ("a = x*2\nb = 2*x", ["a", "b"], "outputs 'a', 'b' are the same value"),
        ("a = x*2\nb = a + 1", ["b"], None),  # a is used: fine
        ("a = 2*alpha\nb = x*a", ["a", "b"], "output 'a' does not depend on any tensor argument"),
    ],
)
def test_bad_outputs_get_a_clear_message(forward, outputs, message):
    spec = make_spec("op", forward, X, {"alpha": {"default": 1.0}}, outputs=outputs)
    if message is None:
        compile_op(spec)
        return
    with pytest.raises(ExpressionError, match=re.escape(message)):
        compile_op(spec)


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        ("y", "outputs must be a list of names, got 'y'"),
        (["y", "y"], "output 'y' is listed twice"),
        (["x"], "output 'x' is an argument of the op"),
        (["2y"], "output name"),
    ],
)
def test_bad_outputs_in_the_spec(outputs, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        make_spec("op", "y = x*2", X, outputs=outputs)


def test_unused_step_that_is_no_output_is_still_an_error():
    with pytest.raises(ExpressionError, match="'b' is assigned but never used"):
        compile_op(make_spec("op", "a = x*2\nb = x*3\nc = a + 1", X, outputs=["c", "a"]))


def test_an_unused_output_that_overflows_leaves_the_others_finite(tmp_path):
    # exp(1000) is inf: backward skips what the unused output's None gradient would pass on (zeros would make
    # exp(1000) * 0, nan in x's gradient), in the first and in the derived second derivative
    spec = make_spec("overflow_pair", "a = 2*x\nd = exp(x)", X, outputs=["a", "d"])
    module = import_generated(tmp_path, spec)
    x = torch.tensor([1.0, 1000.0], dtype=torch.float64, requires_grad=True)
    a, d = module.overflow_pair(x)
    assert torch.isinf(d[1])
    (grad,) = torch.autograd.grad(a.sum(), x, create_graph=True)  # through the double backward's Function
    torch.testing.assert_close(grad, torch.tensor([2.0, 2.0], dtype=torch.float64))
    (grad,) = torch.autograd.grad(module.overflow_pair(x)[0].sum(), x)
    torch.testing.assert_close(grad, torch.tensor([2.0, 2.0], dtype=torch.float64))
    small = torch.tensor([0.5, -1.0], dtype=torch.float64, requires_grad=True)
    for k in range(2):  # each output used alone: the other's gradient is None
        assert torch.autograd.gradgradcheck(lambda x, k=k: module.overflow_pair(x)[k], (small,))
    assert "torch.zeros(" not in (tmp_path / "overflow_pair.py").read_text()  # nothing filled in


def test_an_unused_output_of_a_structured_op_with_a_reduction_passes_nothing_on(tmp_path):
    # t feeds both outputs; exp(t) overflows where t is large, and only the row sums are used
    forward = "t = x*w\nm = sum(t, dim=-1)\nd = exp(t)"
    tensors = {"x": {"shape": [3, 4]}, "w": {"shape": [4], "learnable": True}}
    module = import_generated(tmp_path, make_spec("row_sum_and_exp", forward, tensors, outputs=["m", "d"]))
    x = torch.tensor([[1.0, 2.0, 3.0, 1000.0]], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([1.0, 0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    m, d = module.row_sum_and_exp(x, w)
    assert torch.isinf(d).any()
    grad_x, grad_w = torch.autograd.grad(m.sum(), (x, w))
    torch.testing.assert_close(grad_x, w.detach().expand(1, 4))
    torch.testing.assert_close(grad_w, x.detach()[0])
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64, generator=generator, requires_grad=True)
    for k in range(2):
        assert torch.autograd.gradcheck(lambda x, w, k=k: module.row_sum_and_exp(x, w)[k], (x, w))
        assert torch.autograd.gradgradcheck(lambda x, w, k=k: module.row_sum_and_exp(x, w)[k], (x, w))


def test_the_generated_partly_used_check_catches_an_unused_output_that_overflows(tmp_path):
    # five's d = exp(x) is inf at x = 100 in float32: the a-alone gradient was nan through the structured path
    fields = dict(MULTI_OUTPUT_OPS["five"])
    spec = make_spec("five_structured", fields.pop("forward"), fields.pop("tensors"), **fields)
    import_generated(tmp_path, spec)
    sys.path.insert(0, str(tmp_path))
    try:
        generated = importlib.import_module("test_five_structured")
    finally:
        sys.path.remove(str(tmp_path))
    generated.OP.check_partly_used_outputs("cpu")


def test_a_structured_op_with_a_flat_tensor_fills_an_unused_outputs_gradient_with_zeros(tmp_path):
    # y's zero gradient takes its dtype and device from an output's gradient: every one must be a tensor
    spec = make_spec("flat_pair", "a = 2*x\nd = exp(x)*sign(y)", {"x": X["x"], "y": X["x"]}, outputs=["a", "d"])
    with pytest.warns(UserWarning, match="zero everywhere"):
        module = import_generated(tmp_path, spec)
    assert "grad_d = torch.zeros(" in (tmp_path / "flat_pair.py").read_text()
    generator = torch.Generator().manual_seed(0)
    x, y = (torch.randn(3, 4, dtype=torch.float64, generator=generator, requires_grad=True) for _ in range(2))
    for k in range(2):
        assert torch.autograd.gradcheck(lambda x, y, k=k: module.flat_pair(x, y)[k], (x, y))


def test_update_flags_replace_the_outputs_and_a_project_op_round_trips(tmp_path, monkeypatch, capsys):
    spec = make_spec("split", "pos = Max(x, 0)\nneg = Max(-x, 0)", X, outputs=["pos", "neg"])
    assert spec_with_flags(spec, outputs=["neg", "pos"]).outputs == ("neg", "pos")
    assert spec_with_flags(spec, forward="y = 2*x").outputs == ("pos", "neg")  # kept unless given
    assert 'outputs = ["pos", "neg"]' in spec_to_toml(spec)
    assert main(["new", "project", str(tmp_path / "lib"), "--defaults"]) == 0
    monkeypatch.chdir(tmp_path / "lib")
    forward = "pos = Max(x, 0); neg = Max(-x, 0)"
    assert (
        main(["new", "op", "split", "--forward", forward, "--tensor", "x", "--output", "pos", "--output", "neg"]) == 0
    )
    assert main(["update", "op", "split", "--output", "neg", "--output", "pos"]) == 0
    assert 'outputs = ["neg", "pos"]' in (tmp_path / "lib" / "specs" / "split.toml").read_text()
    module = next((tmp_path / "lib" / "src").glob("*/ops/split.py")).read_text()
    assert "def backward(ctx, grad_neg, grad_pos, *_):" in module


def test_grad_in_a_custom_gradient_of_several_outputs_names_theirs():
    spec = make_spec("st", "s = sign(x)\na = Abs(x)", X, outputs=["s", "a"], gradients={"x": "grad"})
    with pytest.raises(ExpressionError, match="'grad' is the upstream gradient of an op with one output") as info:
        compile_op(spec)
    assert info.value.hint == "write the gradient over those, e.g. grad_s + grad_a"
