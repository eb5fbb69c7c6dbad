"""Integer class indices (issue 34): a tensor declared ``dtype = "int64"`` with an integer domain takes no
gradient and is drawn as integers by the generated tests; ``one_hot(t, num_classes=C)`` is a float node of
its own with no gradient, recomputed from t in backward; cross-entropy written with it equals torch's, with
and without label smoothing, at two batch ranks, saves no one-hot matrix and passes its generated tests.
``gather(e, dim=D, index=t)`` is torch.gather, its gradient scattered back (added where indices repeat):
the NLL of gathered log-probabilities equals torch's."""

from __future__ import annotations

import re

import pytest
import torch
from torch.nn import functional

from scaffold import generate_op
from scaffold.errors import ScaffoldError
from scaffold.testing import Input, OpTests
from scaffold.write import write_files

from .conftest import GeneratedRun, background_run, import_generated, make_spec

CE = "logsumexp(z, dim=-1) - sum(z*one_hot(t, num_classes=5), dim=-1)"
SMOOTHED = f"(1 - eps)*({CE}) + eps*(logsumexp(z, dim=-1) - mean(z, dim=-1))"
TARGETS = {"shape": [4], "dtype": "int64", "domain": [0, 4]}
SHAPES = [((4, 5), (4,)), ((2, 3, 5), (2, 3))]


def _ce_spec(name: str = "ce", forward: str = CE, **extra):
    return make_spec(name, forward, {"z": {"shape": [4, 5]}, "t": dict(TARGETS)}, **extra)


def _inputs(z_shape, t_shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    z = (torch.randn(z_shape, generator=generator, dtype=torch.float64) * 2).requires_grad_()
    t = torch.randint(0, 5, t_shape, generator=generator)
    return z, t


@pytest.mark.parametrize(("z_shape", "t_shape"), SHAPES)
def test_cross_entropy_with_class_indices_matches_torch(tmp_path, z_shape, t_shape):
    op = import_generated(tmp_path, _ce_spec()).ce
    z, t = _inputs(z_shape, t_shape)
    out = op(z, t)
    expected = functional.cross_entropy(z.reshape(-1, 5), t.reshape(-1), reduction="none").reshape(t_shape)
    torch.testing.assert_close(out, expected)
    upstream = torch.randn(t_shape, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(out, z, upstream)[0], torch.autograd.grad(expected, z, upstream)[0])
    assert t.dtype == torch.int64 and not t.requires_grad  # passed through unchanged
    # float32 in, float32 out: one_hot takes the logits' dtype
    z32 = z.detach().float().requires_grad_()
    out32 = op(z32, t)
    assert out32.dtype == torch.float32
    assert torch.autograd.grad(out32.sum(), z32)[0].dtype == torch.float32


@pytest.mark.parametrize(("z_shape", "t_shape"), SHAPES)
def test_label_smoothing_matches_torch(tmp_path, z_shape, t_shape):
    spec = make_spec(
        "smoothed_ce",
        SMOOTHED,
        {"z": {"shape": [4, 5]}, "t": dict(TARGETS)},
        {"eps": {"type": "float", "default": 0.1}},
    )
    op = import_generated(tmp_path, spec).smoothed_ce
    z, t = _inputs(z_shape, t_shape, seed=1)
    out = op(z, t, 0.1)
    flat = functional.cross_entropy(z.reshape(-1, 5), t.reshape(-1), reduction="none", label_smoothing=0.1)
    expected = flat.reshape(t_shape)
    torch.testing.assert_close(out, expected)
    upstream = torch.randn(t_shape, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(out, z, upstream)[0], torch.autograd.grad(expected, z, upstream)[0])


def test_the_number_of_classes_may_be_an_int_scalar(tmp_path):
    """num_classes=C, C an int scalar: its default is the example's, and a call may give another."""
    spec = make_spec(
        "ce_classes",
        CE.replace("num_classes=5", "num_classes=C"),
        {"z": {"shape": [4, 5]}, "t": dict(TARGETS)},
        {"C": {"type": "int", "default": 5}},
    )
    op = import_generated(tmp_path, spec).ce_classes
    generator = torch.Generator().manual_seed(3)
    z = torch.randn(2, 3, 7, generator=generator, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 7, (2, 3), generator=generator)
    out = op(z, t, 7)
    expected = functional.cross_entropy(z.reshape(-1, 7), t.reshape(-1), reduction="none").reshape(2, 3)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), z)[0], torch.autograd.grad(expected.sum(), z)[0])


FOCAL = "p = sigmoid(z)\ny = one_hot(t, num_classes=5)\nsum(-(y*(1 - p)**2*log(p) + (1 - y)*p**2*log(1 - p)), dim=-1)"


def _focal_spec():
    return make_spec("focal", FOCAL, {"z": {"shape": [4, 5]}, "t": dict(TARGETS)})


@pytest.mark.parametrize(("z_shape", "t_shape"), SHAPES)
def test_a_sigmoid_focal_loss_with_class_ids_matches_torch(tmp_path, z_shape, t_shape):
    """torchvision's sigmoid_focal_loss (gamma 2, no alpha) over one-hot targets, summed over the classes."""
    module = import_generated(tmp_path, _focal_spec())
    assert re.findall(r"ctx\.save_for_backward\((.*)\)", (tmp_path / "focal.py").read_text()) == ["z, t"]
    z, t = _inputs(z_shape, t_shape, seed=4)
    out = module.focal(z, t)
    y = functional.one_hot(t, 5).to(z.dtype)
    p = torch.sigmoid(z)
    p_t = p * y + (1 - p) * (1 - y)
    expected = (functional.binary_cross_entropy_with_logits(z, y, reduction="none") * (1 - p_t) ** 2).sum(-1)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), z)[0], torch.autograd.grad(expected.sum(), z)[0])


def test_backward_saves_the_logits_and_the_targets_never_a_one_hot_matrix(tmp_path):
    module = import_generated(tmp_path, _ce_spec())
    source = (tmp_path / "ce.py").read_text()
    [saved] = re.findall(r"ctx\.save_for_backward\((.*)\)", source)
    assert saved == "z, t, lse"  # the logits, the targets and the row logsumexp (4 numbers)
    assert "softmax" not in saved and "one_hot" not in saved
    # backward recomputes the one-hot rows from the indices
    backward = source[source.index("def _backward") :]
    assert "torch.nn.functional.one_hot(t, 5)" in backward
    z, t = _inputs((4, 5), (4,))
    out, *hidden = module.CeFunction.apply(z, t)
    assert [h.shape for h in hidden] == [torch.Size([4])]  # only the logsumexp is returned beside the loss
    assert not t.requires_grad


def test_backward_returns_none_for_the_indices(tmp_path):
    module = import_generated(tmp_path, _ce_spec())
    z, t = _inputs((4, 5), (4,))
    outs = module.CeFunction.apply(z, t)
    grads = outs[0].grad_fn.apply(*(torch.ones_like(o) for o in outs))
    assert grads[1] is None and grads[0].shape == z.shape


def test_the_indices_may_be_read_by_elementwise_math_too(tmp_path):
    """t in float math is promoted as torch promotes it; it still takes no gradient."""
    spec = make_spec("weighted", "sum(z*one_hot(t, num_classes=5), dim=-1)*(t + 1)", {"z": {}, "t": dict(TARGETS)})
    op = import_generated(tmp_path, spec).weighted
    z, t = _inputs((4, 5), (4,))
    out = op(z, t)
    expected = z.gather(-1, t.unsqueeze(-1)).squeeze(-1) * (t + 1)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), z)[0], torch.autograd.grad(expected.sum(), z)[0])


NLL = "-gather(log_softmax(z, dim=-1), dim=-1, index=t)"
NLL_SHAPES = [((4, 5), (4, 1)), ((2, 3, 5), (2, 3, 1))]


def _nll_spec():
    return make_spec("nll", NLL, {"z": {"shape": [4, 5]}, "t": {"shape": [4, 1], "dtype": "int64", "domain": [0, 4]}})


@pytest.mark.parametrize(("z_shape", "t_shape"), NLL_SHAPES)
def test_the_nll_of_gathered_log_probabilities_matches_torch(tmp_path, z_shape, t_shape):
    op = import_generated(tmp_path, _nll_spec()).nll
    z, t = _inputs(z_shape, t_shape, seed=2)
    out = op(z, t)
    flat = functional.nll_loss(torch.log_softmax(z, -1).reshape(-1, 5), t.reshape(-1), reduction="none")
    expected = flat.reshape(t_shape)
    torch.testing.assert_close(out, expected)
    upstream = torch.randn(t_shape, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(out, z, upstream)[0], torch.autograd.grad(expected, z, upstream)[0])


def test_gather_adds_the_gradients_of_repeated_indices_and_differentiates_again(tmp_path):
    spec = make_spec(
        "picked",
        "gather(z, dim=-1, index=t)**2",
        {"z": {"shape": [4, 5]}, "t": {"shape": [4, 3], "dtype": "int64", "domain": [0, 4]}},
    )
    op = import_generated(tmp_path, spec).picked
    z = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([[0, 0, 0], [1, 2, 1], [4, 3, 2], [4, 4, 0]])
    out = op(z, t)
    expected = torch.gather(z, -1, t) ** 2
    torch.testing.assert_close(out, expected)
    (grad,) = torch.autograd.grad(out.sum(), z, create_graph=True)
    (expected_grad,) = torch.autograd.grad(expected.sum(), z, create_graph=True)
    torch.testing.assert_close(grad, expected_grad)
    torch.testing.assert_close(torch.autograd.grad(grad.sum(), z)[0], torch.autograd.grad(expected_grad.sum(), z)[0])
    with torch.autograd.forward_ad.dual_level():
        tangent = torch.randn(4, 5, dtype=torch.float64)
        dual = torch.autograd.forward_ad.make_dual(z.detach(), tangent)
        jvp = torch.autograd.forward_ad.unpack_dual(op(dual, t)).tangent
    torch.testing.assert_close(jvp, 2 * torch.gather(z.detach(), -1, t) * torch.gather(tangent, -1, t))


def _generated(folder):
    runs = {"nll": GeneratedRun(folder / "nll"), "focal": GeneratedRun(folder / "focal")}
    write_files(generate_op(_nll_spec()), folder / "nll")
    write_files(generate_op(_focal_spec()), folder / "focal")
    for name, spec in [
        ("ce", _ce_spec()),
        ("ce_custom_op", _ce_spec("ce_custom_op", target="custom_op")),  # opcheck takes t as int64
        # two outputs: backward's one_hot takes a saved tensor's dtype (the loss's gradient may be None)
        (
            "ce_and_lse",
            _ce_spec(
                "ce_and_lse",
                "lse = logsumexp(z, dim=-1)\nloss = lse - sum(z*one_hot(t, num_classes=5), dim=-1)",
                outputs=["loss", "lse"],
            ),
        ),
        # a parameter per class: the Module's forward takes t alone, first
        (
            "class_weight",
            make_spec(
                "class_weight",
                "sum(one_hot(t, num_classes=5)*w, dim=-1)",
                {"w": {"shape": [5], "learnable": True, "init": "normal(0.0, 1.0)"}, "t": dict(TARGETS)},
            ),
        ),
        (
            "smoothed",
            make_spec(
                "smoothed",
                SMOOTHED,
                {"z": {"shape": [4, 5]}, "t": dict(TARGETS)},
                {"eps": {"type": "float", "default": 0.1}},
            ),
        ),
    ]:
        write_files(generate_op(spec), folder / name)
        runs[name] = GeneratedRun(folder / name)
    return runs


@background_run(_generated)
def test_cross_entropy_passes_its_generated_tests(background_results):
    for name, result in background_results.items():
        assert result.returncode == 0, (name, result.stdout[-3000:])


def test_the_generated_tests_draw_the_indices_as_integers_in_their_domain(tmp_path):
    module = import_generated(tmp_path, _ce_spec())
    test_file = (tmp_path / "test_ce.py").read_text()
    assert 'Input("t", (2,), low=0, high=4, dtype="int64"' in test_file
    tests = OpTests(
        function=module.CeFunction,
        op=module.ce,
        module=module.Ce,
        reference=lambda z, t: torch.logsumexp(z, dim=-1) - (z * functional.one_hot(t, 5)).sum(dim=-1),
        inputs=[Input("z", (3, 5)), Input("t", (3,), low=0, high=4, dtype="int64")],
        elementwise=False,
    )
    for seed in range(4):
        _, t = tests.make_inputs("cpu", seed=seed)
        assert torch.equal(t, t.round()) and 0 <= t.min() and t.max() <= 4
    assert set(tests.extreme_inputs()[1].tolist()) <= {0.0, 1.0, 2.0, 3.0, 4.0}
    tests.check_gradcheck("cpu")
    tests.check_matches_reference("cpu")


def test_gather_by_a_float_tensor_or_out_of_range_indices_is_refused():
    with pytest.raises(ScaffoldError, match="gather takes an int64 tensor argument of indices"):
        generate_op(make_spec("bad", "gather(z, dim=-1, index=x)", {"x": {"shape": [4, 1]}, "z": {}}))
    indices = {"shape": [4, 1], "dtype": "int64", "domain": [0, 5]}
    with pytest.raises(ScaffoldError, match=re.escape("has indices outside 0 to 4, which gather refuses")):
        generate_op(make_spec("bad", "gather(z, dim=-1, index=t)", {"t": indices, "z": {}}))
    with pytest.raises(ScaffoldError, match="the index must have as many dimensions as the operand"):
        generate_op(
            make_spec("bad", "gather(z, dim=-1, index=t)", {"t": {**indices, "shape": [4], "domain": [0, 4]}, "z": {}})
        )


def test_one_hot_of_a_float_tensor_is_refused():
    with pytest.raises(ScaffoldError, match="one_hot takes an int64 tensor argument of class indices"):
        generate_op(make_spec("bad", "sum(one_hot(x, num_classes=5)*z, dim=-1)", {"x": {"shape": [4]}, "z": {}}))


@pytest.mark.parametrize(
    ("forward", "message"),
    [
        ("sum(z*one_hot(t), dim=-1)", "one_hot() takes an int64 tensor and num_classes"),
        (
            "sum(z*one_hot(t, num_classes=a), dim=-1)",
            "num_classes as a literal positive integer, such as 10, or an int",
        ),
        ("sum(z*one_hot(t, num_classes=n - 5), dim=-1)", "num_classes as a literal positive integer"),
        ("sum(z*one_hot(t, num_classes=m), dim=-1)", "num_classes is 0 (its default), not a positive integer"),
        ("sum(z*one_hot(t, classes=5), dim=-1)", "one_hot() takes an int64 tensor and num_classes"),
        ("sum(z*one_hot(t, num_classes=6), dim=-1)", "do not broadcast together"),
    ],
)
def test_one_hot_calls_that_are_refused(forward, message):
    scalars = {
        "n": {"type": "int", "default": 5},
        "m": {"type": "int", "default": 0},
        "a": {"type": "float", "default": 5.0},
    }
    spec = make_spec("bad", forward, {"z": {}, "t": dict(TARGETS)}, scalars)
    with pytest.raises(ScaffoldError, match=re.escape(message)):
        generate_op(spec)


def test_an_int64_tensor_survives_the_spec_round_trip():
    import tomllib

    from scaffold.spec import spec_from_mapping, spec_to_toml

    spec = _ce_spec()
    again = spec_from_mapping(tomllib.loads(spec_to_toml(spec)), source="ce.toml")
    assert again.tensors == spec.tensors
    assert again.tensors[1].dtype == "int64" and again.tensors[1].domain == (0, 4)
    assert make_spec("d", CE, {"z": {}, "t": {"shape": [4], "dtype": "int64"}}).tensors[1].domain == (0, 3)


def test_an_index_computed_by_arithmetic_on_an_int64_tensor_is_refused_saying_what_is_allowed(tmp_path):
    """(unsqueeze(t, -1) itself is an index: tests/test_argindex.py.)"""
    from scaffold.api import compile_op

    spec = make_spec(
        "nll",
        "-gather(log_softmax(z, dim=-1), dim=-1, index=unsqueeze(t + 1, -1))",
        {"z": {"shape": [4, 5]}, "t": {"shape": [4], "dtype": "int64", "domain": [0, 3]}},
    )
    with pytest.raises(
        ScaffoldError, match=r"unsqueeze\(t \+ 1, -1\) is not one\n  hint: int64 indices are an int64 tensor argument"
    ):
        compile_op(spec)
